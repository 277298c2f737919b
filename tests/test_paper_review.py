"""Defects found by checking CBAM, the non-local block and Swin's window
attention against their papers and reference implementations."""

import keras
import numpy as np
import pytest

from keras_attention.layers import CBAM
from keras_attention.layers import ChannelAttention
from keras_attention.layers import NonLocalBlock
from keras_attention.layers import SpatialAttention
from tests.cases_cbam import non_local_reference

FLOAT64 = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="float64 products on TensorFlow only (as tests/test_float64.py)",
)


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChannelAttention(reduction=2),
        lambda: SpatialAttention(kernel_size=3),
        lambda: CBAM(reduction=2, kernel_size=3),
        lambda: NonLocalBlock(zero_init_residual=False, sub_sample=True),
    ],
    ids=["channel", "spatial", "cbam", "non_local"],
)
def test_integer_feature_maps_are_refined_as_floats(make):
    # A uint8 image, e.g.: the channel weights in (0, 1) were cast to the
    # input's integers (all 0), the non-local residual truncated, and the
    # spatial map failed to multiply an integer tensor.
    x = np.random.default_rng(0).integers(0, 5, (1, 4, 5, 4)).astype("uint8")
    layer = make()
    y = layer(x)
    assert keras.backend.standardize_dtype(y.dtype) == "float32"
    np.testing.assert_allclose(np_(y), np_(layer(x.astype("float32"))), atol=1e-6)


@FLOAT64
@pytest.mark.parametrize(
    "make",
    [
        lambda: ChannelAttention(reduction=2, dtype="float64"),
        lambda: NonLocalBlock(
            mode="gaussian", sub_sample=True, zero_init_residual=False,
            dtype="float64",
        ),
    ],
    ids=["channel", "non_local"],
)
def test_float64_masked_pooling_keeps_float64(make):
    # The masked average/max pools went through float32: a mask of all
    # valid positions changed a float64 result by ~1e-8 to ~1e-6.
    x = np.random.default_rng(0).normal(size=(2, 5, 6, 4)) * 3.0 + 0.1
    layer = make()
    valid = np.ones((2, 5, 6), bool)
    np.testing.assert_allclose(
        np_(layer(x, mask=valid)), np_(layer(x)), rtol=1e-13, atol=1e-13
    )


@FLOAT64
@pytest.mark.parametrize("masked", [False, True])
def test_float64_video_with_sub_sampling(masked):
    # TensorFlow has no float64 MaxPool3D: sub-sampling a float64 video
    # (B, T, H, W, C) raised an InvalidArgumentError.
    x = np.random.default_rng(0).normal(size=(1, 3, 5, 4, 4))
    mask = np.ones(x.shape[:-1], bool) if masked else None
    if masked:
        mask[:, 2, 3:] = False
    layer = NonLocalBlock(
        sub_sample=(2, 3, 2), zero_init_residual=False, dtype="float64"
    )
    z, w = layer(x, mask=mask, return_attention_scores=True)
    expected, expected_w = non_local_reference(
        layer, x, mask=mask, return_weights=True
    )
    assert keras.backend.standardize_dtype(z.dtype) == "float64"
    np.testing.assert_allclose(np_(z), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np_(w), expected_w, rtol=1e-12, atol=1e-12)
