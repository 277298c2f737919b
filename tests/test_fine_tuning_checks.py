"""What a user meets fine-tuning an application: a backbone from a preset at
another configuration, a `tf.data` pipeline of dicts or of unknown shapes,
a LoRA fine-tune saved and loaded again."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention.applications import presets
from keras_attention.applications.cbam_resnet import CBAMResNet
from keras_attention.applications.cbam_resnet import CBAMResNetBackbone
from keras_attention.applications.vision_transformer import VisionTransformer

TINY_VIT = dict(
    image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=2,
    num_heads=2, mlp_dim=8, num_channels=1,
)


def test_backbone_from_preset_takes_the_classifier_overrides():
    # `VisionTransformerBackbone.from_preset(name, image_size=32)` was a
    # TypeError: the backbone's `from_preset` took no overrides.
    spec = presets.get_preset("cbam_resnet_digits")
    backbone = CBAMResNetBackbone.from_preset(
        "cbam_resnet_digits",
        load_weights=os.path.isfile(spec.weights_path),
        image_size=16,
    )
    assert isinstance(backbone, CBAMResNetBackbone)
    assert backbone.input_shape == (None, 16, 16, 1)


def test_a_dict_of_the_input_name_is_taken_as_keras_takes_it():
    # keras matches `{"images": x}` to a one-input functional model; the
    # input check read `.shape` of the dict (AttributeError in `call`).
    model = CBAMResNet(image_size=8, num_channels=1, num_classes=3, filters=(4,))
    model.compile(jit_compile=False)
    x = np.random.default_rng(0).random((4, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(
        model({"images": x}), model(x), atol=1e-6
    )
    data = tf.data.Dataset.from_tensor_slices(
        ({"images": x}, np.array([0, 1, 2, 0]))
    ).batch(2)
    model.fit(data, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"shape \(None, 8, 8, 1\)"):
        model({"images": x[:, :4]})


def test_a_dataset_of_unknown_rank_names_the_fix():
    # After tf.numpy_function the images have no rank: the input check
    # failed with "Cannot iterate over a shape with unknown rank".
    model = CBAMResNet(image_size=8, num_channels=1, num_classes=3, filters=(4,))
    model.compile()
    data = tf.data.Dataset.from_tensor_slices(
        (np.zeros((4, 8, 8, 1), "float32"), np.zeros(4, "int32"))
    ).batch(2)
    data = data.map(
        lambda x, y: (tf.numpy_function(lambda a: a, [x], tf.float32), y)
    )
    with pytest.raises(ValueError, match="tf.ensure_shape"):
        model.fit(data, epochs=1, verbose=0)


def test_a_model_built_under_a_global_policy_loads_with_it(tmp_path):
    # Built under a global `mixed_bfloat16` without `dtype=`, it loaded as
    # float32 in a process without that policy (other logits), where
    # keras's own layers keep the policy they were built under.
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = VisionTransformer.from_preset("vit_digits")
    finally:
        keras.config.set_dtype_policy(previous)
    images = np.random.default_rng(0).random((2, 16, 16, 1)).astype("float32")
    path = tmp_path / "vit.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.dtype_policy.name == "mixed_bfloat16"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(images)),
        keras.ops.convert_to_numpy(model(images)),
    )
