"""A built layer given inputs of another shape than it was built for: an
error naming the argument (or keras's, naming the layer), never a raw
backend error or a result of the wrong shape."""

import keras
import numpy as np
import pytest

from keras_attention.layers import CBAM
from keras_attention.layers import AdditiveAttention
from keras_attention.layers import ChannelAttention
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import NonLocalBlock
from keras_attention.layers import ScaledDotProductAttention
from keras_attention.layers import SpatialAttention


def rand(*shape):
    return np.random.default_rng(0).random(shape).astype("float32")


@pytest.mark.parametrize(
    "make, other_rank_works",
    [(lambda: ChannelAttention(reduction=2), True),
     (NonLocalBlock, True),
     (SpatialAttention, False),
     (lambda: CBAM(reduction=2), False)],
)
def test_feature_maps_keep_their_rank_and_channels(make, other_rank_works):
    layer = make()
    layer(rand(2, 6, 6, 8))
    # A rank-2 input was taken as a map (a (10, 8) result) by the first two.
    with pytest.raises(ValueError, match="expected (min_)?ndim"):
        layer(rand(10, 8))
    with pytest.raises(ValueError, match="axis -1 of input shape to have value 8"):
        layer(rand(2, 6, 6, 6))
    if other_rank_works:  # 1x1 projections only: any map of 8 channels
        assert tuple(layer(rand(2, 7, 8)).shape) == (2, 7, 8)
    else:  # the convolution fixes the rank
        with pytest.raises(ValueError, match="expected ndim=4"):
            layer(rand(2, 7, 8))


def test_multi_head_keeps_its_feature_sizes():
    layer = MultiHeadAttention(2, 4)
    layer(rand(2, 4, 8), rand(2, 5, 6))
    # Was TensorFlow's "Input to reshape is a tensor with 48 values".
    with pytest.raises(ValueError, match=r"`query`, expected 8 features.*\(2, 4, 6\)"):
        layer(rand(2, 4, 6), rand(2, 5, 6))
    with pytest.raises(ValueError, match=r"`value`, expected 6 features"):
        layer(rand(2, 4, 8), rand(2, 5, 8))
    assert tuple(layer(rand(3, 7, 8), rand(3, 2, 6)).shape) == (3, 7, 8)


def test_an_unbatched_pair_is_named_by_its_rank():
    # Was "Expected `query`, `value` and `key` to have the same batch size".
    with pytest.raises(ValueError, match=r"`query`, expected a tensor of rank 3"):
        MultiHeadAttention(2, 4)([rand(4, 8), rand(6, 8)])
    # Was blamed on `key`, which the call never gave.
    for layer in (AdditiveAttention(units=4), ScaledDotProductAttention()):
        with pytest.raises(ValueError, match=r"`value`, expected a rank-3"):
            layer([rand(4, 8), rand(6, 8)])


def test_local_window_names_an_unknown_height_and_width():
    from keras_attention.layers import LocalWindowAttention

    layer = LocalWindowAttention(num_heads=2, window_size=4)
    inputs = keras.Input((None, None, 8))
    if keras.backend.backend() == "torch":  # keras builds it with made-up sizes
        pytest.skip("Keras's torch backend traces unknown sizes as known")
    # Was keras's "Could not automatically infer the output shape" first.
    with pytest.raises(ValueError, match=r"(?s)^(?!.*Could not automatically).*known height and width"):
        layer(inputs)


@pytest.mark.parametrize("make", [lambda: CBAM(reduction=2), SpatialAttention,
                                  lambda: ChannelAttention(reduction=2)])
def test_feature_maps_take_training_in_stateless_call(make):
    layer = make()
    x = rand(2, 6, 6, 8)
    want = layer(x)
    got, _ = layer.stateless_call(
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables],
        x, training=True,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), rtol=1e-6
    )


def test_build_takes_a_tensorflow_shape():
    # MultiHeadAttention.build(tf.TensorShape(...)) read the shape as a list
    # of shapes ("'int' object is not iterable"); keras's layer takes it.
    import tensorflow as tf

    from keras_attention.layers import MultiHeadAttention

    layer = MultiHeadAttention(2, 8)
    layer.build(tf.TensorShape([1, 10, 32]))
    assert layer.built
    out = layer(np.zeros((1, 10, 32), "float32"))
    assert tuple(out.shape) == (1, 10, 32)
