"""`ops.gradients.custom_gradient`: the attention cores' own backward pass
without TensorFlow's registry entry per trace.

In a `tf.function`, `tf.custom_gradient` registered every traced call's
gradient in TensorFlow's process-wide registry, which held each traced
graph for good: 200 traces of our layer at new lengths kept 200 entries
and 217 graphs after the function and the layer were dropped (Keras's
own layer: none). The gradient now lives on its op; both ways TensorFlow
differentiates a graph take it.
"""

import gc

import keras
import numpy as np
import pytest

from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import dispatch

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow's registry"
)


def test_traces_leave_no_registry_entries_and_no_graphs():
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.framework.func_graph import FuncGraph

    registry = tf_ops._gradient_registry._registry
    layer = MultiHeadAttention(num_heads=2, key_dim=8)
    layer(np.zeros((1, 3, 16), "float32"))
    before = len(registry)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(layer(x, x) ** 2)
        return tape.gradient(y, x)

    for length in range(2, 12):
        step(tf.random.normal((2, length, 16)))
    assert len(registry) == before
    del step
    gc.collect()
    assert not [g for g in gc.get_objects()
                if isinstance(g, FuncGraph) and "step" in g.name]


@pytest.mark.parametrize("where", ["tape inside", "tape outside"])
def test_the_cores_gradients_equal_autodiff_both_ways(where, monkeypatch):
    # Inside a tf.function a GradientTape reads the tape record; a tape
    # around the call of a tf.function differentiates its graph, which
    # reads the gradient set on the op. (IdentityN's own gradient would
    # give the same numbers through autodiff: the core's backward is
    # counted.)
    from keras_attention.ops import dense

    calls = []
    backward = dense._backward
    monkeypatch.setattr(dense, "_backward", lambda *a: calls.append(1) or backward(*a))
    rng = np.random.default_rng(0)
    q, k, v = (tf.constant(rng.normal(size=(2, 2, 7, 4)), "float32") for _ in range(3))

    def loss(q, k, v, custom):
        out = dispatch.dot_product_attention(
            q, k, v, is_causal=True, custom_gradient=custom, implementation="dense"
        )
        return tf.reduce_sum(out * tf.cos(out))

    def gradients(custom):
        if where == "tape inside":
            @tf.function
            def step(q, k, v):
                with tf.GradientTape() as tape:
                    tape.watch([q, k, v])
                    value = loss(q, k, v, custom)
                return tape.gradient(value, [q, k, v])

            return step(q, k, v)
        forward = tf.function(lambda q, k, v: loss(q, k, v, custom))
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            value = forward(q, k, v)
        return tape.gradient(value, [q, k, v])

    ours = gradients(True)
    assert calls, "the core's own backward pass was not taken"
    for ours, autodiff in zip(ours, gradients(False)):
        np.testing.assert_allclose(ours.numpy(), autodiff.numpy(), atol=1e-5)


def test_forward_mode_inside_a_function_equals_eager():
    # A forward accumulator computes a new op's JVP while the op is made,
    # through a function call that entered the graph's gradient override a
    # second time: an AssertionError from TensorFlow, in a tf.function
    # only (eagerly the core is Keras's custom gradient).
    x = tf.constant(np.random.default_rng(1).normal(size=(2, 5, 8)), "float32")
    tangent = tf.ones_like(x)
    layer = MultiHeadAttention(2, 4, use_causal_mask=True)
    layer(x)

    def jvp(x, tangent):
        with tf.autodiff.ForwardAccumulator(x, tangent) as accumulator:
            y = layer(x)
        return accumulator.jvp(y)

    traced = tf.function(jvp)(x, tangent).numpy()
    np.testing.assert_allclose(traced, jvp(x, tangent).numpy(), atol=1e-5)
    step = 1e-2
    central = (layer(x + step * tangent) - layer(x - step * tangent)) / (2 * step)
    np.testing.assert_allclose(traced, central.numpy(), atol=2e-3)


