"""Paper-specific checks of LocalWindowAttention (Swin shifted windows)."""

import os

import keras
import numpy as np
import pytest

from keras_attention.layers import LocalWindowAttention
from keras_attention.layers.local_window import window_geometry
from tests.cases_local_window import layer_weights, swin_reference


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def randomized(layer, rng):
    """Give every weight (bias table and biases included) a random value."""
    layer.set_weights(
        [
            rng.normal(scale=0.5, size=w.shape).astype("float32")
            for w in layer.get_weights()
        ]
    )
    return layer


def make(rng, shape, **kwargs):
    layer = LocalWindowAttention(**kwargs)
    layer.build(shape)
    return randomized(layer, rng)


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        # no shift, no padding
        ((2, 8, 8, 6), dict(num_heads=2, window_size=4)),
        # shifted, no padding
        ((2, 8, 12, 6), dict(num_heads=2, window_size=4, shift_size=2)),
        # shifted with odd sizes: padded to 12 x 8
        ((2, 9, 7, 6), dict(num_heads=3, window_size=4, shift_size=1)),
        # unshifted with padding, key_dim != C // heads, no biases
        ((1, 5, 11, 4), dict(num_heads=2, window_size=3, key_dim=3, use_bias=False)),
        # image smaller than the window: window 3, shift 0, width padded to 6
        ((2, 3, 5, 4), dict(num_heads=2, window_size=7, shift_size=3)),
    ],
)
def test_matches_numpy_reference(shape, kwargs):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype("float32")
    layer = make(rng, shape, **kwargs)
    out, scores = layer(x, return_attention_scores=True)
    expected, expected_scores = swin_reference(
        x,
        *layer_weights(layer),
        num_heads=layer.num_heads,
        window_size=layer.window_size,
        shift_size=layer.shift_size,
    )
    np.testing.assert_allclose(numpy(out), expected, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(
        numpy(scores), expected_scores, atol=2e-6, rtol=1e-4
    )


def test_window_shrinks_to_small_images():
    assert window_geometry(3, 5, 7, 3) == (3, 0, 3, 6)
    assert window_geometry(7, 9, 7, 3) == (7, 0, 7, 14)
    assert window_geometry(8, 9, 7, 3) == (7, 3, 14, 14)
    layer = LocalWindowAttention(num_heads=1, window_size=7, shift_size=3)
    x = np.zeros((2, 3, 5, 4), "float32")
    _, scores = layer(x, return_attention_scores=True)
    assert tuple(scores.shape) == (2, 2, 1, 9, 9)


def allowed_pairs(height, width, window, shift):
    """`(nW, T, T)` from first principles: which key a query may see.

    A token at rolled, padded position `p` came from `(p + shift) mod (Hp,
    Wp)`. Two tokens of a window may attend iff their offset is the same
    before and after the roll (nothing wrapped between them) and the key
    is a real pixel.
    """
    hp, wp = -(-height // window) * window, -(-width // window) * window
    pairs = []
    for wr in range(hp // window):
        for wc in range(wp // window):
            pos = [
                (wr * window + i, wc * window + j)
                for i in range(window)
                for j in range(window)
            ]
            orig = [((r + shift) % hp, (c + shift) % wp) for r, c in pos]
            pairs.append(
                [
                    [
                        orig[k][0] < height
                        and orig[k][1] < width
                        and orig[q][0] - orig[k][0] == pos[q][0] - pos[k][0]
                        and orig[q][1] - orig[k][1] == pos[q][1] - pos[k][1]
                        for k in range(len(pos))
                    ]
                    for q in range(len(pos))
                ]
            )
    return np.array(pairs)


@pytest.mark.parametrize("height, width", [(8, 8), (7, 10)])
def test_weights_are_zero_across_regions_and_padding(height, width):
    rng = np.random.default_rng(1)
    shape = (2, height, width, 4)
    layer = make(rng, shape, num_heads=2, window_size=4, shift_size=2)
    x = rng.normal(size=shape).astype("float32")
    _, scores = layer(x, return_attention_scores=True)
    scores = numpy(scores)  # (B, nW, H, T, T)
    allowed = allowed_pairs(height, width, 4, 2)[None, :, None]
    assert (~allowed).any() and allowed.any()
    allowed = np.broadcast_to(allowed, scores.shape)
    assert np.all(scores[~allowed] == 0.0)
    assert np.all(scores[allowed] > 0.0)
    # Rows sum to 1, except padded queries whose region holds no real key.
    np.testing.assert_allclose(scores.sum(-1), allowed.any(-1), atol=1e-5)


def test_perturbing_one_region_leaves_the_others_of_its_window_unchanged():
    # 8 x 8, windows 4, shift 2: the last shifted window holds original
    # pixels {6, 7} x {6, 7} and the wrapped ones {6, 7} x {0, 1},
    # {0, 1} x {6, 7}, {0, 1} x {0, 1}.
    rng = np.random.default_rng(2)
    shape = (1, 8, 8, 4)
    layer = make(rng, shape, num_heads=2, window_size=4, shift_size=2)
    x = rng.normal(size=shape).astype("float32")
    changed = x.copy()
    changed[0, 6, 6] += 5.0
    diff = np.abs(numpy(layer(changed)) - numpy(layer(x))).max(-1)[0]
    region = np.zeros((8, 8), bool)
    region[6:, 6:] = True
    assert np.all(diff[region] > 1e-3)
    # The other three regions of the same window, and every other window.
    np.testing.assert_array_equal(diff[~region], 0.0)

    # Without the shift the same pixel reaches its whole 4 x 4 window.
    unshifted = make(rng, shape, num_heads=2, window_size=4)
    diff = np.abs(numpy(unshifted(changed)) - numpy(unshifted(x))).max(-1)[0]
    assert np.all(diff[4:, 4:] > 1e-4) and np.all(diff[:4] == 0.0)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_heads=2, window_size=0), "window_size"),
        (dict(num_heads=2, window_size=2.5), "window_size"),
        (dict(num_heads=2, window_size=4, shift_size=4), "shift_size"),
        (dict(num_heads=2, window_size=4, shift_size=-1), "shift_size"),
        (dict(num_heads=2, window_size=4, shift_size=1.0), "shift_size"),
        (dict(num_heads=0), "num_heads"),
        (dict(num_heads=2, key_dim=0), "key_dim"),
        (dict(num_heads=2, dropout=1.0), "dropout"),
    ],
)
def test_bad_arguments_raise(kwargs, argument):
    value = kwargs[argument]
    message = rf"`{argument}`.*Received: {argument}={value!r}"
    with pytest.raises(ValueError, match=message):
        LocalWindowAttention(**kwargs)


