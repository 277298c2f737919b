"""Edge-case shapes a user reaches: an empty batch, unknown lengths on the
paths that need them known, scores asked of a path that has none — each
either works or is refused clearly, and refused when the model is built
rather than at its first call. Runs on every backend (CI: TensorFlow and
torch)."""

import keras
import numpy as np
import pytest

from keras_attention.layers import GraphAttention
from keras_attention.layers import MultiHeadAttention


@pytest.mark.parametrize("implementation", ["blocked", "chunked", "fused"])
def test_a_functional_model_asking_a_weightless_path_for_scores_is_refused_as_built(
    implementation,
):
    # The symbolic call used to give a (output, scores) pair, and the
    # model failed only at its first real call.
    inputs = keras.Input((None, 6))
    layer = MultiHeadAttention(2, 4, implementation=implementation)
    with pytest.raises(ValueError, match="returns no weights"):
        layer(inputs, return_attention_scores=True)


def test_an_empty_batch_and_an_empty_graph_give_empty_outputs():
    # The blocked core's running maximum and the graph layer's segment
    # maximum took Keras's `ops.max` / `segment_max`, which refuse empty
    # tensors on TensorFlow and torch (JAX gave the empty outputs).
    empty = np.zeros((0, 3, 6), "float32")
    for implementation in ("blocked", "dense", "chunked"):
        layer = MultiHeadAttention(2, 4, implementation=implementation)
        out = layer(empty)
        assert tuple(out.shape) == (0, 3, 6), implementation
    nodes = np.zeros((0, 3), "float32")
    edges = np.zeros((2, 0), "int32")
    out = GraphAttention(units=4, num_heads=2)([nodes, edges])
    assert tuple(out.shape) == (0, 8)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.function")
def test_a_length_unknown_when_traced_names_the_argument_and_the_way_out():
    import tensorflow as tf

    layer = MultiHeadAttention(2, 4, implementation="blocked")
    layer(np.zeros((1, 5, 6), "float32"))
    call = tf.function(
        layer, input_signature=[tf.TensorSpec((None, None, 6), tf.float32)]
    )
    with pytest.raises(ValueError, match="implementation='auto'") as raised:
        call(np.zeros((1, 5, 6), "float32"))
    assert "argument `implementation`" in str(raised.value)
