"""Sliding-window attention: the blocked path skips key blocks outside the
band and still equals the dense path with an explicit band mask."""

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from keras_attention.ops import blocked
from tests import harness

BACKEND = keras.backend.backend()


def band(t, s, window, causal):
    d = np.arange(t)[:, None] - np.arange(s)[None, :]
    if causal:
        return (d >= 0) & (d < window)
    return np.abs(d) < window


def qkv(rng, b, t, s, h, kv, d, dtype="float32"):
    return [
        rng.normal(size=shape).astype(dtype)
        for shape in ((b, t, h, d), (b, s, kv, d), (b, s, kv, d))
    ]


def values_and_grads(fn, q, k, v, jit=False):
    """`[out, d_q, d_k, d_v]` of `sum(out * cos(out))` (in float32), as
    NumPy."""

    def f(q, k, v):
        out = fn(q, k, v)
        out32 = keras.ops.cast(out, "float32")
        return out, keras.ops.sum(out32 * keras.ops.cos(out32))

    return harness.values_and_grads(f, q, k, v, jit=jit)


def padding_mask(rng, b, s):
    mask = rng.random((b, s)) > 0.25
    mask[-1, : s // 2] = False  # many rows of the band see no key at all
    return mask


@pytest.mark.parametrize(
    "t, s, window, block, q_block",
    [
        (24, 24, 3, 4, 4),
        (30, 30, 5, 4, 8),   # T not a multiple of the query block
        (17, 23, 6, 5, 4),   # T != S
        (16, 16, 1, 4, 4),   # only the diagonal
        (12, 12, 40, 4, 4),  # window wider than the sequence
    ],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_blocked_window_equals_dense_band(t, s, window, block, q_block, causal, masked):
    rng = np.random.default_rng(t * 31 + window)
    q, k, v = qkv(rng, 2, t, s, 4, 2, 8)  # GQA: 4 query heads on 2
    mask = padding_mask(rng, 2, s) if masked else None
    explicit = band(t, s, window, causal)[None]
    full = explicit if mask is None else explicit & mask[:, None, :]
    want = values_and_grads(
        lambda q, k, v: attention_ops.dot_product_attention(
            q, k, v, attention_mask=full, is_causal=causal,
            implementation="dense",
        ),
        q, k, v,
    )
    got = values_and_grads(
        lambda q, k, v: attention_ops.blocked_attention(
            q, k, v, attention_mask=mask, is_causal=causal, block_size=block,
            query_block_size=q_block, sliding_window=window,
        ),
        q, k, v,
    )
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.parametrize("implementation", ["dense", "blocked"])
@pytest.mark.parametrize("causal", [False, True])
def test_core_window_argument_equals_band_mask(implementation, causal):
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 2, 20, 20, 2, 2, 8)
    mask = padding_mask(rng, 2, 20)
    full = band(20, 20, 4, causal)[None] & mask[:, None, :]
    want = values_and_grads(
        lambda q, k, v: attention_ops.dot_product_attention(
            q, k, v, attention_mask=full, is_causal=causal,
            implementation="dense",
        ),
        q, k, v,
    )
    got = values_and_grads(
        lambda q, k, v: attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=causal, sliding_window=4,
            implementation=implementation, block_size=4,
        ),
        q, k, v,
    )
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_window_under_jit_compile_and_float16(causal):
    # Compiled with XLA (torch, which has none: eagerly).
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 1, 26, 26, 2, 1, 8, "float16")
    want = values_and_grads(
        lambda q, k, v: attention_ops.dot_product_attention(
            q, k, v, attention_mask=band(26, 26, 5, causal)[None],
            is_causal=causal, implementation="dense",
        ),
        q, k, v,
    )
    got = values_and_grads(
        lambda q, k, v: attention_ops.blocked_attention(
            q, k, v, is_causal=causal, block_size=4, query_block_size=8,
            sliding_window=5,
        ),
        q, k, v, jit=BACKEND != "torch",
    )
    assert got[0].dtype == np.float16
    for w, g in zip(want, got):
        np.testing.assert_allclose(
            g.astype("float32"), w.astype("float32"), atol=2e-2
        )


