"""float64 computes in float64 on every path of the core and of
`MultiHeadAttention`: the dense, blocked and chunked cores, the chunked
long-context path, RoPE and ALiBi, and `"auto"` (which on torch would
otherwise take Keras's fused op, float32 inside for float64).

On TensorFlow `ops.cast` of a Python float goes through float32, so the
dense core's `1 / sqrt(D)` kept float32's precision (errors of ~1e-8); the
blocked and chunked cores, the long-context path and the position
encodings computed in float32 outright (~1e-7). Small shapes, so each test
takes a few seconds.

On torch keras's `ops.matmul` computed float64 operands in float32 (its
`result_type` maps float64 to float32 off TensorFlow, Keras 3.15): the
dense and chunked cores were float32-accurate (~1e-7) until their products
went through `keras_attention.ops.masks.matmul`.
"""

import math

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention import ops as attention_ops
from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import positions
from tests.harness import values_and_grads

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.skipif(
    BACKEND == "jax",
    reason="JAX has no float64 arrays unless `jax_enable_x64` is set (off "
    "by default): float64 inputs become float32",
)
RNG = np.random.default_rng(0)


def _reference(q, k, v, causal, slopes=None):
    """float64 NumPy attention `(B, T, H, D)`, scale `1 / sqrt(D)`."""
    s = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    t, n = q.shape[1], k.shape[1]
    if slopes is not None:
        s = s + np.asarray(slopes)[None, :, None, None] * (
            np.arange(n)[None, :] - np.arange(t)[:, None]
        )
    if causal:
        s = np.where(np.tril(np.ones((t, n), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", w / w.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("implementation", ["auto", "dense", "blocked", "chunked"])
@pytest.mark.parametrize("causal", [False, True])
def test_float64_core_matches_a_float64_reference(implementation, causal):
    # D = 8: the scale 1 / sqrt(8) is not a float32 number. Three heads:
    # ALiBi slopes that are not powers of two.
    q, k, v = (RNG.standard_normal((1, 48, 3, 8)) for _ in range(3))
    slopes = positions.alibi_slopes(3)
    extra = {"block_size": 16} if implementation == "blocked" else {}
    for alibi in (None, slopes):
        out = attention_ops.dot_product_attention(
            q, k, v, is_causal=causal, implementation=implementation,
            alibi_slopes=alibi, **extra,
        )
        assert keras.backend.standardize_dtype(out.dtype) == "float64"
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(out), _reference(q, k, v, causal, alibi),
            rtol=0, atol=1e-13,
        )


def test_float64_rotary_embedding_matches_a_float64_reference():
    x = RNG.standard_normal((1, 6, 2, 8))
    out = positions.rotary_embedding(x, start_index=1000)
    assert keras.backend.standardize_dtype(out.dtype) == "float64"
    angles = (np.arange(6) + 1000.0)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    angles = np.concatenate([angles, angles], -1)[None, :, None, :]
    rotated = np.concatenate([-x[..., 4:], x[..., :4]], -1)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out),
        x * np.cos(angles) + rotated * np.sin(angles), rtol=0, atol=1e-12,
    )


def _values_and_grads(layer, x):
    """The output and the gradients of `sum(y * y)` for `x` and the
    layer's weights."""

    def fn(x):
        y = layer(x)
        return y, keras.ops.sum(y * y)

    return values_and_grads(fn, x, variables=layer.trainable_weights)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_float64_layer_paths_agree_in_values_and_gradients(encoding):
    # The blocked and chunked cores and the chunked long-context path
    # (a causal window) against the dense core, all float64.
    x = RNG.standard_normal((2, 40, 12))
    config = dict(
        num_heads=3, key_dim=6, dtype="float64", use_causal_mask=True,
        position_encoding=encoding, sliding_window=6,
    )
    dense = MultiHeadAttention(implementation="dense", **config)
    dense(x[:, :4])
    dense.set_weights([0.3 * RNG.standard_normal(w.shape) for w in dense.weights])
    expected = _values_and_grads(dense, x)
    # The long-context path runs on TensorFlow and JAX only.
    long = ("long",) if BACKEND == "tensorflow" else ()
    for implementation in ("blocked", "chunked") + long:
        layer = MultiHeadAttention(
            implementation="auto" if implementation == "long" else implementation,
            **config,
        )
        layer(x[:, :4])
        layer.set_weights(dense.get_weights())
        if implementation == "long":
            layer._long_context_chunk = layer._long_context_query_block = 8
            layer._long_context_min_length = 0
            assert layer._long_context_reason(x, None, None) is None
        for got, want in zip(_values_and_grads(layer, x), expected):
            assert got.dtype == np.float64
            np.testing.assert_allclose(
                got, want, rtol=0, atol=1e-11, err_msg=implementation
            )


