"""Fast paths against the simple path they replace.

- The dense core's own backward pass (`ops._dense_attention`) against
  autodiff through `masked_softmax` (`custom_gradient=False`) and
  against NumPy.
- The counter-based dropout (`ops.hash_dropout`) on shapes known only when
  the graph runs, and as the core's dropout on the attention weights.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from tests import harness
from tests.harness import random_mask

BACKEND = keras.backend.backend()
tensorflow_only = pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="tf.function with unknown shapes, or TensorFlow's XLA-on-CPU rules",
)


def keras_bfloat16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def _dense_outputs_and_grads(q, k, v, mask, causal, custom, jit):
    """The dense core's output and `(dq, dk, dv)` of a smooth loss on it,
    with its own backward (`custom`) or autodiff's, compiled by `jit`."""

    if jit and BACKEND == "torch":
        pytest.skip("torch has no XLA compile")

    def f(q, k, v):
        out = attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=causal,
            implementation="dense", custom_gradient=custom,
        )
        out32 = keras.ops.cast(out, "float32")
        return out, keras.ops.sum(out32 * keras.ops.cos(out32))

    return harness.values_and_grads(f, q, k, v, jit=jit)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
@pytest.mark.parametrize("jit", [False, True, "looped"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_dense_custom_gradient_equals_autodiff(monkeypatch, causal, mask_kind, jit, dtype):
    if jit == "looped":
        # Under XLA on a CPU, long sequences take `xla_cpu.keys_product`'s
        # loop for dV and dK: taken here at any length.
        from keras_attention.ops import xla_cpu

        monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)
        jit = True
    rng = np.random.default_rng(3)
    b, t, s, h, kv, d, dv = 2, 9, 11, 4, 2, 8, 6
    q = rng.normal(size=(b, t, h, d)).astype(dtype)
    k = rng.normal(size=(b, s, kv, d)).astype(dtype)
    v = rng.normal(size=(b, s, kv, dv)).astype(dtype)
    mask = random_mask(mask_kind, rng, b, t, s)

    def run(custom):
        return _dense_outputs_and_grads(q, k, v, mask, causal, custom, jit)

    simple, fast = run(False), run(True)
    atol = 1e-5 if dtype == "float32" else 2e-2
    for name, want, got in zip(["out", "dq", "dk", "dv"], simple, fast):
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(
            np.asarray(got, "float32"), np.asarray(want, "float32"),
            atol=atol, rtol=atol, err_msg=name,
        )


def test_dense_custom_gradient_against_numpy():
    """Values and dQ/dK/dV from the softmax-attention equations in NumPy."""
    rng = np.random.default_rng(4)
    b, t, s, h, d = 1, 5, 7, 2, 3
    q, k, v = (rng.normal(size=(b, n, h, d)) for n in (t, s, s))
    d_out = rng.normal(size=(b, t, h, d))
    scale = 0.7

    def f(q, k, v):
        out = attention_ops.dot_product_attention(q, k, v, scale=scale)
        return out, keras.ops.sum(keras.ops.multiply(out, d_out.astype("float32")))

    out, *grads = harness.values_and_grads(
        f, *(a.astype("float32") for a in (q, k, v))
    )

    qh, kh, vh, doh = (np.transpose(a, (0, 2, 1, 3)) for a in (q, k, v, d_out))
    scores = scale * qh @ np.swapaxes(kh, -1, -2)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ vh
    d_p = doh @ np.swapaxes(vh, -1, -2)
    # Softmax Jacobian: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik).
    d_s = p * (d_p - (p * d_p).sum(-1, keepdims=True))
    want = [o, scale * d_s @ kh, scale * np.swapaxes(d_s, -1, -2) @ qh,
            np.swapaxes(p, -1, -2) @ doh]
    got = [out] + grads
    for name, w, g in zip(["out", "dq", "dk", "dv"], want, got):
        np.testing.assert_allclose(
            g, np.transpose(w, (0, 2, 1, 3)), atol=1e-5, err_msg=name
        )


@tensorflow_only
def test_hash_dropout_dynamic_shape_equals_static():
    """Unknown dimensions at trace time give the mask of the static shape."""
    x = np.random.default_rng(6).normal(size=(3, 7, 5)).astype("float32")
    dynamic = tf.function(
        lambda t: attention_ops.hash_dropout(t, 0.4, 11),
        input_signature=[tf.TensorSpec((None, None, 5), tf.float32)],
    )(x)
    static = attention_ops.hash_dropout(tf.constant(x), 0.4, 11)
    np.testing.assert_array_equal(dynamic.numpy(), static.numpy())
    kept = static.numpy() != 0
    np.testing.assert_allclose(static.numpy()[kept], x[kept] / 0.6, rtol=1e-6)


def test_attention_dropout_keeps_its_share_and_rescales():
    """The core's weight dropout: about `1 - rate` kept, scaled by 1/(1-rate).

    The weights returned are those before dropout; one-hot values make the
    output show the dropped weights themselves.
    """
    rng = np.random.default_rng(8)
    q, k = (rng.normal(size=(4, 32, 2, 8)).astype("float32") for _ in range(2))
    # v[b, s, h] = e_s, so out[b, t, h, s] = dropped weight (b, h, t, s).
    v = np.broadcast_to(
        np.eye(32, dtype="float32")[None, :, None, :], (4, 32, 2, 32)
    ).copy()
    _, plain = attention_ops.dot_product_attention(q, k, v, return_weights=True)
    plain = harness.numpy(plain)
    generator = keras.random.SeedGenerator(2)

    def dropped_weights():
        out, weights = attention_ops.dot_product_attention(
            q, k, v, dropout_rate=0.25, seed=generator, training=True,
            return_weights=True,
        )
        np.testing.assert_allclose(harness.numpy(weights), plain, rtol=1e-6)
        return np.transpose(harness.numpy(out), (0, 2, 1, 3))

    dropped, again = dropped_weights(), dropped_weights()
    kept = dropped != 0
    assert 0.72 < kept.mean() < 0.78
    np.testing.assert_allclose(
        dropped[kept], plain[kept] / 0.75, rtol=1e-5
    )
    assert (again != dropped).any()  # a new mask per call


@tensorflow_only
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads", [2, 6])
def test_keys_product_loop_equals_einsum(monkeypatch, jit, dtype, heads):
    """`dV = P^T dO` / `dK = dS^T Q`: the per-(batch, head) loop that XLA on
    a CPU takes for long sequences equals the single product, with the
    batch known only when the function is traced; 2 heads make steps of
    2 pairs, 6 heads steps of 4 (18 pairs: the last step recomputes two)."""
    from keras_attention.ops import autotune
    from keras_attention.ops import xla_cpu

    monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)

    rng = np.random.default_rng(5)
    p = tf.constant(rng.normal(size=(3, heads, 7, 5)), dtype=dtype)
    x = tf.constant(rng.normal(size=(3, heads, 7, 4)), dtype=dtype)
    seen = []

    @tf.function(
        jit_compile=jit,
        input_signature=[
            tf.TensorSpec((None, heads, 7, 5), dtype),
            tf.TensorSpec((None, heads, 7, 4), dtype),
        ],
    )
    def product(p, x):
        seen.append(autotune.xla_on_cpu())
        return xla_cpu.keys_product(p, x)

    got = product(p, x)
    want = tf.einsum("bhts,bhtd->bhsd", p, x)
    assert seen == [jit and not tf.config.list_logical_devices("GPU")]
    assert got.shape == want.shape and got.dtype == want.dtype
    atol = 1e-5 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(
        np.asarray(tf.cast(got, "float32")), np.asarray(tf.cast(want, "float32")),
        atol=atol, rtol=atol,
    )


