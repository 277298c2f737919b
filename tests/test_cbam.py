"""Paper-specific checks of ChannelAttention, SpatialAttention and CBAM."""

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention.layers.cbam import CBAM
from keras_attention.layers.cbam import ChannelAttention
from keras_attention.layers.cbam import SpatialAttention
from tests.cases_cbam import cbam_reference
from tests.cases_cbam import channel_reference
from tests.cases_cbam import channel_weights
from tests.cases_cbam import conv_same
from tests.cases_cbam import spatial_map
from tests.cases_cbam import spatial_reference

SHAPES = {1: (2, 9, 8), 2: (2, 6, 5, 8), 3: (2, 3, 4, 5, 8)}


def inputs(rank, seed=0):
    return np.random.default_rng(seed).normal(size=SHAPES[rank]).astype("float32")


def np_(x):
    return keras.ops.convert_to_numpy(x)


def test_registered_names():
    assert keras_attention.registry.get_class("channel") is ChannelAttention
    assert keras_attention.registry.get_class("spatial") is SpatialAttention
    assert keras_attention.registry.get_class("cbam") is CBAM


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_channel_attention_matches_the_paper(rank):
    x = inputs(rank)
    layer = ChannelAttention(reduction=4)
    y, w = layer(x, return_attention_scores=True)
    w = np_(w)
    assert w.shape == (2, 8)
    assert np.all((w > 0) & (w < 1))
    np.testing.assert_allclose(w, channel_weights(layer, x), atol=1e-6)
    np.testing.assert_allclose(np_(y), channel_reference(layer, x), atol=1e-5)


def test_channel_attention_4d_batch_of_volumes_any_rank():
    # Rank 6 `(B, T, D, H, W, C)`: the channel part has no convolution.
    x = np.random.default_rng(1).normal(size=(1, 2, 2, 3, 2, 4)).astype("float32")
    layer = ChannelAttention(reduction=2, use_bias=False)
    np.testing.assert_allclose(np_(layer(x)), channel_reference(layer, x), atol=1e-5)
    assert layer.hidden_bias is None and len(layer.weights) == 2


def test_channel_mlp_is_shared_between_the_pools():
    layer = ChannelAttention(reduction=2)
    layer.build((None, 4, 4, 6))
    shapes = [tuple(w.shape) for w in layer.weights]
    assert shapes == [(6, 3), (3,), (3, 6), (6,)]


@pytest.mark.parametrize("rank,kernel_size", [(1, 5), (2, 7), (2, 3), (3, 3)])
def test_spatial_attention_matches_the_paper(rank, kernel_size):
    x = inputs(rank)
    layer = SpatialAttention(kernel_size=kernel_size)
    y, m = layer(x, return_attention_scores=True)
    m = np_(m)
    assert m.shape == SHAPES[rank][:-1] + (1,)
    assert np.all((m > 0) & (m < 1))
    np.testing.assert_allclose(m, spatial_map(layer, x), atol=1e-6)
    np.testing.assert_allclose(np_(y), spatial_reference(layer, x), atol=1e-5)


def test_conv_reference_agrees_with_scipy():
    # The reference's "same" convolution is itself checked against a peer.
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 6, 5, 2))
    kernel = rng.normal(size=(3, 3, 2, 1))
    expected = sum(
        ndimage.correlate(x[0, :, :, c], kernel[:, :, c, 0], mode="constant")
        for c in range(2)
    )
    np.testing.assert_allclose(conv_same(x, kernel)[0, :, :, 0], expected, atol=1e-12)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cbam_is_channel_then_spatial(rank):
    x = inputs(rank)
    layer = CBAM(reduction=2, kernel_size=3)
    y, (w, m) = layer(x, return_attention_scores=True)
    assert np_(w).shape == (2, 8)
    assert np_(m).shape == SHAPES[rank][:-1] + (1,)
    np.testing.assert_allclose(np_(y), cbam_reference(layer, x), atol=1e-5)
    refined = channel_reference(layer.channel_attention, x)
    np.testing.assert_allclose(
        np_(m), spatial_map(layer.spatial_attention, refined), atol=1e-6
    )
    assert layer.channel_attention.name == "channel_attention"
    assert layer.spatial_attention.name == "spatial_attention"


def test_cbam_sublayers_follow_the_dtype_policy():
    layer = CBAM(reduction=2, kernel_size=3, dtype="mixed_bfloat16")
    y = layer(inputs(2))
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    assert layer.channel_attention.dtype_policy.name == "mixed_bfloat16"
    assert layer.spatial_attention.dtype_policy.name == "mixed_bfloat16"


