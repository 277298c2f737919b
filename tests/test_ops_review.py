"""`keras_attention.ops` as a user of keras's, torch's and JAX's attention
calls it: awkward arguments get errors naming them, float64 on every path,
the position helpers from the package itself. Runs on the backend in use."""

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops

RNG = np.random.default_rng(0)


def qkv(t=5, s=7, heads=4, kv_heads=2, dim=8, dtype="float32"):
    return (
        RNG.normal(size=(2, t, heads, dim)).astype(dtype),
        RNG.normal(size=(2, s, kv_heads, dim)).astype(dtype),
        RNG.normal(size=(2, s, kv_heads, dim)).astype(dtype),
    )


def test_blocked_float64_with_a_window_equals_dense():
    # keras's torch backend took `ops.maximum` of float64 tensors in
    # float32: the running maximum's start moved, `exp` of the difference
    # was inf, and the rows whose first key block was masked came out 0.
    q, k, v = qkv(t=7, s=7, dtype="float64")
    kwargs = dict(sliding_window=2, is_causal=True)
    blocked = attention_ops.dot_product_attention(
        q, k, v, implementation="blocked", block_size=2, **kwargs
    )
    dense = attention_ops.dot_product_attention(
        q, k, v, implementation="dense", **kwargs
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(blocked), keras.ops.convert_to_numpy(dense),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "change, argument",
    [
        (lambda q, k, v: (q.astype("int32"), k, v, {}), "query"),
        (lambda q, k, v: (q, k, v[:, :6], {}), "value"),
        (lambda q, k, v: (q, k[:1], v[:1], {}), "batch size"),
        (lambda q, k, v: (q, k, v, {"dropout_rate": 1.5, "training": True}),
         "dropout_rate"),
        (lambda q, k, v: (q, k, v, {"dropout_rate": -0.1}), "dropout_rate"),
        (lambda q, k, v: (q, k, v, {"block_size": 0,
                                    "implementation": "blocked"}), "block_size"),
        (lambda q, k, v: (q, k, v, {"alibi_slopes": [0.5, 0.25, 0.1]}),
         "alibi_slopes"),
        (lambda q, k, v: (q, k, v, {"bias": np.zeros((3, 5, 7), "float32")}),
         "bias"),
    ],
)
def test_bad_arguments_are_named(change, argument):
    q, k, v, kwargs = change(*qkv())
    with pytest.raises(ValueError, match=argument):
        attention_ops.dot_product_attention(q, k, v, **kwargs)


def test_a_bias_that_broadcasts_is_taken():
    q, k, v = qkv()
    bias = RNG.normal(size=(4, 5, 7)).astype("float32")  # (H, T, S)
    out = attention_ops.dot_product_attention(q, k, v, bias=bias)
    assert tuple(out.shape) == (2, 5, 4, 8)


def rotate_half_reference(x, positions, base=10000.0):
    """LLaMA's (Hugging Face's `rotate_half`) rotary embedding, float64."""
    dim = x.shape[-1]
    angles = positions[:, None] * base ** (-np.arange(0, dim, 2) / dim)
    angles = np.concatenate([angles, angles], -1)[None, :, None, :]
    half = dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def test_rotary_embedding_from_the_package_takes_numpy_heads():
    x = RNG.normal(size=(2, 5, 3, 8)).astype("float32")
    out = attention_ops.rotary_embedding(x, start_index=3)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out),
        rotate_half_reference(x.astype("float64"), np.arange(3, 8.0)),
        atol=1e-5,
    )
    assert attention_ops.alibi_slopes(3) == [2**-4, 2**-8, 2**-2]


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: attention_ops.rotary_embedding(np.ones((2, 5, 8), "float32")), "x"),
        (lambda: attention_ops.rotary_embedding(
            np.ones((2, 5, 1, 8), "float32"), positions=np.arange(4)), "positions"),
        (lambda: attention_ops.alibi_slopes(0), "num_heads"),
    ],
)
def test_position_helpers_name_bad_arguments(call, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        call()


@pytest.mark.parametrize(
    "segment_ids, num_segments, match",
    [
        ([0, -1, 1], 2, r"`segment_ids`, expected segment ids in \[0, 2\).*\[-1, 1\]"),
        (np.array([0, 0, 5]), 2, r"`segment_ids`.*\[0, 5\]"),
        ([0, 0], 2, r"`segment_ids`, expected one id per entry.*\(3,\)"),
        ([0, 0, 1], 2.0, r"`num_segments`"),
        ([0, 0, 1], -1, r"`num_segments`"),
    ],
)
def test_segment_softmax_names_bad_segments(segment_ids, num_segments, match):
    # A negative id was silently a segment of its own (weight 1), one past
    # the end TensorFlow's error from inside its segment op.
    scores = np.array([1.0, 2.0, 3.0], "float32")
    with pytest.raises(ValueError, match=match):
        attention_ops.segment_softmax(scores, segment_ids, num_segments)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(
            attention_ops.segment_softmax(scores, np.array([0, 0, 1]), 2)
        ),
        [1 / (1 + np.e), np.e / (1 + np.e), 1.0], rtol=1e-6,
    )


def test_masked_softmax_names_a_mask_that_does_not_broadcast():
    with pytest.raises(ValueError, match=r"`mask`.*scores.shape=\(1, 3\).*\(1, 4\)"):
        attention_ops.masked_softmax(np.zeros((1, 3), "float32"), np.ones((1, 4), bool))
    weights = attention_ops.masked_softmax(
        np.zeros((2, 1, 3), "float32"), np.array([[True, True, False]])
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(weights), [[[0.5, 0.5, 0.0]]] * 2
    )