@tensorflow_only
@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(mask_kind="keys", causal=True),
        dict(mask_kind="full", window=5),
        dict(kv_heads=1, alibi=True),
    ],
    ids=["plain", "keys-causal", "full-window", "gqa-alibi"],
)
def test_blocked_core_compiled_by_xla_equals_the_graph_one(monkeypatch, case):
    """In a plain `tf.function` on a CPU the blocked core runs as its own
    XLA computation: the same values and gradients as the graph's own
    blocked core, with the batch known only when the graph runs, and the
    rule recorded in `dispatch_choices()`."""
    from keras_attention.ops import xla_cpu

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("the rule is for CPUs")
    monkeypatch.setattr(xla_cpu, "_COMPILED_BLOCKED_SIZE", 1)
    rng = np.random.default_rng(7)
    b, t, h, d = 3, 40, 4, 8
    kv = case.get("kv_heads", h)
    q = tf.constant(rng.normal(size=(b, t, h, d)), "float32")
    k = tf.constant(rng.normal(size=(b, t, kv, d)), "float32")
    v = tf.constant(rng.normal(size=(b, t, kv, d)), "float32")
    mask = random_mask(case.get("mask_kind"), rng, b, t, t)
    slopes = (
        tf.constant(rng.uniform(0.1, 1.0, size=(h,)), "float32")
        if case.get("alibi") else None
    )
    extra = dict(
        is_causal=case.get("causal", False),
        sliding_window=case.get("window"),
        alibi_slopes=slopes,
    )

    def run():
        spec = [tf.TensorSpec((None,) + tuple(x.shape[1:]), "float32")
                for x in (q, k, v)]

        @tf.function(input_signature=spec)
        def step(q, k, v):
            m = None if mask is None else tf.constant(mask)[: tf.shape(q)[0]]
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = attention_ops.dot_product_attention(
                    q, k, v, attention_mask=m, implementation="blocked",
                    block_size=16, **extra,
                )
                loss = tf.reduce_sum(out * tf.cos(out))
            return [out] + tape.gradient(loss, [q, k, v])

        return [np.asarray(x) for x in step(q, k, v)]

    attention_ops.clear_dispatch_choices()
    compiled = run()
    rules = [c for c in attention_ops.dispatch_choices()
             if c.implementation == "blocked, compiled by XLA"]
    assert len(rules) == 1
    monkeypatch.setattr(xla_cpu, "compiles_blocked_core", lambda *inputs: False)
    graph = run()
    for name, got, want in zip(("out", "dq", "dk", "dv"), compiled, graph):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=name)


