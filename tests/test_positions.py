"""Rotary embeddings and ALiBi against keras-hub's layers applied by hand."""

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from keras_attention.ops import positions
from tests.cases_sequence import softmax
from tests.harness import values_and_grads

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
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), atol=1e-5
    )


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
    scores = keras.ops.convert_to_numpy(
        keras_hub.layers.AlibiBias()(scores.astype("float32"))
    )
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
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), want, atol=2e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_alibi_blocked_gradients_equal_dense(window):
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(1, 20, 2, 8)).astype("float32") for _ in range(3))
    slopes = positions.alibi_slopes(2)

    def run(implementation):
        def fn(q, k, v):
            out = attention_ops.dot_product_attention(
                q, k, v, is_causal=True, implementation=implementation,
                block_size=4, alibi_slopes=slopes, sliding_window=window,
            )
            return out, keras.ops.sum(out * keras.ops.cos(out))

        return values_and_grads(fn, q, k, v)

    for want, got in zip(run("dense"), run("blocked")):
        np.testing.assert_allclose(got, want, atol=2e-5)


def by_hand(layer, x, encoding, causal):
    """The layer's projections, keras-hub's position layer, the attention."""
    q, k, v = layer._query_dense(x), layer._key_dense(x), layer._value_dense(x)
    q, k, v = (keras.ops.convert_to_numpy(t).astype("float64") for t in (q, k, v))
    if encoding == "rope":
        rope = keras_hub.layers.RotaryEmbedding(
            max_wavelength=layer.rope_max_wavelength,
            scaling_factor=layer.rope_scaling_factor,
        )
        q, k = (
            keras.ops.convert_to_numpy(rope(t.astype("float32"))).astype("float64")
            for t in (q, k)
        )
    heads = q.shape[2]
    k = np.repeat(k, heads // k.shape[2], axis=2)
    v = np.repeat(v, heads // v.shape[2], axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    if encoding == "alibi":
        scores = keras.ops.convert_to_numpy(
            keras_hub.layers.AlibiBias(alibi_bias_max=layer.alibi_bias_max)(
                scores.astype("float32")
            )
        ).astype("float64")
    full = np.ones(scores.shape, bool)
    if causal:
        full &= np.tril(np.ones(scores.shape[-2:], bool))
    out = np.einsum("bhts,bshd->bthd", softmax(scores, full), v)
    return keras.ops.convert_to_numpy(layer._output_dense(out.astype("float32")))


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
@pytest.mark.parametrize("implementation", ["dense", "blocked", "fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_layer_position_encodings_equal_keras_hub_by_hand(encoding, implementation, causal):
    from keras_attention.layers import MultiHeadAttention

    layer = MultiHeadAttention(
        num_heads=4, key_dim=8, num_key_value_heads=2, use_causal_mask=causal,
        position_encoding=encoding, rope_max_wavelength=100,
        rope_scaling_factor=2.0, alibi_bias_max=4, implementation=implementation,
    )
    x = np.random.default_rng(3).normal(size=(2, 13, 12)).astype("float32")
    got = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_allclose(got, by_hand(layer, x, encoding, causal), atol=2e-5)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_layer_position_encodings_round_trip(tmp_path, encoding):
    from keras_attention.layers import MultiHeadAttention

    inputs = keras.Input((10, 8))
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, position_encoding=encoding,
        rope_max_wavelength=50, use_causal_mask=True, sliding_window=4,
    )
    model = keras.Model(inputs, layer(inputs))
    config = layer.get_config()
    assert config["position_encoding"] == encoding
    assert MultiHeadAttention.from_config(config).rope_max_wavelength == 50
    model.compile("sgd", "mse", jit_compile=True)
    x = np.random.default_rng(0).normal(size=(2, 10, 8)).astype("float32")
    model.fit(x, x, epochs=1, verbose=0)
    path = str(tmp_path / "positions.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(position_encoding="xpos"), "position_encoding"),
        (dict(position_encoding="rope", rope_max_wavelength=0), "rope_max_wavelength"),
        (dict(position_encoding="rope", rope_scaling_factor=-1.0), "rope_scaling_factor"),
        (dict(position_encoding="alibi", alibi_bias_max="8"), "alibi_bias_max"),
    ],
)
def test_layer_rejects_bad_position_arguments(kwargs, name):
    from keras_attention.layers import MultiHeadAttention

    with pytest.raises(ValueError, match=f"{name}="):
        MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(
    "jit",
    [
        False,
        pytest.param(True, marks=pytest.mark.skipif(
            keras.backend.backend() == "torch",
            reason="XLA compilation exists on TensorFlow and JAX only",
        )),
    ],
)
def test_alibi_with_query_blocks_equals_dense(window, jit):
    """Several query blocks: the bias follows each block's query rows."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(1, 18, 2, 8)).astype("float32") for _ in range(3))
    slopes = positions.alibi_slopes(2, 4)

    def run(blocked):
        def fn(q, k, v):
            if blocked:
                out = attention_ops.blocked_attention(
                    q, k, v, is_causal=True, block_size=4, query_block_size=6,
                    alibi_slopes=slopes, sliding_window=window,
                )
            else:
                out = attention_ops.dot_product_attention(
                    q, k, v, is_causal=True, implementation="dense",
                    alibi_slopes=slopes, sliding_window=window,
                )
            return out, keras.ops.sum(out * keras.ops.cos(out))

        return values_and_grads(fn, q, k, v, jit=blocked and jit)

    want = run(False)
    got = run(True)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=2e-5)
