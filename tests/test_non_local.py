"""Paper-specific checks of NonLocalBlock (Wang et al., 2018)."""

import keras
import numpy as np
import pytest

from keras_attention.layers.non_local import MODES
from keras_attention.layers.non_local import NonLocalBlock
from tests.cases_cbam import non_local_reference

SHAPES = {1: (2, 9, 6), 2: (2, 5, 4, 6), 3: (2, 3, 4, 3, 6)}


def inputs(rank, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=SHAPES[rank]) * scale).astype("float32")


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("sub_sample", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_matches_the_paper(mode, rank, sub_sample):
    x = inputs(rank)
    keras.utils.set_random_seed(0)
    layer = NonLocalBlock(mode=mode, sub_sample=sub_sample, zero_init_residual=False)
    z, w = layer(x, return_attention_scores=True)
    expected, expected_w = non_local_reference(layer, x, return_weights=True)
    np.testing.assert_allclose(np_(z), expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np_(w), expected_w, atol=2e-6, rtol=2e-6)
    # Without the weights, "dot" takes the linear path theta (phi^T g) / N.
    np.testing.assert_allclose(np_(layer(x)), np_(z), atol=1e-5, rtol=1e-5)


def test_weights_shape_with_sub_sampling():
    x = inputs(2)  # (2, 5, 4, 6): 20 positions, keys pooled to 3 x 2
    _, w = NonLocalBlock(sub_sample=True)(x, return_attention_scores=True)
    assert np_(w).shape == (2, 1, 20, 6)
    np.testing.assert_allclose(np_(w).sum(-1), 1.0, atol=1e-5)
    # 3D maps pool space, not time, by default: 3 x 2 x 2 keys.
    _, w = NonLocalBlock(sub_sample=True)(inputs(3), return_attention_scores=True)
    assert np_(w).shape == (2, 1, 36, 12)
    _, w = NonLocalBlock(sub_sample=(3, 1, 2))(inputs(3), return_attention_scores=True)
    assert np_(w).shape == (2, 1, 36, 8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sub_sample", [False, True])
def test_symbolic_weights_shape_is_known_for_known_sizes(mode, sub_sample):
    # A functional model's score output had (None, 1, None, None) for a
    # (6, 5) map; the eager call's (B, 1, 30, S) is known from the input.
    block = NonLocalBlock(mode=mode, sub_sample=sub_sample)
    _, symbolic = block(keras.Input((6, 5, 8)), return_attention_scores=True)
    _, eager = block(np.zeros((2, 6, 5, 8), "float32"), return_attention_scores=True)
    assert tuple(symbolic.shape) == (None,) + tuple(eager.shape)[1:]


@pytest.mark.parametrize("use_batch_norm", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_fresh_block_is_the_identity(mode, use_batch_norm):
    x = inputs(2, scale=3.0)
    layer = NonLocalBlock(mode=mode, use_batch_norm=use_batch_norm, sub_sample=True)
    np.testing.assert_array_equal(np_(layer(x)), x)
    np.testing.assert_array_equal(np_(layer(x, training=True)), x)
    if use_batch_norm:
        assert not np.any(np_(layer.batch_norm.gamma))
        assert np.any(np_(layer.output_kernel))
    else:
        assert not np.any(np_(layer.output_kernel))


def test_batch_norm_reference_with_statistics():
    x = inputs(2)
    layer = NonLocalBlock(mode="dot", use_batch_norm=True, zero_init_residual=False)
    layer(x)
    rng = np.random.default_rng(1)
    bn = layer.batch_norm
    for variable in (bn.gamma, bn.beta, bn.moving_mean):
        variable.assign(rng.normal(size=variable.shape))
    bn.moving_variance.assign(rng.random(bn.moving_variance.shape) + 0.5)
    np.testing.assert_allclose(np_(layer(x)), non_local_reference(layer, x), atol=1e-5)


def test_inter_channels_and_gaussian_weights():
    layer = NonLocalBlock(mode="gaussian", inter_channels=3, use_bias=False)
    layer.build((None, 4, 4, 10))
    # gaussian compares raw inputs: no theta / phi, only g and W_z.
    assert [tuple(w.shape) for w in layer.weights] == [(10, 3), (3, 10)]
    layer = NonLocalBlock(mode="concatenation")
    layer.build((None, 4, 4, 10))
    assert layer.g_kernel.shape == (10, 5)
    assert layer.concat_kernel.shape == (10,)


def test_memory_efficient_path_for_large_maps():
    # 1100 positions: T * S > 2**20 scores, so the softmax modes take the
    # blocked core without weights; it must match the dense path.
    x = np.random.default_rng(3).normal(size=(1, 1100, 4)).astype("float32")
    layer = NonLocalBlock(mode="embedded_gaussian", zero_init_residual=False)
    dense, _ = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(np_(layer(x)), np_(dense), atol=1e-5)


@pytest.mark.parametrize("sub_sample", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_sequence_masks(mode, sub_sample):
    rng = np.random.default_rng(4)
    x = inputs(1)
    mask = rng.random((2, 9)) > 0.5
    mask[:, 0] = True
    mask[1, 4:6] = False  # a whole pooling window masked
    keras.utils.set_random_seed(0)
    layer = NonLocalBlock(mode=mode, sub_sample=sub_sample, zero_init_residual=False)
    z, weights = layer(x, mask=mask, return_attention_scores=True)
    expected, expected_weights = non_local_reference(
        layer, x, mask, return_weights=True
    )
    np.testing.assert_allclose(np_(z), expected, atol=1e-5)
    np.testing.assert_allclose(np_(weights), expected_weights, atol=1e-5)
    # The score contract: a masked position's row of weights is 0.
    rows = np_(weights)[:, 0]  # (B, T, S)
    assert np.all(rows[~mask] == 0) and np.any(rows[mask])
    z = np_(z)
    noisy = x.copy()
    noisy[~mask] = rng.normal(size=noisy[~mask].shape) * 100
    np.testing.assert_allclose(np_(layer(noisy, mask=mask))[mask], z[mask], atol=1e-4)
    assert layer.compute_mask(x, mask) is mask


def test_mixed_float16_large_raw_inputs():
    # Raw gaussian scores x_i . x_j exceed float16's range here; the scores
    # are computed in float32, so the output stays finite and close.
    x = np.random.default_rng(5).normal(size=(1, 6, 6, 64)).astype("float32") * 40
    keras.utils.set_random_seed(0)
    full = NonLocalBlock(mode="gaussian", zero_init_residual=False)
    expected = np_(full(x))
    low = NonLocalBlock(mode="gaussian", zero_init_residual=False, dtype="mixed_float16")
    low(x)
    low.set_weights(full.get_weights())
    result = np_(low(x)).astype("float32")
    assert np.isfinite(result).all()
    np.testing.assert_allclose(result, expected, atol=0.5)  # |x| ~ 40


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"mode": "softmax"}, "mode"),
        ({"mode": None}, "mode"),
        ({"inter_channels": 0}, "inter_channels"),
        ({"inter_channels": 2.5}, "inter_channels"),
        ({"sub_sample": 0}, "sub_sample"),
        ({"sub_sample": (2, 0)}, "sub_sample"),
        ({"sub_sample": "yes"}, "sub_sample"),
        ({"sub_sample": ()}, "sub_sample"),
    ],
)
def test_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=f"`{argument}`.*Received: {argument}="):
        NonLocalBlock(**kwargs)


