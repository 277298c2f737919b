"""The forms `ops/xla_cpu.py` takes under XLA on a CPU against the simple ones.

On TensorFlow inside `jit_compile=True`, on JAX always (on a CPU):

- `unnormalised_attention` (the dense core with the softmax's division
  deferred to the output) against autodiff through `masked_softmax`, in
  values and gradients, compiled and not (on TensorFlow in a `tf.function`
  with the batch known only when it runs); pair by pair (the backward, and
  on JAX the forward) for batch 1, one head, `T != S` and masks of every
  rank;
- `keys_product`'s loop over `(batch, head)` pairs, a step per pair or a
  few pairs a step, in float32, float16 and bfloat16;
- `projection` (an `EinsumDense` as one 2-D matmul) against the sublayer's
  own call, alone and inside `MultiHeadAttention`, in values and every
  gradient (inputs, kernels, biases, LoRA's factors);
- each recorded in `dispatch_choices()` when taken, and not taken outside
  XLA (TensorFlow) or in float16;
- `scores_product` against keras's einsum, and TensorFlow's compiled
  program without the `(B, H, D, S)` transpose of the keys.

The size thresholds are monkeypatched small, so tiny shapes take the loops.
"""

import keras
import numpy as np
import pytest

from keras_attention import ops as attention_ops
from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import xla_cpu
from keras_attention.ops.masks import expand_mask
from tests import harness
from tests.harness import random_mask

BACKEND = keras.backend.backend()


def _on_a_cpu():
    if BACKEND == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_logical_devices("GPU")
    return False


pytestmark = pytest.mark.skipif(
    BACKEND not in ("tensorflow", "jax") or not _on_a_cpu(),
    reason="XLA on a CPU only (TensorFlow or JAX)",
)
tensorflow_only = pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="TensorFlow machinery (tf.function with unknown shapes, HLO text, "
    "graph mode outside XLA)",
)
jax_only = pytest.mark.skipif(
    BACKEND != "jax",
    reason="JAX's branches (TensorFlow's loops are the tests above)",
)


def _choices(implementation):
    return [c for c in attention_ops.dispatch_choices()
            if c.implementation == implementation]


def _xla(jit):
    """Whether the fast forms are taken: always on JAX's CPU."""
    return jit or BACKEND == "jax"


