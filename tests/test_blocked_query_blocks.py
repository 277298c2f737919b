"""The blocked core with query blocks equals the dense path (values, grads)."""

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from tests import harness

BACKEND = keras.backend.backend()


def values_and_grads(q, k, v, attend, jit=False):
    """`[out, d_q, d_k, d_v]` of `sum(out * cos(out))`, as NumPy."""

    def fn(q, k, v):
        out = attend(q, k, v)
        return out, keras.ops.sum(out * keras.ops.cos(out))

    return harness.values_and_grads(fn, q, k, v, jit=jit)


@pytest.mark.parametrize("query_block_size", [None, 4, 6, 5])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
@pytest.mark.parametrize("jit", [False, True])
def test_query_blocks_equal_dense(query_block_size, causal, mask_kind, jit):
    if jit and BACKEND == "torch":
        pytest.skip("torch has no XLA compile")
    rng = np.random.default_rng(7)
    b, t, s, h, kv, d = 2, 12, 13, 4, 2, 8
    q = rng.normal(size=(b, t, h, d)).astype("float32")
    k = rng.normal(size=(b, s, kv, d)).astype("float32")
    v = rng.normal(size=(b, s, kv, d)).astype("float32")
    mask = None
    if mask_kind == "keys":
        mask = rng.random((b, s)) > 0.3
        mask[1] = False  # a batch element with no key at all
    elif mask_kind == "full":
        mask = rng.random((b, 1, t, s)) > 0.5
        mask[0, 0, 3] = False  # a query with no key

    dense = values_and_grads(q, k, v, lambda q, k, v: (
        attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=causal,
            implementation="dense",
        )
    ))
    blocked = values_and_grads(q, k, v, lambda q, k, v: (
        attention_ops.blocked_attention(
            q, k, v, attention_mask=mask, is_causal=causal,
            block_size=4, query_block_size=query_block_size,
        )
    ), jit=jit)
    for want, got in zip(dense, blocked):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d_v", [8, 5])
@pytest.mark.parametrize("window", [None, 5])
def test_query_blocks_with_other_value_sizes_equal_dense(d_v, window):
    """dO's buffer holds d_q when both have the query's shape (d_v == d);
    a value head of another size takes the other branch. GQA: 4 query
    heads on 2 key heads, grouped per block, never repeated."""
    rng = np.random.default_rng(11)
    b, t, h, kv, d = 2, 12, 4, 2, 8
    q = rng.normal(size=(b, t, h, d)).astype("float32")
    k = rng.normal(size=(b, t, kv, d)).astype("float32")
    v = rng.normal(size=(b, t, kv, d_v)).astype("float32")

    dense = values_and_grads(q, k, v, lambda q, k, v: (
        attention_ops.dot_product_attention(
            q, k, v, is_causal=True, sliding_window=window,
            implementation="dense",
        )
    ))
    blocked = values_and_grads(q, k, v, lambda q, k, v: (
        attention_ops.blocked_attention(
            q, k, v, is_causal=True, block_size=4, query_block_size=4,
            sliding_window=window,
        )
    ))
    for want, got in zip(dense, blocked):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="reads the optimized HLO of a TensorFlow XLA function",
)
def test_compiled_layer_gradient_has_no_head_major_copy():
    """The blocked core works in the projections' `(B, T, H, D)` layout: the
    compiled forward + backward of a windowed layer holds no length-sized
    `(B, H, T, D)` tensor (a transpose of a projection, the output or a
    gradient), each of which would cost one more `T x H x D` buffer."""
    import tensorflow as tf

    from keras_attention.layers import MultiHeadAttention

    t, h, d = 1024, 4, 16
    layer = MultiHeadAttention(
        num_heads=h, key_dim=d, sliding_window=64, use_causal_mask=True,
        implementation="blocked",
    )
    x = tf.random.normal((1, t, h * d), seed=0)
    layer(x[:, :8])

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x) ** 2)
        return tape.gradient(loss, [x] + layer.trainable_weights)

    hlo = step.experimental_get_compiler_ir(x)(stage="optimized_hlo")
    assert f"f32[1,{t},{h},{d}]" in hlo
    assert f"f32[1,{h},{t},{d}]" not in hlo