def test_float64_non_local_products_of_both_dot_paths_agree():
    # "dot" mode computes theta (phi^T g) / N without weights and
    # (theta phi^T / N) g with them: the same projections, different
    # products, so only float64 products agree to 1e-12.
    layer = keras_attention.get(
        "non_local", mode="dot", zero_init_residual=False, dtype="float64"
    )
    x = RNG.standard_normal((2, 3, 4, 8))
    out = keras.ops.convert_to_numpy(layer(x))
    with_weights, _ = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(with_weights), out, rtol=0, atol=1e-12
    )


@pytest.mark.skipif(BACKEND != "tensorflow", reason="torch's Dense projections are float32-accurate (the module docstring)")
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_float64_graph_attention_matches_the_papers_equations(version):
    # keras's `ops.leaky_relu` on TensorFlow took its slope in float32
    # (0.2000000030): a 1e-8 relative error in a float64 layer.
    from keras_attention.layers import GraphAttention
    from tests.cases_graph import graph_reference

    x = RNG.standard_normal((6, 5))
    edges = np.array([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]], "int32")
    layer = GraphAttention(units=3, num_heads=2, version=version, dtype="float64")
    out, alpha = layer([x, edges], return_attention_scores=True)
    want, want_alpha = graph_reference(layer, [x, edges], return_coefficients=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(alpha), want_alpha, rtol=0, atol=1e-12)


def test_cached_decoding_under_a_float64_floatx():
    # Under `set_floatx("float64")` Keras's `arange` gives int64: the cache
    # positions (arange + an int32 index) failed in a TensorFlow graph,
    # and with them the translators' and the causal LM's generation.
    keras.config.set_floatx("float64")
    try:
        layer = MultiHeadAttention(
            num_heads=4, key_dim=8, num_key_value_heads=2, sliding_window=16,
            use_causal_mask=True, position_encoding="rope",
        )
        tokens = np.random.default_rng(0).random((1, 5, 32))
        full = keras.ops.convert_to_numpy(layer(tokens))
        def step(t, c, i):
            return layer(t, cache=c, cache_update_index=i)

        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            step = tf.function(step)  # the graph failed, not eager
        out, _ = step(tokens[:, :1], np.zeros((1, 2, 16, 2, 8)), 0)
        # (Keras's torch Dense multiplies float64 in float32: 2e-7 off.)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(out)[0, 0], full[0, 0], atol=1e-6
        )
    finally:
        keras.config.set_floatx("float32")


def test_luong_general_scores_in_float64():
    # Keras's torch `Dense` gives float32 for float64 inputs: the query's
    # projection met float64 keys in the scores' einsum (a RuntimeError
    # when the weights were returned).
    from keras_attention.layers import ScaledDotProductAttention

    rng = np.random.default_rng(0)
    q, v = rng.random((2, 3, 4)), rng.random((2, 5, 4))
    layer = ScaledDotProductAttention(score_mode="general", dtype="float64")
    out, weights = layer([q, v], return_attention_scores=True)
    assert keras.backend.standardize_dtype(weights.dtype) == "float64"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(weights).sum(-1), 1.0, atol=1e-6
    )
