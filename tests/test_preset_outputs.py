"""The shipped preset weights give the outputs recorded when they were made.

`tests/data/preset_outputs.npz` holds, per preset, fixed inputs and the
model's outputs computed with the code that trained the weights (before the
layers' projections became keras `EinsumDense`/`Dense`/`Conv` sublayers; the
files were then re-saved under the new variable paths). Any later change of
weight layout must convert the files so this still holds.
"""

import os

import keras
import numpy as np
import pytest

from keras_attention.applications import CBAMResNet
from keras_attention.applications import DETR
from keras_attention.applications import VisionTransformer

DATA = os.path.join(os.path.dirname(__file__), "data", "preset_outputs.npz")


@pytest.mark.parametrize(
    "cls, name",
    [
        (VisionTransformer, "vit_digits"),
        (CBAMResNet, "cbam_resnet_digits"),
        (DETR, "detr_digits"),
    ],
)
def test_preset_weights_reproduce_their_recorded_outputs(cls, name):
    recorded = np.load(DATA)
    model = cls.from_preset(name)
    outputs = keras.tree.flatten(model(recorded[f"{name}/x"]))
    expected = [recorded[f"{name}/y{i}"] for i in range(len(outputs))]
    assert f"{name}/y{len(outputs)}" not in recorded
    for got, want in zip(outputs, expected):
        # Recorded on TensorFlow; other backends round differently (JAX:
        # 1.1e-5 on a DETR box logit of 7.06; machine kinds differ too).
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got), want, rtol=3e-5, atol=3e-5
        )


@pytest.mark.parametrize(
    "name", ["detr_digits", "seq2seq_dates", "transformer_dates"]
)
def test_preset_without_weights_is_built_like_the_one_with(name):
    """The subclassed presets (built on first call) come built either way:
    `summary()`, `count_params()` and fine-tuning need no call first."""
    from keras_attention.applications import presets
    import keras_attention.applications as applications

    cls = getattr(applications, presets()[name].class_name)
    fresh = cls.from_preset(name, load_weights=False)
    assert fresh.built
    assert fresh.count_params() == cls.from_preset(name).count_params()