@pytest.mark.parametrize("start", [(0, 0, 0), (1, 2, 1), (2, 4, 3)])
def test_the_slice_ops_gradients_send_each_window_where_it_came_from(start):
    # TensorFlow registers no gradient for XlaDynamicUpdateSlice (Keras's
    # `ops.slice_update`) or XlaDynamicSlice; `ops.gradients` adds them.
    # The last start lies past the end and is clamped, in both ops alike.
    from tensorflow.compiler.tf2xla.python import xla

    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(3, 5, 4)), "float32")
    u = tf.constant(rng.normal(size=(2, 2, 3)), "float32")
    w = rng.normal(size=(3, 5, 4)).astype("float32")
    w_window = rng.normal(size=(2, 2, 3)).astype("float32")
    at = tuple(min(s, n - m) for s, n, m in zip(start, x.shape, u.shape))
    window = tuple(slice(a, a + m) for a, m in zip(at, u.shape))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, u])
        updated = tf.reduce_sum(keras.ops.slice_update(x, list(start), u) * w)
        sliced = tf.reduce_sum(
            xla.dynamic_slice(x, tf.constant(start), u.shape) * w_window
        )
    d_x, d_u = tape.gradient(updated, [x, u])
    want_d_x = w.copy()
    want_d_x[window] = 0.0
    np.testing.assert_array_equal(d_x.numpy(), want_d_x)
    np.testing.assert_array_equal(d_u.numpy(), w[window])
    want_slice = np.zeros_like(w)
    want_slice[window] = w_window
    np.testing.assert_array_equal(tape.gradient(sliced, x).numpy(), want_slice)


def _hessian_vector_and_penalty(fn, q, k, v, direction):
    # d/dq <d loss/dq, direction>, and the gradient of a gradient penalty
    # (the squared norm of d loss/dk) with respect to v.
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([q, k, v])
        with tf.GradientTape() as inner:
            inner.watch([q, k, v])
            out = fn(q, k, v)
            loss = tf.reduce_sum(out * tf.cos(out))
        d_q, d_k, _ = inner.gradient(loss, [q, k, v])
        along = tf.reduce_sum(d_q * direction)
        penalty = tf.reduce_sum(d_k**2)
    return outer.gradient(along, q), outer.gradient(penalty, v)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.parametrize("implementation", ["blocked", "chunked"])
def test_second_order_gradients_through_the_long_paths_equal_the_dense_paths(
    implementation, mode, monkeypatch
):
    # Their backward passes write their blocks with `ops.slice_update`:
    # a Hessian-vector product or a gradient penalty through them failed
    # with a LookupError (no gradient for XlaDynamicUpdateSlice), and
    # under XLA for want of the loops' trip counts. Several blocks and
    # chunks here, causal and padded.
    from keras_attention.ops import blocked
    from keras_attention.ops import dense

    monkeypatch.setattr(dense, "CHUNK_SCORE_BYTES", 8 * 4 * 2 * 4 * 20)
    rng = np.random.default_rng(5)
    q, k, v = (tf.constant(rng.normal(size=(2, 20, 2, 4)), "float32") for _ in range(3))
    mask = tf.constant(rng.random((2, 20)) > 0.2)
    direction = tf.constant(rng.normal(size=(2, 20, 2, 4)), "float32")

    def long_path(q, k, v):
        if implementation == "blocked":
            return blocked.blocked_attention(
                q, k, v, attention_mask=mask, is_causal=True,
                block_size=8, query_block_size=8,
            )
        return dispatch.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=True, implementation="chunked"
        )

    def dense_path(q, k, v):
        return dispatch.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=True, implementation="dense"
        )

    run = _hessian_vector_and_penalty
    if mode != "eager":
        run = tf.function(run, autograph=False, jit_compile=mode == "xla")
    got = run(long_path, q, k, v, direction)
    want = _hessian_vector_and_penalty(dense_path, q, k, v, direction)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4, rtol=1e-4)


def test_second_order_gradients_through_the_xla_cpu_loops(monkeypatch):
    # Under XLA on a CPU the dense core's backward runs pair by pair and
    # its keys' products loop (`ops/xla_cpu.py`), from sizes forced down
    # to these few scores here.
    from keras_attention.ops import xla_cpu

    monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)
    monkeypatch.setattr(xla_cpu, "_GROUPED_PRODUCT_SIZE", 1)
    taken = []
    in_pairs = xla_cpu._backward_in_pairs
    monkeypatch.setattr(xla_cpu, "_backward_in_pairs",
                        lambda *a: taken.append(1) or in_pairs(*a))
    rng = np.random.default_rng(6)
    q, k, v = (tf.constant(rng.normal(size=(2, 9, 2, 4)), "float32") for _ in range(3))
    direction = tf.constant(rng.normal(size=(2, 9, 2, 4)), "float32")

    def core(custom):
        return lambda q, k, v: dispatch.dot_product_attention(
            q, k, v, is_causal=True, implementation="dense", custom_gradient=custom
        )

    compiled = tf.function(_hessian_vector_and_penalty, autograph=False,
                           jit_compile=True)
    got = compiled(core(True), q, k, v, direction)
    assert taken, "the backward pair by pair was not taken"
    want = _hessian_vector_and_penalty(core(False), q, k, v, direction)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4, rtol=1e-4)