def test_sub_sample_tuple_must_fit_the_rank():
    with pytest.raises(ValueError, match=r"`sub_sample`.*\(2\).*sub_sample=\(2, 2, 2\)"):
        NonLocalBlock(sub_sample=(2, 2, 2))(inputs(2))


@pytest.mark.parametrize("shape", [(2, 6), (1, 2, 2, 2, 2, 4)])
def test_wrong_input_rank(shape):
    with pytest.raises(ValueError, match=r"`inputs`.*rank-3, 4 or 5"):
        NonLocalBlock()(np.zeros(shape, "float32"))
    with pytest.raises(ValueError, match="`inputs`"):
        NonLocalBlock().compute_output_shape(shape)


def test_a_built_block_takes_another_rank_only_without_batch_norm():
    # 1x1 projections refine a sequence as well as an image; a batch
    # normalization built on images raises, as the docstring says.
    block = NonLocalBlock()
    block(np.zeros((2, 4, 4, 8), "float32"))
    assert tuple(block(np.zeros((2, 4, 8), "float32")).shape) == (2, 4, 8)
    normed = NonLocalBlock(use_batch_norm=True)
    normed(np.zeros((2, 4, 4, 8), "float32"))
    with pytest.raises(ValueError, match="non_local_block.*expected ndim=4"):
        normed(np.zeros((2, 4, 8), "float32"))


def test_unknown_channels_are_named_in_the_data_format_given():
    # The message showed the moved shape, channels "last", for a
    # channels-first map.
    layer = NonLocalBlock(data_format="channels_first")
    with pytest.raises(ValueError, match=(
        r"channel \(first\) dimension.*channels_first.*"
        r"inputs.shape=\(None, None, 4, 4\)"
    )):
        layer(keras.Input((None, 4, 4)))


def test_wrong_mask_shape():
    with pytest.raises(ValueError, match="`mask`"):
        NonLocalBlock()(inputs(1), mask=np.ones((2, 8), bool))


def test_fit_step_with_xla_and_batch_norm(tmp_path):
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image)
    x = NonLocalBlock(mode="concatenation", sub_sample=True, use_batch_norm=True,
                      name="non_local")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(image, keras.layers.Dense(2)(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=True)
    rng = np.random.default_rng(6)
    data = rng.random((8, 8, 8, 3)).astype("float32")
    target = rng.normal(size=(8, 2)).astype("float32")
    block = model.get_layer("non_local")
    history = model.fit(data, target, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert np.any(np_(block.batch_norm.gamma)), "the residual branch did not learn"
    path = str(tmp_path / "nl.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(np_(loaded(data)), np_(model(data)))
