"""The blocked core with query blocks equals the dense path (values, grads)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops


@pytest.mark.parametrize("query_block_size", [None, 4, 6, 5])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
@pytest.mark.parametrize("jit", [False, True])
def test_query_blocks_equal_dense(query_block_size, causal, mask_kind, jit):
    rng = np.random.default_rng(7)
    b, t, s, h, kv, d = 2, 12, 13, 4, 2, 8
    q = tf.constant(rng.normal(size=(b, t, h, d)).astype("float32"))
    k = tf.constant(rng.normal(size=(b, s, kv, d)).astype("float32"))
    v = tf.constant(rng.normal(size=(b, s, kv, d)).astype("float32"))
    mask = None
    if mask_kind == "keys":
        mask = rng.random((b, s)) > 0.3
        mask[1] = False  # a batch element with no key at all
    elif mask_kind == "full":
        mask = rng.random((b, 1, t, s)) > 0.5
        mask[0, 0, 3] = False  # a query with no key

    def run(q, k, v, blocked):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            if blocked:
                out = attention_ops.blocked_attention(
                    q, k, v, attention_mask=mask, is_causal=causal,
                    block_size=4, query_block_size=query_block_size,
                )
            else:
                out = attention_ops.dot_product_attention(
                    q, k, v, attention_mask=mask, is_causal=causal,
                    implementation="dense",
                )
            loss = tf.reduce_sum(out * tf.cos(out))
        return [out] + tape.gradient(loss, [q, k, v])

    dense = run(q, k, v, False)
    blocked = tf.function(lambda q, k, v: run(q, k, v, True), jit_compile=jit)(q, k, v)
    for want, got in zip(dense, blocked):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