def _values_and_grads(fn, *inputs, variables=(), jit=False):
    """`harness.values_and_grads`; on TensorFlow in a `tf.function` (XLA's
    with `jit`, graph mode without) with the batch known only when it runs."""
    if BACKEND != "tensorflow":
        return harness.values_and_grads(fn, *inputs, variables=variables, jit=jit)
    import tensorflow as tf

    variables = list(variables)

    def run(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            outputs, loss = fn(*xs)
        return outputs, tape.gradient(loss, list(xs) + variables)

    spec = [tf.TensorSpec((None,) + tuple(x.shape[1:]), str(x.dtype))
            for x in inputs]
    outputs, grads = tf.function(run, jit_compile=jit, input_signature=spec)(
        *[tf.constant(x) for x in inputs])
    return [harness.numpy(x) for x in harness.to_list(outputs) + list(grads)]


def _assert_close(got, want, tol, names=None):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        name = names[i] if names else str(i)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        np.testing.assert_allclose(np.asarray(g, "float32"), np.asarray(w, "float32"),
                                   atol=tol, rtol=tol, err_msg=name)


def _smooth(out):
    out32 = keras.ops.cast(out, "float32")
    return out, keras.ops.sum(out32 * keras.ops.cos(out32))


@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("jit", [True, False])
def test_unnormalised_core_equals_autodiff(monkeypatch, mask_kind, causal, jit):
    monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)  # the loop too
    rng = np.random.default_rng(11)
    b, t, s, h, kv, d, dv = 3, 9, 11, 4, 2, 8, 6
    q = rng.normal(size=(b, t, h, d)).astype("float32")
    k = rng.normal(size=(b, s, kv, d)).astype("float32")
    v = rng.normal(size=(b, s, kv, dv)).astype("float32")
    mask = random_mask(mask_kind, rng, b, t, s)

    def core(custom):
        def fn(q, k, v):
            return _smooth(attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, is_causal=causal,
                implementation="dense", custom_gradient=custom,
            ))
        return fn

    # The simple path: autodiff through masked_softmax (graph mode on TF).
    want = _values_and_grads(core(False), q, k, v)
    attention_ops.clear_dispatch_choices()
    if jit:
        # Under XLA on a CPU the dense core takes the unnormalised form.
        got = _values_and_grads(core(True), q, k, v, jit=True)
        assert _choices("unnormalised weights")
    else:
        # The function called directly (on TF in a tf.function graph).
        def direct(q, k, v):
            ops = keras.ops
            qt = ops.transpose(q, (0, 2, 1, 3)) / np.sqrt(d).astype("float32")
            kt = ops.repeat(ops.transpose(k, (0, 2, 1, 3)), h // kv, 1)
            vt = ops.repeat(ops.transpose(v, (0, 2, 1, 3)), h // kv, 1)
            full = None if mask is None else expand_mask(mask)
            if causal:
                tri = np.tril(np.ones((t, s), bool))
                full = tri if full is None else ops.logical_and(full, tri)
            return _smooth(ops.transpose(
                xla_cpu.unnormalised_attention(qt, kt, vt, full), (0, 2, 1, 3)))

        got = _values_and_grads(direct, q, k, v)
    assert bool(_choices("loop over (batch, head) pairs")) == _xla(jit)
    _assert_close(got, want, 2e-5, ["out", "dq", "dk", "dv"])


@tensorflow_only
def test_unnormalised_core_not_taken_in_float16_or_graph_mode():
    import tensorflow as tf

    q = tf.ones((1, 4, 2, 8), "float16")
    attention_ops.clear_dispatch_choices()
    tf.function(lambda q: attention_ops.dot_product_attention(
        q, q, q, implementation="dense"), jit_compile=True)(q)
    q32 = tf.cast(q, "float32")
    tf.function(lambda q: attention_ops.dot_product_attention(
        q, q, q, implementation="dense"))(q32)
    assert not _choices("unnormalised weights")


@jax_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unnormalised_core_not_taken_in_low_precision_on_jax(monkeypatch, dtype):
    # The dense core's own backward then, with `keys_product`'s loop.
    monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, n, 1, 4)).astype("float32") for n in (3, 5, 5))
    mask = rng.random((1, 3, 5)) > 0.3

    def core(custom):
        def fn(q, k, v):
            q, k, v = (keras.ops.cast(x, dtype) for x in (q, k, v))
            return _smooth(attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, implementation="dense",
                custom_gradient=custom))
        return fn

    attention_ops.clear_dispatch_choices()
    got = harness.values_and_grads(core(True), q, k, v, jit=True)
    assert not _choices("unnormalised weights")
    assert {c.key[0] for c in _choices("loop over (batch, head) pairs")} == {
        "keys product"}  # dV = P^T dO and dK = dS^T Q
    want = harness.values_and_grads(core(False), q, k, v, jit=True)
    _assert_close(got, want, 3e-2)