@tensorflow_only
def test_blocked_core_compiled_only_outside_xla_on_tensorflow():
    from keras_attention.ops import xla_cpu

    seen = {}

    @tf.function(jit_compile=True)
    def in_xla():
        seen["xla"] = xla_cpu.compiles_blocked_core()
        return tf.zeros(())

    @tf.function
    def in_graph():
        seen["graph"] = xla_cpu.compiles_blocked_core()
        return tf.zeros(())

    in_xla(), in_graph()
    cpu = not tf.config.list_logical_devices("GPU")
    assert seen == {"xla": False, "graph": cpu}
    assert xla_cpu.compiles_blocked_core() == cpu  # eager
    # Short blocked calls stay in the graph (XLA's compilation would cost
    # more than the loop): from `_COMPILED_BLOCKED_SIZE` scores per pair.
    short = tf.zeros((1, 40, 2, 8))
    long = tf.zeros((1, 1024, 2, 8))
    assert not xla_cpu.compiles_blocked_core(short, short, short)
    assert xla_cpu.compiles_blocked_core(long, long, long) == cpu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "keys"])
@pytest.mark.parametrize("jit", [False, True])
def test_dense_custom_gradient_bfloat16_against_float32(causal, mask_kind, jit):
    """bfloat16 heads keep their scores, weights and `dS` in bfloat16 (and
    `dP - delta` is one bfloat16 product): the values and gradients stay
    within bfloat16's rounding of autodiff's float32 path on the same
    inputs."""
    rng = np.random.default_rng(6)
    b, t, s, h, kv, d = 2, 16, 24, 4, 2, 8
    inputs = [
        rng.normal(size=shape).astype("float32").astype(keras_bfloat16())
        for shape in ((b, t, h, d), (b, s, kv, d), (b, s, kv, d))
    ]
    mask = random_mask(mask_kind, rng, b, t, s)
    low = _dense_outputs_and_grads(*inputs, mask, causal, True, jit)
    # The reference: autodiff through the float32 dense path.
    high = _dense_outputs_and_grads(
        *[x.astype("float32") for x in inputs], mask, causal, False, jit
    )
    for name, got, want in zip(["out", "dq", "dk", "dv"], low, high):
        assert got.dtype == keras_bfloat16(), name
        got, want = got.astype("float32"), np.asarray(want)
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= 0.03 * scale, name