def test_blocked_window_visits_only_the_band(monkeypatch):
    """Each query block steps over the few key blocks its band meets."""
    spans = []
    original = blocked._Plan

    def spy(*args):
        plan = original(*args)
        spans.append((plan.span, plan.num_blocks))
        return plan

    monkeypatch.setattr(blocked, "_Plan", spy)
    rng = np.random.default_rng(0)
    q, k, v = qkv(rng, 1, 256, 256, 1, 1, 4)
    attention_ops.blocked_attention(
        q, k, v, block_size=16, query_block_size=16, sliding_window=8,
        is_causal=True,
    )
    # 16 + 7 keys meet at most 3 of the 16 key blocks.
    assert spans == [(3, 16)]


@pytest.mark.parametrize("window", [0, -3, 2.0, "4", True])
def test_bad_sliding_window_raises_before_any_work(window):
    rng = np.random.default_rng(0)
    q, k, v = qkv(rng, 1, 4, 4, 1, 1, 4)
    for fn in (attention_ops.dot_product_attention, attention_ops.blocked_attention):
        with pytest.raises(ValueError, match=r"sliding_window=" + repr(window).replace(".", r"\.")):
            fn(q, k, v, sliding_window=window)


def _layers(window, causal, implementation):
    import keras

    from keras_attention.layers import MultiHeadAttention

    ours = MultiHeadAttention(
        num_heads=2, key_dim=4, sliding_window=window, use_causal_mask=causal,
        implementation=implementation, num_key_value_heads=1,
    )
    theirs = MultiHeadAttention(
        num_heads=2, key_dim=4, use_causal_mask=causal,
        implementation="dense", num_key_value_heads=1,
    )
    x = keras.ops.ones((2, 19, 6))
    ours(x)
    theirs(x)
    theirs.set_weights(ours.get_weights())
    return ours, theirs


@pytest.mark.parametrize("causal", [False, True])
def test_layer_routes_its_window_to_the_core(monkeypatch, causal):
    """`MultiHeadAttention(sliding_window=W)` hands `W` to the core (no
    band mask), and equals the layer given the band as a mask, in values and
    in the gradients of its weights."""
    seen = []
    original = attention_ops.dispatch.blocked_heads

    def spy(*args):
        seen.append(args[8])  # sliding_window
        return original(*args)

    monkeypatch.setattr(attention_ops.dispatch, "blocked_heads", spy)
    ours, theirs = _layers(3, causal, "blocked")
    del seen[:]
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 19, 6)).astype("float32")
    keys = np.ones((2, 19), bool)
    keys[1, 15:] = False
    full = band(19, 19, 3, False)[None] & keys[:, None, :]

    def run(layer, **kwargs):
        def fn(x):
            out = layer(x, **kwargs)
            return out, keras.ops.sum(out * keras.ops.sin(out))

        return harness.values_and_grads(
            fn, x, variables=layer.trainable_variables
        )

    got = run(ours, attention_mask=keys[:, None, :])
    want = run(theirs, attention_mask=full)
    assert seen == [3]
    assert len(got) == len(want) == 2 + len(ours.trainable_variables)
    for g, w in zip(got, want):
        # Relative too: the weights' gradients of this loss reach ~50.
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


def test_layer_window_fits_under_jit_and_round_trips(tmp_path):
    import keras

    from keras_attention.layers import MultiHeadAttention

    inputs = keras.Input((24, 8))
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, sliding_window=5, use_causal_mask=True,
        implementation="blocked",
    )
    model = keras.Model(inputs, layer(inputs))
    model.compile("sgd", "mse", jit_compile=True)
    x = np.random.default_rng(0).normal(size=(2, 24, 8)).astype("float32")
    model.fit(x, x, epochs=1, verbose=0)
    path = str(tmp_path / "window.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.layers[-1].sliding_window == 5
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


@pytest.mark.parametrize("window", [0, -1, 1.5, True])
def test_layer_rejects_a_bad_window(window):
    from keras_attention.layers import MultiHeadAttention

    with pytest.raises(ValueError, match="sliding_window"):
        MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=window)