def _heads_of(x2d, bias, length, heads):
    """`(B, H, S, D)` heads of a projection's `(B * S, H * D)` output."""
    return keras.ops.transpose(
        keras.ops.reshape(x2d + bias, (-1, length, heads, bias.shape[0] // heads)),
        (0, 2, 1, 3),
    )


@pytest.mark.parametrize("jit", [True, False])
def test_scores_product_equals_einsum(jit):
    rng = np.random.default_rng(5)
    q = rng.normal(size=(2, 3, 5, 4)).astype("float32")
    x = rng.normal(size=(2 * 7, 12)).astype("float32")
    bias = rng.normal(size=(12,)).astype("float32")

    def run(product):
        def fn(q, x):
            s = product(q, _heads_of(x, bias, 7, 3))
            return s, keras.ops.sum(s * keras.ops.sin(s))

        return _values_and_grads(fn, q, x, jit=jit)

    want = run(lambda a, b: keras.ops.einsum("bhtd,bhsd->bhts", a, b))
    attention_ops.clear_dispatch_choices()
    got = run(xla_cpu.scores_product)
    # JAX's einsum is that dot already: nothing to choose there.
    assert bool(_choices("TensorFlow's einsum")) == (jit and BACKEND == "tensorflow")
    _assert_close(got, want, 1e-5)


@tensorflow_only
def test_scores_product_keeps_the_keys_in_place():
    # The keys of a projection, `(B, S, H, D)` transposed to heads: XLA's
    # dot reads them where they lie, with no `(B, H, D, S)` copy (keras's
    # TensorFlow einsum, a `matmul(..., transpose_b=True)`, made one).
    import tensorflow as tf

    q = tf.ones((2, 2, 16, 4))
    x = tf.ones((2 * 16, 8))
    bias = tf.ones((8,))
    hlo = tf.function(
        lambda: xla_cpu.scores_product(q, _heads_of(x, bias, 16, 2)),
        jit_compile=True,
    ).experimental_get_compiler_ir()(stage="optimized_hlo")
    assert " dot(" in hlo
    assert "f32[2,2,4,16]" not in hlo, hlo


@jax_only
@pytest.mark.parametrize("shape", [(1, 1, 3, 5, 2), (3, 3, 6, 1, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("per_step", [1, 2])
def test_keys_product_loop_equals_einsum_on_jax(monkeypatch, shape, dtype, per_step):
    # A pair a step, or `per_step` (never more than the heads; the last
    # step recomputes a few pairs to end at the last one).
    monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)
    monkeypatch.setattr(xla_cpu, "_PAIRS_PER_STEP", per_step)
    b, h, t, s, d = shape
    rng = np.random.default_rng(8)
    p = rng.normal(size=(b, h, t, s)).astype("float32")
    x = rng.normal(size=(b, h, t, d)).astype("float32")

    def run(product):
        def fn(p, x):
            y = product(keras.ops.cast(p, dtype), keras.ops.cast(x, dtype))
            assert keras.backend.standardize_dtype(y.dtype) == dtype
            return _smooth(y)

        return harness.values_and_grads(fn, p, x, jit=True)

    attention_ops.clear_dispatch_choices()
    got = run(xla_cpu.keys_product)
    assert [c.key[0] for c in _choices("loop over (batch, head) pairs")] == [
        "keys product"]
    want = run(lambda p, x: keras.ops.einsum("bhts,bhtd->bhsd", p, x))
    # Low precision: to its rounding of the largest value (the loop's
    # gradient adds in another order).
    for g, w in zip(got, want):
        harness.tolerance_close(g, w, 1e-5 if dtype == "float32" else 5e-2, dtype)


def _dense(equation, output_shape, bias_axes, activation=None):
    return keras.layers.EinsumDense(
        equation, output_shape=output_shape, bias_axes=bias_axes,
        activation=activation,
    )


@pytest.mark.parametrize(
    "equation, output_shape, bias_axes, in_shape",
    [
        ("abc,cde->abde", (None, 4, 5), "de", (2, 7, 6)),   # query/key/value
        ("abcd,cde->abe", (None, 6), "e", (2, 7, 4, 5)),     # output
        ("abc,cde->abde", (None, 4, 5), "e", (2, 7, 6)),     # partial bias
        ("abc,cde->abde", (None, 4, 5), None, (2, 7, 6)),    # no bias
        ("abcd,de->abce", (None, None, 3), "e", (2, 3, 5, 4)),  # 2-D image rows
    ],
)
@pytest.mark.parametrize("jit", [True, False])
def test_flat_projection_equals_einsum_dense(equation, output_shape, bias_axes,
                                             in_shape, jit):
    rng = np.random.default_rng(2)
    dense = _dense(equation, output_shape, bias_axes, activation="tanh")
    dense.build(in_shape)
    for w in dense.weights:  # non-zero biases
        w.assign(rng.normal(size=w.shape).astype("float32"))
    x = rng.normal(size=in_shape).astype("float32")
    attention_ops.clear_dispatch_choices()

    def run(use_projection):
        def fn(x):
            y = xla_cpu.projection(dense, x) if use_projection else dense(x)
            return y, keras.ops.sum(y * keras.ops.sin(y))

        return _values_and_grads(fn, x, variables=dense.trainable_weights, jit=jit)

    want, got = run(False), run(True)
    assert bool(_choices("flat matmul")) == _xla(jit)
    assert len(want) == 1 + 1 + len(dense.trainable_weights)
    _assert_close(got, want, 1e-5)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("use_bias", [True, False])
def test_layer_with_flat_projections_equals_sublayer_calls(monkeypatch, lora,
                                                           use_bias):
    """`MultiHeadAttention` under XLA, projections flat (the default there)
    against the same layer traced with the sublayers' own calls."""
    rng = np.random.default_rng(4)
    layer = MultiHeadAttention(4, 8, use_bias=use_bias)
    x = rng.normal(size=(3, 10, 16)).astype("float32")
    y = rng.normal(size=(3, 7, 16)).astype("float32")
    layer(x, y)
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.3)
    if lora:
        layer.enable_lora(2)
        for w in layer.trainable_weights:
            w.assign(rng.normal(size=w.shape).astype("float32") * 0.3)

    def step(x, y):
        out = layer(x, y, use_causal_mask=True)
        return out, keras.ops.sum(out * keras.ops.cos(out))

    variables = layer.trainable_weights
    attention_ops.clear_dispatch_choices()
    got = _values_and_grads(step, x, y, variables=variables, jit=True)
    assert _choices("flat matmul")
    monkeypatch.setattr(xla_cpu, "_can_flatten", lambda dense, x: False)
    want = _values_and_grads(step, x, y, variables=variables, jit=True)
    graph = _values_and_grads(step, x, y, variables=variables)
    assert len(got) == 1 + 2 + len(variables)
    # Whole-layer gradients reach ~20; their sums run in other orders.
    _assert_close(got, want, 5e-5)
    _assert_close(got, graph, 5e-5)


def test_flat_projection_not_taken_in_mixed_precision():
    dense = _dense("abc,cde->abde", (None, 2, 3), "de")
    dense.build((1, 4, 5))
    x = keras.ops.ones((1, 4, 5), "float16")
    assert not xla_cpu._can_flatten(dense, x)
    mixed = keras.layers.EinsumDense(
        "abc,cde->abde", output_shape=(None, 2, 3), dtype="mixed_float16"
    )
    mixed.build((1, 4, 5))
    assert not xla_cpu._can_flatten(mixed, x)
    assert not xla_cpu._can_flatten(mixed, keras.ops.ones((1, 4, 5)))


def _simple_core(mask):
    def core(q, k, v):
        ops = keras.ops
        scores = ops.einsum("bhtd,bhsd->bhts", q, k)
        if mask is not None:
            scores = ops.where(mask, scores, -1e9)
        weights = ops.softmax(scores, axis=-1)
        if mask is not None:  # a query with no key: zeros
            seen = ops.any(ops.broadcast_to(mask, scores.shape), -1, keepdims=True)
            weights = ops.where(seen, weights, 0.0)
        return _smooth(ops.einsum("bhts,bhsd->bhtd", weights, v))
    return core


def test_backward_pair_by_pair_equals_autodiff(monkeypatch):
    # 3 x 6 = 18 pairs, a step each; on TF the batch known only when it runs.
    monkeypatch.setattr(xla_cpu, "_GROUPED_PRODUCT_SIZE", 0)
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(3, 6, n, d)).astype("float32")
               for n, d in ((7, 4), (5, 4), (5, 3)))
    mask = rng.random((3, 1, 7, 5)) > 0.3
    attention_ops.clear_dispatch_choices()

    got = _values_and_grads(
        lambda q, k, v: _smooth(xla_cpu.unnormalised_attention(q, k, v, mask)),
        q, k, v, jit=True)
    # On JAX the forward runs pair by pair too.
    assert [c.key[0] for c in _choices("loop over (batch, head) pairs")] == (
        ["dense core forward"] if BACKEND == "jax" else []) + ["dense core backward"]
    want = _values_and_grads(_simple_core(mask), q, k, v, jit=True)
    _assert_close(got, want, 2e-5, ["out", "dq", "dk", "dv"])


@jax_only
@pytest.mark.parametrize("shape", [(1, 1, 3, 5), (3, 2, 5, 2)])
@pytest.mark.parametrize("mask_shape", [
    None, "ts", "hts", "b1ts", "bhts", "b11s", "11t1",
])
def test_jax_pairs_equal_autodiff_for_every_mask(monkeypatch, shape, mask_shape):
    # Batch 1 and one head, T != S, masks of every rank that broadcasts to
    # the scores (a query or a key with nothing to see among them); the
    # forward and the backward pair by pair (the keys products looped
    # whole: `test_unnormalised_core_equals_autodiff`).
    in_pairs = True
    monkeypatch.setattr(xla_cpu, "_GROUPED_PRODUCT_SIZE", 0)
    b, h, t, s = shape
    rng = np.random.default_rng(6)
    mask = None
    if mask_shape is not None:
        sizes = {"b": b, "h": h, "t": t, "s": s, "1": 1}
        mask = rng.random(tuple(sizes[c] for c in mask_shape)) > 0.3
        mask[..., 0] = False
    q, k, v = (rng.normal(size=(b, h, n, d)).astype("float32")
               for n, d in ((t, 4), (s, 4), (s, 3)))
    attention_ops.clear_dispatch_choices()
    got = harness.values_and_grads(
        lambda q, k, v: _smooth(xla_cpu.unnormalised_attention(q, k, v, mask)),
        q, k, v, jit=True)
    loops = {c.key[0] for c in _choices("loop over (batch, head) pairs")}
    assert loops == ({"dense core backward", "dense core forward"} if in_pairs
                     else {"keys product"}), loops
    want = harness.values_and_grads(_simple_core(mask), q, k, v, jit=True)
    _assert_close(got, want, 2e-5, ["out", "dq", "dk", "dv"])
