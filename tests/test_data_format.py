"""`data_format` of the feature-map layers, and Keras's global
`image_data_format`.

Under `keras.config.set_image_data_format("channels_first")` the image
applications failed to build, call or load (their convolutions took the
global setting while their maps are channels-last), CBAM's and the
non-local block's layers pooled and attended over the wrong axis without
a word, and Grad-CAM read a channels-first map `(B, C, h, w)` as `(B, h,
w, C)`. The layers now take `data_format` as Keras's `Conv2D` does
(`None`: the global setting), the applications pin channels-last, and
Grad-CAM refuses a channels-first map by name.
"""

import contextlib

import keras
import numpy as np
import pytest

from keras_attention.layers import CBAM
from keras_attention.layers import ChannelAttention
from keras_attention.layers import NonLocalBlock
from keras_attention.layers import SpatialAttention


@contextlib.contextmanager
def channels_first():
    keras.config.set_image_data_format("channels_first")
    try:
        yield
    finally:
        keras.config.set_image_data_format("channels_last")


def numpy(x):
    return keras.ops.convert_to_numpy(x)


CASES = [
    (ChannelAttention, dict(reduction=4)),
    (SpatialAttention, dict()),
    (CBAM, dict(reduction=4)),
    (NonLocalBlock, dict(zero_init_residual=False, sub_sample=True)),
]


@pytest.mark.parametrize("cls,kwargs", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_channels_first_equals_channels_last_on_moved_maps(cls, kwargs, tmp_path):
    x = np.random.default_rng(0).random((2, 8, 6, 16)).astype("float32")
    last = cls(**kwargs, data_format="channels_last")
    out_last, scores_last = last(x, return_attention_scores=True)
    with channels_first():  # `None` takes the global setting
        first = cls(**kwargs)
    assert first.data_format == "channels_first"
    first.build((None, 16, 8, 6))
    first.set_weights(last.get_weights())
    out_first, scores_first = first(np.moveaxis(x, -1, 1), return_attention_scores=True)
    np.testing.assert_allclose(np.moveaxis(numpy(out_first), 1, -1), numpy(out_last), atol=1e-6)
    # A spatial map comes back in the layer's format; other scores as they are.
    pairs = zip(*(s if isinstance(s, tuple) else (s,) for s in (scores_first, scores_last)))
    for a, b in pairs:
        a = numpy(a)
        if cls in (SpatialAttention, CBAM) and a.ndim == 4:
            a = np.moveaxis(a, 1, -1)
        np.testing.assert_allclose(a, numpy(b), atol=1e-6)
    # The format is in the config: the file loads the same in any process.
    model = keras.Sequential([keras.Input((16, 8, 6)), first])
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(
        numpy(loaded(np.moveaxis(x, -1, 1))), numpy(out_first), atol=1e-6
    )


def test_a_bad_data_format_is_named():
    with pytest.raises(ValueError, match="argument `data_format`.*nchw"):
        CBAM(data_format="nchw")


def test_applications_under_a_channels_first_setting(tmp_path):
    from keras_attention.applications import CBAMResNet
    from keras_attention.applications import VisionTransformer
    from keras_attention.applications.detection import DETR

    images = np.random.default_rng(1).random((2, 8, 8, 1)).astype("float32")
    keras.utils.set_random_seed(0)
    models = {
        "vit": VisionTransformer(image_size=8, patch_size=2, num_classes=3,
                                 hidden_dim=8, depth=1, num_heads=2, mlp_dim=8,
                                 num_channels=1),
        "cbam": CBAMResNet(image_size=8, num_channels=1, num_classes=3,
                           filters=(4, 8), blocks_per_stage=1, stem_filters=4),
    }
    # A ViT whose blocks attend over the patch grid: a channels-first
    # default read its (h, w, C) grid as (C, h, w).
    for attention in ("spatial", "non_local", "channel"):
        models[f"vit_{attention}"] = VisionTransformer(
            image_size=8, patch_size=2, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1, attention=attention,
            attention_kwargs={"reduction": 2} if attention == "channel" else None,
        )
    expected = {}
    for name, model in models.items():
        expected[name] = numpy(model(images))
        model.save(tmp_path / f"{name}.keras")
    with channels_first():
        for name in models:
            loaded = keras.saving.load_model(tmp_path / f"{name}.keras")
            np.testing.assert_allclose(numpy(loaded(images)), expected[name], atol=1e-6)
        keras.utils.set_random_seed(0)
        built = CBAMResNet(image_size=8, num_channels=1, num_classes=3,
                           filters=(4, 8), blocks_per_stage=1, stem_filters=4)
        assert numpy(built(images)).shape == (2, 3)
        keras.utils.set_random_seed(0)
        fresh = VisionTransformer(
            image_size=8, patch_size=2, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1, attention="spatial",
        )
        scores = fresh.attention_scores(images)[0]
        assert tuple(scores.shape) == (2, 4, 4, 1)  # a map of the 4 x 4 grid
        detr = DETR(num_classes=2, num_queries=3, hidden_dim=8, num_heads=2,
                    num_encoder_layers=1, num_decoder_layers=1,
                    feedforward_dim=8, backbone_filters=(4, 8),
                    attention_module="cbam")
        assert numpy(detr(images)["boxes"]).shape == (2, 3, 4)


def test_grad_cam_refuses_a_channels_first_map():
    from keras_attention.visualization import grad_cam

    inputs = keras.Input((1, 8, 8))
    x = keras.layers.Conv2D(4, 3, padding="same", data_format="channels_first")(inputs)
    x = keras.layers.GlobalAveragePooling2D(data_format="channels_first")(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    with pytest.raises(ValueError, match="channels-last feature maps.*channels_first"):
        grad_cam(model, np.zeros((1, 1, 8, 8), "float32"))
