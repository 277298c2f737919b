"""Rotary embeddings and ALiBi against keras-hub's layers applied by hand."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from keras_attention.ops import positions
from tests.cases_sequence import softmax

keras_hub = pytest.importorskip("keras_hub")


@pytest.mark.parametrize("max_wavelength, scaling_factor", [(10000, 1.0), (500, 4.0)])
@pytest.mark.parametrize("start_index", [0, 7])
def test_rotary_embedding_equals_keras_hub(max_wavelength, scaling_factor, start_index):
    x = np.random.default_rng(0).normal(size=(2, 9, 3, 8)).astype("float32")
    want = keras_hub.layers.RotaryEmbedding(
        max_wavelength=max_wavelength, scaling_factor=scaling_factor
    )(x, start_index=start_index)
    got = positions.rotary_embedding(
        x, start_index=start_index, max_wavelength=max_wavelength,
        scaling_factor=scaling_factor,
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


@pytest.mark.parametrize("num_heads", [1, 4, 6, 8])
def test_alibi_slopes_equal_keras_hub(num_heads):
    layer = keras_hub.layers.AlibiBias()
    np.testing.assert_allclose(
        positions.alibi_slopes(num_heads), layer._get_slopes(num_heads), rtol=1e-7
    )


def hub_alibi_reference(q, k, v, mask=None, causal=False):
    """keras-hub's AlibiBias added to the scaled scores, then softmax."""
    heads = q.shape[2]
    k = np.repeat(k, heads // k.shape[2], axis=2)
    v = np.repeat(v, heads // v.shape[2], axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.asarray(keras_hub.layers.AlibiBias()(scores.astype("float32")))
    full = np.ones(scores.shape, bool)
    if mask is not None:
        full &= mask[:, None, None, :]
    if causal:
        full &= np.tril(np.ones(scores.shape[-2:], bool))
    return np.einsum("bhts,bshd->bthd", softmax(scores.astype("float64"), full), v)


@pytest.mark.parametrize("implementation", ["dense", "blocked", "fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_in_every_path_equals_keras_hub(implementation, causal):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 11, 4, 8)).astype("float32")
    k = rng.normal(size=(2, 11, 2, 8)).astype("float32")
    v = rng.normal(size=(2, 11, 2, 8)).astype("float32")
    mask = np.ones((2, 11), bool)
    mask[1, 8:] = False
    want = hub_alibi_reference(q, k, v, mask, causal)
    got = attention_ops.dot_product_attention(
        q, k, v, attention_mask=mask, is_causal=causal,
        implementation=implementation, block_size=4,
        alibi_slopes=positions.alibi_slopes(4),
    )
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_alibi_blocked_gradients_equal_dense(window):
    rng = np.random.default_rng(2)
    q, k, v = (
        tf.constant(rng.normal(size=(1, 20, 2, 8)).astype("float32"))
        for _ in range(3)
    )
    slopes = positions.alibi_slopes(2)

    def run(implementation):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attention_ops.dot_product_attention(
                q, k, v, is_causal=True, implementation=implementation,
                block_size=4, alibi_slopes=slopes, sliding_window=window,
            )
            loss = tf.reduce_sum(out * tf.cos(out))
        return [out] + tape.gradient(loss, [q, k, v])

    for want, got in zip(run("dense"), run("blocked")):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-5)
