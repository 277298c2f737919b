"""The forms `ops/xla_cpu.py` takes under XLA on a CPU against the simple ones.

- `unnormalised_attention` (the dense core with the softmax's division
  deferred to the output) against autodiff through `masked_softmax`, in
  values and gradients, under XLA and in a `tf.function`, with the batch
  known only when the function runs;
- `projection` (an `EinsumDense` as one 2-D matmul) against the sublayer's
  own call, alone and inside `MultiHeadAttention`, in values and every
  gradient (inputs, kernels, biases, LoRA's factors);
- both recorded in `dispatch_choices()` when taken, and not taken outside
  XLA or in float16;
- `scores_product` against keras's einsum, and its compiled program
  without the `(B, H, D, S)` transpose of the keys.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attention import ops as attention_ops
from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import xla_cpu
from keras_attention.ops.masks import expand_mask
from tests.test_fast_paths import _mask

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "tensorflow",
        reason="TensorFlow's XLA-on-CPU forms, checked with tapes and "
        "tf.function",
    ),
    pytest.mark.skipif(
        bool(tf.config.list_logical_devices("GPU")), reason="XLA on a CPU only"
    ),
]


def _choices(implementation):
    return [c for c in attention_ops.dispatch_choices()
            if c.implementation == implementation]


@pytest.mark.parametrize("mask_kind", [None, "keys", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("jit", [True, False])
def test_unnormalised_core_equals_autodiff(monkeypatch, mask_kind, causal, jit):
    monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)  # the loop too
    rng = np.random.default_rng(11)
    b, t, s, h, kv, d, dv = 3, 9, 11, 4, 2, 8, 6
    q = tf.constant(rng.normal(size=(b, t, h, d)), "float32")
    k = tf.constant(rng.normal(size=(b, s, kv, d)), "float32")
    v = tf.constant(rng.normal(size=(b, s, kv, dv)), "float32")
    mask = _mask(mask_kind, rng, b, t, s)
    attention_ops.clear_dispatch_choices()

    def grads(q, k, v, custom):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, is_causal=causal,
                implementation="dense", custom_gradient=custom,
            )
            loss = tf.reduce_sum(out * tf.cos(out))
        return [out] + tape.gradient(loss, [q, k, v])

    spec = [tf.TensorSpec((None,) + tuple(x.shape[1:]), "float32")
            for x in (q, k, v)]
    # The simple path: autodiff through masked_softmax, graph mode.
    want = tf.function(lambda q, k, v: grads(q, k, v, False))(q, k, v)
    if jit:
        # Under XLA on a CPU the dense core takes the unnormalised form.
        got = tf.function(
            lambda q, k, v: grads(q, k, v, True), jit_compile=True,
            input_signature=spec,
        )(q, k, v)
        assert _choices("unnormalised weights")
    else:
        # The same function called directly, in a tf.function graph.
        def direct(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                heads = q.shape[2]
                qt = tf.transpose(q, (0, 2, 1, 3)) / np.sqrt(d)
                kt = tf.repeat(tf.transpose(k, (0, 2, 1, 3)), heads // kv, 1)
                vt = tf.repeat(tf.transpose(v, (0, 2, 1, 3)), heads // kv, 1)
                full = None if mask is None else expand_mask(mask)
                if causal:
                    tri = np.tril(np.ones((t, s), bool))
                    full = tri if full is None else tf.logical_and(full, tri)
                out = tf.transpose(
                    xla_cpu.unnormalised_attention(qt, kt, vt, full), (0, 2, 1, 3)
                )
                loss = tf.reduce_sum(out * tf.cos(out))
            return [out] + tape.gradient(loss, [q, k, v])

        got = tf.function(direct, input_signature=spec)(q, k, v)
    for name, w, g in zip(["out", "dq", "dk", "dv"], want, got):
        np.testing.assert_allclose(
            g.numpy(), w.numpy(), atol=2e-5, rtol=2e-5, err_msg=name
        )


def test_unnormalised_core_not_taken_in_float16_or_graph_mode():
    q = tf.ones((1, 4, 2, 8), "float16")
    attention_ops.clear_dispatch_choices()
    tf.function(lambda q: attention_ops.dot_product_attention(
        q, q, q, implementation="dense"), jit_compile=True)(q)
    q32 = tf.cast(q, "float32")
    tf.function(lambda q: attention_ops.dot_product_attention(
        q, q, q, implementation="dense"))(q32)
    assert not _choices("unnormalised weights")


def _heads_of(x2d, bias, length, heads):
    """`(B, H, S, D)` heads of a projection's `(B * S, H * D)` output."""
    return tf.transpose(
        tf.reshape(x2d + bias, (-1, length, heads, bias.shape[0] // heads)),
        (0, 2, 1, 3),
    )


@pytest.mark.parametrize("jit", [True, False])
def test_scores_product_equals_einsum(jit):
    rng = np.random.default_rng(5)
    q = tf.constant(rng.normal(size=(2, 3, 5, 4)), "float32")
    x = tf.constant(rng.normal(size=(2 * 7, 12)), "float32")
    bias = tf.constant(rng.normal(size=(12,)), "float32")

    def run(product):
        def f(q, x):
            with tf.GradientTape() as tape:
                tape.watch([q, x])
                s = product(q, _heads_of(x, bias, 7, 3))
                loss = tf.reduce_sum(s * tf.sin(s))
            return [s] + tape.gradient(loss, [q, x])

        spec = [tf.TensorSpec((None, 3, 5, 4)), tf.TensorSpec((None, 12))]
        return tf.function(f, jit_compile=jit, input_signature=spec)(q, x)

    want = run(lambda a, b: keras.ops.einsum("bhtd,bhsd->bhts", a, b))
    attention_ops.clear_dispatch_choices()
    got = run(xla_cpu.scores_product)
    assert bool(_choices("TensorFlow's einsum")) == jit
    for w, g in zip(want, got):
        np.testing.assert_allclose(g.numpy(), w.numpy(), atol=1e-5, rtol=1e-5)


def test_scores_product_keeps_the_keys_in_place():
    # The keys of a projection, `(B, S, H, D)` transposed to heads: XLA's
    # dot reads them where they lie, with no `(B, H, D, S)` copy (keras's
    # TensorFlow einsum, a `matmul(..., transpose_b=True)`, made one).
    q = tf.ones((2, 2, 16, 4))
    x = tf.ones((2 * 16, 8))
    bias = tf.ones((8,))
    hlo = tf.function(
        lambda: xla_cpu.scores_product(q, _heads_of(x, bias, 16, 2)),
        jit_compile=True,
    ).experimental_get_compiler_ir()(stage="optimized_hlo")
    assert " dot(" in hlo
    assert "f32[2,2,4,16]" not in hlo, hlo


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
    x = tf.constant(rng.normal(size=in_shape), "float32")
    attention_ops.clear_dispatch_choices()

    def run(use_projection):
        def f(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = xla_cpu.projection(dense, x) if use_projection else dense(x)
                loss = tf.reduce_sum(y * tf.sin(y))
            return [y] + tape.gradient(loss, [x] + dense.trainable_weights)

        spec = [tf.TensorSpec((None,) + in_shape[1:], "float32")]
        return tf.function(f, jit_compile=jit, input_signature=spec)(x)

    want, got = run(False), run(True)
    assert bool(_choices("flat matmul")) == jit
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.shape == g.shape
        np.testing.assert_allclose(g.numpy(), w.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("use_bias", [True, False])
def test_layer_with_flat_projections_equals_sublayer_calls(monkeypatch, lora,
                                                           use_bias):
    """`MultiHeadAttention` under XLA, projections flat (the default there)
    against the same layer traced with the sublayers' own calls."""
    rng = np.random.default_rng(4)
    layer = MultiHeadAttention(4, 8, use_bias=use_bias)
    x = tf.constant(rng.normal(size=(3, 10, 16)), "float32")
    y = tf.constant(rng.normal(size=(3, 7, 16)), "float32")
    layer(x, y)
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.3)
    if lora:
        layer.enable_lora(2)
        for w in layer.trainable_weights:
            w.assign(rng.normal(size=w.shape).astype("float32") * 0.3)

    def step(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            out = layer(x, y, use_causal_mask=True)
            loss = tf.reduce_sum(out * tf.cos(out))
        return [out] + tape.gradient(loss, [x, y] + layer.trainable_weights)

    spec = [tf.TensorSpec((None, 10, 16), "float32"),
            tf.TensorSpec((None, 7, 16), "float32")]
    attention_ops.clear_dispatch_choices()
    got = tf.function(step, jit_compile=True, input_signature=spec)(x, y)
    assert _choices("flat matmul")
    monkeypatch.setattr(xla_cpu, "_can_flatten", lambda dense, x: False)
    want = tf.function(step, jit_compile=True, input_signature=spec)(x, y)
    graph = tf.function(step, input_signature=spec)(x, y)
    for w, g, r in zip(want, got, graph):
        np.testing.assert_allclose(g.numpy(), w.numpy(), atol=2e-5, rtol=2e-5)
        np.testing.assert_allclose(g.numpy(), r.numpy(), atol=2e-5, rtol=2e-5)


def test_flat_projection_not_taken_in_mixed_precision():
    dense = _dense("abc,cde->abde", (None, 2, 3), "de")
    dense.build((1, 4, 5))
    x = tf.ones((1, 4, 5), "float16")
    assert not xla_cpu._can_flatten(dense, x)
    mixed = keras.layers.EinsumDense(
        "abc,cde->abde", output_shape=(None, 2, 3), dtype="mixed_float16"
    )
    mixed.build((1, 4, 5))
    assert not xla_cpu._can_flatten(mixed, x)
    assert not xla_cpu._can_flatten(mixed, tf.ones((1, 4, 5)))


def test_backward_pair_by_pair_equals_autodiff(monkeypatch):
    # 3 x 6 = 18 pairs, a step each; the batch known only when it runs.
    monkeypatch.setattr(xla_cpu, "_GROUPED_PRODUCT_SIZE", 0)
    rng = np.random.default_rng(4)
    q, k, v = (tf.constant(rng.normal(size=(3, 6, n, d)), "float32")
               for n, d in ((7, 4), (5, 4), (5, 3)))
    mask = tf.constant(rng.random((3, 1, 7, 5)) > 0.3)
    attention_ops.clear_dispatch_choices()

    def grads(core):
        def run(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = core(q, k, v)
                loss = tf.reduce_sum(out * tf.cos(out))
            return [out] + tape.gradient(loss, [q, k, v])

        spec = [tf.TensorSpec((None,) + tuple(x.shape[1:])) for x in (q, k, v)]
        return tf.function(run, jit_compile=True, input_signature=spec)(q, k, v)

    got = grads(lambda q, k, v: xla_cpu.unnormalised_attention(q, k, v, mask))
    assert [c.key[0] for c in _choices("loop over (batch, head) pairs")] == [
        "dense core backward"]

    def simple(q, k, v):
        scores = tf.where(mask, tf.einsum("bhtd,bhsd->bhts", q, k), -1e9)
        return tf.einsum("bhts,bhsd->bhtd", tf.nn.softmax(scores), v)

    want = grads(simple)
    for name, w, g in zip(["out", "dq", "dk", "dv"], want, got):
        np.testing.assert_allclose(g.numpy(), w.numpy(), atol=2e-5, rtol=2e-5,
                                   err_msg=name)