@pytest.mark.parametrize("cls", [ChannelAttention, SpatialAttention, CBAM])
def test_sequence_masks(cls):
    rng = np.random.default_rng(4)
    x = inputs(1)
    mask = rng.random((2, 9)) > 0.4
    mask[:, 0] = True
    kwargs = {"kernel_size": 3} if cls is not ChannelAttention else {}
    if cls is not SpatialAttention:
        kwargs["reduction"] = 2
    layer = cls(**kwargs)
    y = np_(layer(x, mask=mask))
    reference = {
        ChannelAttention: channel_reference,
        SpatialAttention: spatial_reference,
        CBAM: cbam_reference,
    }[cls]
    np.testing.assert_allclose(y, reference(layer, x, mask), atol=1e-5)
    noisy = x.copy()
    noisy[~mask] = rng.normal(size=noisy[~mask].shape) * 100
    np.testing.assert_allclose(np_(layer(noisy, mask=mask))[mask], y[mask], atol=1e-5)
    assert layer.compute_mask(x, mask) is mask


@pytest.mark.parametrize(
    "make,argument",
    [
        (lambda: ChannelAttention(reduction=0), "reduction"),
        (lambda: ChannelAttention(reduction=2.0), "reduction"),
        (lambda: CBAM(reduction=-4), "reduction"),
        (lambda: SpatialAttention(kernel_size=4), "kernel_size"),
        (lambda: SpatialAttention(kernel_size=0), "kernel_size"),
        (lambda: SpatialAttention(kernel_size=-3), "kernel_size"),
        (lambda: SpatialAttention(kernel_size=True), "kernel_size"),
        (lambda: CBAM(kernel_size=6), "kernel_size"),
    ],
)
def test_bad_arguments(make, argument):
    with pytest.raises(ValueError, match=f"`{argument}`.*Received: {argument}="):
        make()


@pytest.mark.parametrize("cls", [ChannelAttention, CBAM])
def test_reduction_must_divide_channels(cls):
    with pytest.raises(ValueError, match=r"`reduction`.*\(6\).*reduction=4"):
        cls(reduction=4)(np.zeros((1, 3, 3, 6), "float32"))
    with pytest.raises(ValueError, match="`reduction`"):
        cls(reduction=4).build((None, 3, 3, 6))


@pytest.mark.parametrize("cls", [ChannelAttention, SpatialAttention, CBAM])
def test_wrong_input_rank(cls):
    with pytest.raises(ValueError, match=r"`inputs`.*inputs.shape=\(2, 8\)"):
        cls()(np.zeros((2, 8), "float32"))
    with pytest.raises(ValueError, match="`inputs`"):
        cls().compute_output_shape((2, 8))


@pytest.mark.parametrize("cls", [SpatialAttention, CBAM])
def test_no_convolution_beyond_3d(cls):
    layer = cls(reduction=1) if cls is CBAM else cls()
    with pytest.raises(ValueError, match=r"`inputs`.*rank-3, 4 or 5"):
        layer(np.zeros((1, 2, 2, 2, 2, 4), "float32"))


def test_wrong_mask_shape():
    with pytest.raises(ValueError, match="`mask`"):
        SpatialAttention()(inputs(1), mask=np.ones((2, 8), bool))


def small_cnn():
    image = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image)
    x, (w, m) = CBAM(reduction=2, kernel_size=3, name="cbam")(
        x, return_attention_scores=True
    )
    x = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(3)(x)
    return keras.Model(image, [logits, w, m])


def test_functional_scores_and_keras_file(tmp_path):
    keras.utils.set_random_seed(0)
    model = small_cnn()
    assert model.outputs[1].shape == (None, 8)
    assert model.outputs[2].shape == (None, 12, 12, 1)
    x = np.random.default_rng(5).random((2, 12, 12, 3)).astype("float32")
    expected = [np_(t) for t in model(x)]
    path = str(tmp_path / "cnn.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded.get_layer("cbam"), CBAM)
    for a, b in zip(loaded(x), expected):
        np.testing.assert_array_equal(np_(a), b)


def test_fit_step_with_xla():
    keras.utils.set_random_seed(0)
    image = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image)
    x = CBAM(reduction=2, kernel_size=3, name="cbam")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(image, keras.layers.Dense(3)(x))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(6)
    x = rng.random((8, 12, 12, 3)).astype("float32")
    y = rng.integers(0, 3, 8)
    before = [w.copy() for w in model.get_layer("cbam").get_weights()]
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = model.get_layer("cbam").get_weights()
    assert len(before) == 6
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))