def test_bad_shapes_raise():
    layer = LocalWindowAttention(num_heads=3, window_size=4)
    with pytest.raises(ValueError, match="divisible by num_heads=3"):
        layer(np.zeros((1, 8, 8, 4), "float32"))
    with pytest.raises(ValueError, match="rank-4"):
        LocalWindowAttention(num_heads=1)(np.zeros((1, 8, 4), "float32"))
    built = LocalWindowAttention(num_heads=2, window_size=2)
    built(np.zeros((1, 4, 4, 8), "float32"))
    # Its own words, not the `qkv` sublayer's of an internal window shape.
    with pytest.raises(ValueError, match=(
        r"`inputs`, expected 8 channels.*inputs.shape=\(1, 4, 4, 6\)"
    )):
        built(np.zeros((1, 4, 4, 6), "float32"))
    symbolic = keras.Input((None, 8, 4))
    if keras.backend.backend() == "torch":
        # Keras's torch backend infers symbolic shapes by running `call` on
        # placeholder sizes, so an unknown height never reaches it: the
        # eager calls that follow have the real one.
        assert LocalWindowAttention(num_heads=1)(symbolic).shape == (None, None, 8, 4)
        return
    with pytest.raises(ValueError, match="known height and width"):
        LocalWindowAttention(num_heads=1)(symbolic)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="Keras's TensorFlow predict relaxes sizes when it retraces")
def test_a_second_image_size_in_predict_says_why_and_what_to_do():
    model = keras.Sequential([
        LocalWindowAttention(num_heads=2, window_size=4, shift_size=2),
        keras.layers.GlobalAveragePooling2D(),
    ])
    model.predict(np.zeros((2, 7, 7, 8), "float32"), verbose=0)
    with pytest.raises(ValueError, match=r"(?s)known height and width when "
                       r"traced.*retracing for a\s+second image size.*run_eagerly"):
        model.predict(np.zeros((2, 9, 5, 8), "float32"), verbose=0)


@pytest.mark.parametrize(
    "height, width", [(1, 1), (1, 9), (4, 4), (5, 5), (7, 13), (12, 6), (11, 17)]
)
def test_output_shape_equals_input_shape(height, width):
    layer = LocalWindowAttention(num_heads=2, window_size=4, shift_size=2)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, height, width, 6)).astype("float32")
    out = layer(x)
    assert tuple(out.shape) == x.shape
    assert np.all(np.isfinite(numpy(out)))
    assert layer.compute_output_shape(x.shape) == x.shape


def test_keras_file_round_trip_with_scores(tmp_path):
    rng = np.random.default_rng(4)
    inputs = keras.Input((9, 7, 6))  # batch unknown
    layer = LocalWindowAttention(num_heads=2, window_size=4, shift_size=2)
    out, scores = layer(inputs, return_attention_scores=True)
    assert tuple(scores.shape) == (None, 6, 2, 16, 16)
    model = keras.Model(inputs, [out, scores])
    randomized(layer, rng)
    x = rng.normal(size=(3, 9, 7, 6)).astype("float32")
    path = os.path.join(tmp_path, "local_window.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    for a, b in zip(model(x), loaded(x)):
        np.testing.assert_array_equal(numpy(a), numpy(b))
    clone = LocalWindowAttention.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_compiles_with_xla_and_unknown_batch():
    rng = np.random.default_rng(5)
    inputs = keras.Input((7, 9, 6))
    outputs = LocalWindowAttention(num_heads=2, window_size=3, shift_size=1)(inputs)
    model = keras.Model(inputs, outputs)
    x = rng.normal(size=(5, 7, 9, 6)).astype("float32")
    eager = numpy(model(x))
    model.compile(loss="mse", jit_compile=True)
    compiled = model.predict(x, batch_size=5, verbose=0)
    np.testing.assert_allclose(compiled, eager, atol=1e-5)


def test_dropout_only_in_training():
    x = np.random.default_rng(6).normal(size=(2, 8, 8, 4)).astype("float32")
    layer = LocalWindowAttention(
        num_heads=2, window_size=4, shift_size=2, dropout=0.5, seed=1
    )
    a = numpy(layer(x))
    np.testing.assert_array_equal(a, numpy(layer(x, training=False)))
    assert not np.allclose(a, numpy(layer(x, training=True)))
