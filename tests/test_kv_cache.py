"""MultiHeadAttention's public KV cache (keras-hub's convention): decoding
step by step equals the full causal forward, a window's ring cache too."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention.layers import MultiHeadAttention

T, DIM = 11, 12


def make(**kwargs):
    layer = MultiHeadAttention(
        num_heads=4, key_dim=8, num_key_value_heads=2, use_causal_mask=True,
        **kwargs,
    )
    x = np.random.default_rng(0).normal(size=(2, T, DIM)).astype("float32")
    return layer, x


def decode(layer, x, cache_len, prefill=0, step=1, jit=False):
    """Feeds `x` after a prefill of `prefill` tokens, `step` at a time."""
    cache = np.zeros((x.shape[0], 2, cache_len, layer.kv_heads, 8), "float32")
    call = layer
    if jit:
        call = tf.function(
            lambda q, cache, index: layer(q, cache=cache, cache_update_index=index),
            jit_compile=True,
        )
    outputs, start = [], 0
    if prefill:
        out, cache = layer(x[:, :prefill], cache=cache, cache_update_index=0)
        outputs.append(out)
        start = prefill
    for i in range(start, x.shape[1], step):
        q = x[:, i : i + step]
        if jit:
            out, cache = call(q, cache, tf.constant(i))
        else:
            out, cache = call(q, cache=cache, cache_update_index=i)
        outputs.append(out)
    return np.concatenate([keras.ops.convert_to_numpy(o) for o in outputs], axis=1)


@pytest.mark.parametrize("encoding", [None, "rope", "alibi"])
@pytest.mark.parametrize("prefill, step", [(0, 1), (4, 1), (3, 2)])
def test_cached_decoding_equals_the_full_causal_forward(encoding, prefill, step):
    layer, x = make(position_encoding=encoding)
    want = keras.ops.convert_to_numpy(layer(x))
    got = decode(layer, x, cache_len=16, prefill=prefill, step=step)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("encoding", [None, "rope", "alibi"])
@pytest.mark.parametrize("prefill, step", [(0, 1), (5, 1), (2, 3), (7, 2)])
def test_ring_cache_of_the_window_equals_the_windowed_forward(encoding, prefill, step):
    layer, x = make(position_encoding=encoding, sliding_window=4)
    want = keras.ops.convert_to_numpy(layer(x))
    got = decode(layer, x, cache_len=4, prefill=prefill, step=step)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="tf.function"
)
def test_cached_decoding_under_jit_with_a_tensor_index():
    layer, x = make(position_encoding="rope", sliding_window=3)
    want = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_allclose(decode(layer, x, 3, jit=True), want, atol=2e-5)
    np.testing.assert_allclose(decode(layer, x, 16, jit=True), want, atol=2e-5)


def test_cache_errors_before_any_work():
    layer, x = make()
    layer(x)
    good = np.zeros((2, 2, 16, 2, 8), "float32")
    with pytest.raises(ValueError, match="cache.shape"):
        layer(x, cache=good[:, :, :, :1], cache_update_index=0)
    with pytest.raises(ValueError, match="cache.shape"):
        layer(x, cache=good[:, 0], cache_update_index=0)
    # (keras autocasts a floating cache to the compute dtype on `__call__`.)
    with pytest.raises(ValueError, match="cache.dtype=int32"):
        layer(x, cache=good.astype("int32"), cache_update_index=0)
    with pytest.raises(ValueError, match="cache_update_index=6"):
        layer(x, cache=good, cache_update_index=6)  # 6 + 11 > 16
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(x, cache_update_index=0)
    # A signature of unknown S_max: "None values not supported" before.
    step = tf.function(
        lambda x, cache: layer(x, cache=cache, cache_update_index=0),
        input_signature=[tf.TensorSpec(x.shape, "float32"),
                         tf.TensorSpec((2, 2, None, 2, 8), "float32")],
    )
    with pytest.raises(ValueError, match=r"(?s)S_max \(axis 2\) known.*signature"):
        step.get_concrete_function()


@pytest.mark.parametrize(
    "index",
    [np.int64(6), np.int32(16), np.array(6), np.int64(-1), -1,
     keras.ops.convert_to_tensor(6)],
)
def test_cache_index_past_the_end_raises_for_every_integer_kind(index):
    # NumPy integers and eager tensors were not checked: the write was
    # clamped into the cache's last rows (or its first, for -1), silently.
    layer, x = make()
    layer(x)
    cache = np.zeros((2, 2, 16, 2, 8), "float32")
    with pytest.raises(ValueError, match="cache_update_index="):
        layer(x, cache=cache, cache_update_index=index)


@pytest.mark.parametrize("index", [True, 2.0, "2", np.array([2]), np.array(2.0)])
def test_cache_index_of_a_wrong_kind_raises(index):
    layer, x = make()
    cache = np.zeros((2, 2, 16, 2, 8), "float32")
    with pytest.raises(ValueError, match="integer scalar tensor"):
        layer(x[:, :1], cache=cache, cache_update_index=index)


def test_ring_cache_refuses_a_negative_index_only():
    layer, x = make(sliding_window=4)
    ring = np.zeros((2, 2, 4, 2, 8), "float32")
    with pytest.raises(ValueError, match="cache_update_index=-2"):
        layer(x[:, :1], cache=ring, cache_update_index=np.int64(-2))
    out, _ = layer(x[:, :1], cache=ring, cache_update_index=np.int64(40))
    assert out.shape == (2, 1, DIM)


def test_cached_attention_mask_of_a_wrong_length_names_the_argument():
    # Was TensorFlow's bare "Incompatible shapes" from a logical_and.
    layer, x = make()
    cache = np.zeros((2, 2, 16, 2, 8), "float32")
    with pytest.raises(ValueError, match=r"attention_mask.shape=\(2, 1, 15\)"):
        layer(x[:, :1], cache=cache, cache_update_index=3,
              attention_mask=np.ones((2, 1, 15), bool))
    ring = np.zeros((2, 2, 4, 2, 8), "float32")
    layer, x = make(sliding_window=4)
    with pytest.raises(ValueError, match="the ring's W slots, then the T new"):
        layer(x[:, :1], cache=ring, cache_update_index=3,
              attention_mask=np.ones((2, 1, 4), bool))
    # The ring's keys: its 4 slots, then the new token.
    out, _ = layer(x[:, :1], cache=ring, cache_update_index=3,
                   attention_mask=np.ones((2, 1, 5), bool))
    assert out.shape == (2, 1, DIM)


def test_cached_call_refuses_a_non_token_query_and_values_of_another_length():
    # A (B, H, W, dim) query (attention_axes) failed deep in the backend
    # (XLA "input and update must have the same rank"); key/value rows of
    # another length than the query were written into the cache but only
    # T of them attended to (or, in a ring, at the wrong positions).
    layer = MultiHeadAttention(num_heads=2, key_dim=8, attention_axes=(1, 2))
    images = np.zeros((2, 3, 3, DIM), "float32")
    cache = np.zeros((2, 2, 9, 2, 8), "float32")
    with pytest.raises(ValueError, match=r"query.shape=\(2, 3, 3, 12\)"):
        layer(images, cache=cache, cache_update_index=0)
    for window, size in [(None, 16), (4, 4)]:
        layer, x = make(sliding_window=window)
        cache = np.zeros((2, 2, size, 2, 8), "float32")
        with pytest.raises(ValueError, match=r"`value`.*value.shape=\(2, 3, 12\)"):
            layer(x[:, :1], value=x[:, :3], cache=cache, cache_update_index=0)
        with pytest.raises(ValueError, match=r"`key`.*key.shape=\(2, 2, 12\)"):
            layer(x[:, :1], value=x[:, :1], key=x[:, :2], cache=cache,
                  cache_update_index=0)
        # Reading a fixed memory (no index) takes any length.
        out, _ = layer(x[:, :1], value=x[:, :3], cache=cache)
        assert out.shape == (2, 1, DIM)


def test_masks_given_by_hand_in_a_cached_call_raise_keras_masks_do_not():
    # value_mask, query_mask and key_mask were dropped without a word.
    layer, x = make()
    cache = np.zeros((2, 2, 16, 2, 8), "float32")
    pad = np.arange(T) > 0
    for name in ("query_mask", "value_mask", "key_mask"):
        with pytest.raises(ValueError, match=f"`{name}` is not read in a cached"):
            layer(x, cache=cache, cache_update_index=0, **{name: pad[None]})
    # A Keras mask on the input (as Embedding(mask_zero=True) sets), which
    # Keras passes as query_mask/value_mask itself, is not read, as before.
    ids = keras.ops.convert_to_tensor(np.array([[0, 1, 2, 3]] * 2))
    tokens = keras.layers.Embedding(5, DIM, mask_zero=True)(ids)
    out, _ = layer(tokens, cache=cache, cache_update_index=0)
    want, _ = layer(keras.ops.convert_to_tensor(
        keras.ops.convert_to_numpy(tokens)), cache=cache, cache_update_index=0)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out), keras.ops.convert_to_numpy(want))


def test_cached_alibi_gives_the_core_its_slopes_not_a_dense_bias(monkeypatch):
    # A prompt of 8,192 tokens took 4 GB through the cache with ALiBi (a
    # dense (1, H, T, S) bias and the dense path), 0.9 uncached; a ring
    # cache too (its keys' positions are not its slots').
    from keras_attention import ops as attention_ops

    layer, x = make(position_encoding="alibi")
    want = keras.ops.convert_to_numpy(layer(x))
    calls = []
    core = attention_ops.dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("bias"), kwargs["alibi_slopes"],
                      kwargs.get("implementation", "auto")))
        return core(*args, **kwargs)

    monkeypatch.setattr(attention_ops, "dot_product_attention", spy)
    got = decode(layer, x, cache_len=16, prefill=5, step=2)
    np.testing.assert_allclose(got, want, atol=2e-5)
    # A ring's slots are put in the order of their positions first.
    ring, _ = make(position_encoding="alibi", sliding_window=4)
    ring.build(x.shape)
    ring.set_weights(layer.get_weights())
    want_ring = keras.ops.convert_to_numpy(ring(x))
    for prefill, step in [(0, 1), (5, 1), (2, 3), (7, 2)]:
        got = decode(ring, x, cache_len=4, prefill=prefill, step=step)
        np.testing.assert_allclose(got, want_ring, atol=2e-5)
    assert calls and all(
        bias is None and slopes is not None and implementation == "auto"
        for bias, slopes, implementation in calls
    )


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.function")
def test_a_traced_write_past_the_end_gives_nan_not_wrong_numbers():
    # Inside tf.function the index is unknown when the call is checked; the
    # write was clamped onto the last slot and the output silently wrong.
    layer, x = make()
    call = tf.function(
        lambda q, cache, index: layer(q, cache=cache, cache_update_index=index)
    )
    cache = np.zeros((2, 2, 4, 2, 8), "float32")
    for i in range(6):
        out, cache = call(x[:, i : i + 1], cache, tf.constant(i))
        assert np.isnan(keras.ops.convert_to_numpy(out)).all() == (i >= 4), i
    # A negative index landed on the first slot, finite and wrong.
    out, _ = call(x[:, :1], np.zeros((2, 2, 4, 2, 8), "float32"), tf.constant(-1))
    assert np.isnan(keras.ops.convert_to_numpy(out)).all()


@pytest.mark.parametrize("encoding", [None, "alibi"])
def test_a_ring_mask_names_slots_in_slot_order(encoding):
    # ALiBi puts a ring's slots in position order for the core: the
    # caller's attention_mask (over the slots, then the new tokens) must
    # follow them. At index 6 a ring of 4 holds positions 4, 5, 2, 3 in
    # slots 0-3; masking slot 1 is masking position 5.
    layer, x = make(position_encoding=encoding, sliding_window=4)
    cache = np.zeros((2, 2, 4, 2, 8), "float32")
    for i in range(6):
        _, cache = layer(x[:, i : i + 1], cache=cache, cache_update_index=i)
    slots = np.ones((2, 1, 5), bool)
    slots[:, :, 1] = False
    got, _ = layer(x[:, 6:7], cache=cache, cache_update_index=6,
                   attention_mask=slots)
    rows = np.arange(7)
    allowed = (rows[:, None] >= rows) & (rows[:, None] - rows < 4)
    allowed[6, 5] = False
    want = layer(x[:, :7], attention_mask=np.broadcast_to(allowed, (2, 7, 7)))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got)[:, 0],
        keras.ops.convert_to_numpy(want)[:, 6], atol=2e-5,
    )


def test_a_cached_call_takes_the_layers_path():
    # The cached call ran the core as "auto": an explicit "blocked" layer
    # (no dropout) refused training with dropout uncached and ran it cached.
    layer, x = make(implementation="blocked", dropout=0.5)
    layer(x)
    with pytest.raises(ValueError, match="dropout"):
        layer(x, training=True)
    cache = np.zeros((2, 2, T, layer.kv_heads, 8), "float32")
    with pytest.raises(ValueError, match="dropout"):
        layer(x[:, :3], cache=cache, cache_update_index=0, training=True)
    # Without training, the blocked path's cached decoding is the dense one.
    dense, _ = make(implementation="dense")
    dense(x)
    dense.set_weights(layer.get_weights())
    expected = dense(x[:, :3], cache=cache, cache_update_index=0)[0]
    np.testing.assert_allclose(
        layer(x[:, :3], cache=cache, cache_update_index=0)[0], expected, atol=1e-5
    )
