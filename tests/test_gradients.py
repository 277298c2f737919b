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
