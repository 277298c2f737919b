"""`MultiHeadAttention` against `keras.layers.MultiHeadAttention`.

keras's own test file runs on our class in tests/test_keras_mha_suite.py;
these are the interchange and superset checks: weight files both ways,
keras's arguments compared value for value with keras's layer, and our
extras (one-tensor calls, grouped heads, zero output for queries that see
no key).
"""

import keras
import numpy as np
import pytest

from keras_attention.layers import MultiHeadAttention

B, T, S, DIM = 2, 5, 7, 8


def data(seed=0, t=T, s=S, dim=DIM):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(B, t, dim)).astype("float32"),
        rng.normal(size=(B, s, dim)).astype("float32"),
    )


OURS_ONLY = ("implementation", "num_key_value_heads", "use_causal_mask")


def pair(**kwargs):
    """Our layer and keras's, built on (query, value) and sharing weights."""
    q, v = data()
    ours = MultiHeadAttention(**kwargs)
    theirs = keras.layers.MultiHeadAttention(
        **{k: a for k, a in kwargs.items() if k not in OURS_ONLY}
    )
    ours(q, v)
    theirs(q, v, return_attention_scores=True)  # see model_of
    theirs.set_weights(ours.get_weights())
    return ours, theirs


def np_(x):
    return keras.ops.convert_to_numpy(x)


def model_of(layer_class, **kwargs):
    q = keras.Input((T, DIM), name="query")
    v = keras.Input((S, DIM), name="value")
    # With the scores, keras's layer takes its einsum path: on JAX its fused
    # path fails for value_dim != key_dim (a keras limitation, not ours).
    out, _ = layer_class(name="mha", **kwargs)(q, v, return_attention_scores=True)
    return keras.Model([q, v], out)


@pytest.mark.parametrize("direction", ["keras_to_ours", "ours_to_keras"])
def test_weights_h5_interchange_with_keras(direction, tmp_path):
    kwargs = dict(num_heads=2, key_dim=4, value_dim=3, use_gate=True)
    keras.utils.set_random_seed(1)
    source_class, target_class = (
        (keras.layers.MultiHeadAttention, MultiHeadAttention)
        if direction == "keras_to_ours"
        else (MultiHeadAttention, keras.layers.MultiHeadAttention)
    )
    source = model_of(source_class, **kwargs)
    keras.utils.set_random_seed(2)
    target = model_of(target_class, **kwargs)
    path = str(tmp_path / "model.weights.h5")
    source.save_weights(path)
    target.load_weights(path)
    x = list(data(3))
    np.testing.assert_allclose(np_(target(x)), np_(source(x)), atol=1e-5)
    # The same variable paths, in the same order.
    assert [w.path for w in source.weights] == [w.path for w in target.weights]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_heads=2, key_dim=4),
        dict(num_heads=3, key_dim=2, value_dim=5, output_shape=6, use_bias=False),
        dict(num_heads=2, key_dim=4, use_gate=True),
        dict(num_heads=2, key_dim=4, sliding_window=2),
    ],
)
def test_outputs_and_scores_equal_keras(kwargs):
    ours, theirs = pair(**kwargs)
    q, v = data(4)
    out, w = ours(q, v, return_attention_scores=True)
    ref_out, ref_w = theirs(q, v, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(ref_out), atol=1e-5)
    np.testing.assert_allclose(np_(w), np_(ref_w), atol=1e-6)
    # Causal, with keras's call argument (keras's scores path, see model_of).
    out = ours(q, v[:, :T], use_causal_mask=True)
    ref, _ = theirs(q, v[:, :T], use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(ref), atol=1e-5)


@pytest.mark.parametrize(
    "mask_shape",
    [(T, S), (1, T, S), (B, T, S), (B, 1, S), (1, 1, T, S), (B, 2, T, S), (B, 1, 1, S)],
)
def test_keras_mask_broadcasting(mask_shape):
    ours, theirs = pair(num_heads=2, key_dim=4)
    q, v = data(5)
    rng = np.random.default_rng(6)
    mask = rng.random(mask_shape) > 0.4
    mask[..., 0] = True  # every query sees a key: keras's layer agrees then
    np.testing.assert_allclose(
        np_(ours(q, v, attention_mask=mask)),
        np_(theirs(q, v, attention_mask=mask)),
        atol=1e-5,
    )


def test_query_rows_that_see_no_key_are_zero_heads():
    """keras averages the values there; ours attends to nothing."""
    ours, theirs = pair(num_heads=2, key_dim=4)
    q, v = data(7)
    mask = np.ones((B, T, 1), bool)
    mask[0, 1] = False
    out, w = ours(q, v, attention_mask=mask, return_attention_scores=True)
    ref = theirs(q, v, attention_mask=mask)
    seen = mask[..., 0]
    np.testing.assert_allclose(np_(out)[seen], np_(ref)[seen], atol=1e-5)
    # Zero heads: the output is the output projection's bias alone.
    bias = np_(ours._output_dense.bias)
    np.testing.assert_allclose(np_(out)[0, 1], bias, atol=1e-6)
    assert not np.any(np_(w)[0, :, 1])
    np.testing.assert_allclose(np_(w)[seen.nonzero()[0], :, seen.nonzero()[1]].sum(-1), 1.0, atol=1e-5)


def test_attention_axes_2d_over_an_image_equal_keras():
    images = np.random.default_rng(8).normal(size=(2, 4, 5, 6)).astype("float32")
    ours = MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=(1, 2))
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=(1, 2))
    out = ours(images)  # one tensor: self-attention
    theirs(images, images)
    theirs.set_weights(ours.get_weights())
    out, w = ours(images, return_attention_scores=True)
    ref, ref_w = theirs(images, images, return_attention_scores=True)
    assert w.shape == (2, 2, 4, 5, 4, 5)
    np.testing.assert_allclose(np_(out), np_(ref), atol=1e-5)
    np.testing.assert_allclose(np_(w), np_(ref_w), atol=1e-6)
    # One axis of two, with keras's (B, T, S)-style mask broadcasting.
    ours = MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=2)
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=2)
    ours(images, images)
    theirs(images, images)
    theirs.set_weights(ours.get_weights())
    mask = np.random.default_rng(9).random((2, 4, 5, 5)) > 0.3
    mask[..., 0] = True
    np.testing.assert_allclose(
        np_(ours(images, images, attention_mask=mask)),
        np_(theirs(images, images, attention_mask=mask)),
        atol=1e-5,
    )


def test_padding_masks_with_attention_axes_equal_the_rows_one_by_one():
    # keras's layer fails (or drops a query mask) here. Attending over the
    # last of two axes is the rank-3 layer over each row of the first: the
    # same weights, the rows' masks.
    rng = np.random.default_rng(10)
    images = rng.normal(size=(2, 3, 5, 6)).astype("float32")
    query_mask, value_mask = (rng.random((2, 3, 5)) > 0.3 for _ in "qv")
    query_mask[..., 0] = value_mask[..., 0] = True
    ours = MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=2)
    rows = MultiHeadAttention(num_heads=2, key_dim=3)
    ours(images, images)
    rows(images[:, 0], images[:, 0])
    rows.set_weights(ours.get_weights())
    out = ours(images, images, query_mask=query_mask, value_mask=value_mask)
    flat = images.reshape(6, 5, 6)
    want = rows(flat, flat, query_mask=query_mask.reshape(6, 5),
                value_mask=value_mask.reshape(6, 5))
    np.testing.assert_allclose(np_(out), np_(want).reshape(out.shape), atol=1e-5)
    # Over both axes, a Masking layer's mask reaches the layer.
    inputs = keras.Input((3, 5, 6))
    masked = keras.layers.Masking()(inputs)
    model = keras.Model(inputs, MultiHeadAttention(2, 3, attention_axes=(1, 2))(masked, masked))
    assert np.all(np.isfinite(np_(model(images))))


@pytest.mark.parametrize("axes, rank", [((2,), 3), (-1, 4), ((3,), 4), ((1, 1), 4), ((0,), 3)])
def test_attention_axes_outside_the_inputs_are_refused(axes, rank):
    # keras attends over another axis, or fails in an einsum.
    x = np.zeros((2,) + (3,) * (rank - 2) + (4,), "float32")
    with pytest.raises(ValueError, match="attention_axes") as info:
        MultiHeadAttention(2, 3, attention_axes=axes)(x, x)
    assert "Received: attention_axes=" in str(info.value)


def test_weights_are_returned_before_dropout():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5, seed=3)
    q, v = data(10)
    out_train, w_train = layer(q, v, return_attention_scores=True, training=True)
    out_eval, w_eval = layer(q, v, return_attention_scores=True, training=False)
    np.testing.assert_allclose(np_(w_train), np_(w_eval), atol=1e-6)
    np.testing.assert_allclose(np_(w_train).sum(-1), 1.0, atol=1e-5)
    assert not np.allclose(np_(out_train), np_(out_eval), atol=1e-3)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_compute_output_spec_dtype_matches_the_call(policy):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype=policy)
    q, v = data(11)
    symbolic = layer(keras.Input((T, DIM)), keras.Input((S, DIM)), return_attention_scores=True)
    eager = layer(q, v, return_attention_scores=True)
    for s, e in zip(symbolic, eager):
        assert s.dtype == keras.backend.standardize_dtype(e.dtype) == policy.split("_")[1]
        assert tuple(s.shape[1:]) == tuple(e.shape[1:])


def test_compute_output_shape_checks_key_against_value():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match="must be equal"):
        layer.compute_output_shape((B, T, DIM), (B, S, DIM), (B, S + 1, DIM))
    assert layer.compute_output_shape((B, T, DIM), (B, S, DIM)) == (B, T, DIM)
    assert layer.compute_output_shape((B, T, DIM)) == (B, T, DIM)
    # keras's grouped-query test passes an int: an error naming it.
    with pytest.raises(ValueError, match="argument `key_shape`.*key_shape=2"):
        layer.compute_output_shape((B, T, DIM), (B, S, DIM), 2)


@pytest.mark.parametrize("bad", [8.0, 0, (4, -1), "8"])
def test_bad_output_shape_raises_value_error(bad):
    with pytest.raises(ValueError, match="output_shape"):
        MultiHeadAttention(num_heads=2, key_dim=4, output_shape=bad)


def test_grouped_heads_equal_keras_grouped_query_attention():
    """`num_key_value_heads` has keras's `GroupedQueryAttention` layout."""
    q, v = data(12)
    ours = MultiHeadAttention(num_heads=4, key_dim=3, num_key_value_heads=2)
    theirs = keras.layers.GroupQueryAttention(
        head_dim=3, num_query_heads=4, num_key_value_heads=2
    )
    ours(q, v)
    theirs(q, v)
    assert [w.shape for w in ours.get_weights()] == [w.shape for w in theirs.get_weights()]
    theirs.set_weights(ours.get_weights())
    np.testing.assert_allclose(np_(ours(q, v)), np_(theirs(q, v)), atol=1e-5)


def test_sequential_self_attention_with_constructor_causal_mask():
    q, _ = data(13)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, use_causal_mask=True)
    model = keras.Sequential([keras.Input((T, DIM)), layer])
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    theirs(q, q)
    theirs.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np_(model(q)), np_(theirs(q, q, use_causal_mask=True)), atol=1e-5
    )


@pytest.mark.parametrize("implementation", ["dense", "blocked"])
def test_implementations_equal_keras(implementation):
    ours, theirs = pair(num_heads=2, key_dim=4, implementation=implementation)
    q, v = data(14)
    np.testing.assert_allclose(np_(ours(q, v)), np_(theirs(q, v)), atol=1e-5)


def test_activity_regularizer_losses_equal_keras_under_xla():
    # Under XLA on a CPU (and always on JAX) the projections ran as one flat
    # matmul, past `EinsumDense.__call__`, which adds the activity losses:
    # the regularizer was silently dropped from the loss.
    x, _ = data()
    y = np.zeros_like(x)
    regularizer = {"activity_regularizer": keras.regularizers.L1(0.5)}
    ours, theirs = pair(num_heads=2, key_dim=4, **regularizer)
    losses = []
    for layer in (ours, theirs):
        inputs = keras.Input((T, DIM))
        model = keras.Model(inputs, layer(inputs, inputs))
        model.compile("sgd", "mse", jit_compile=keras.backend.backend() != "torch")
        losses.append(model.evaluate(x, y, verbose=0))
        layer(x, x)
        losses.append(sum(float(np_(v)) for v in layer.losses))
    assert len(ours.losses) == len(theirs.losses) == 4
    np.testing.assert_allclose(losses[:2], losses[2:], rtol=1e-5)


def test_a_causal_mask_over_other_attention_axes_is_refused_naming_it():
    # keras builds the causal mask from axis 1; over attention_axes=(2,)
    # ours failed inside the backend with a shape error.
    x = np.zeros((2, 3, 4, 6), "float32")
    layer = MultiHeadAttention(2, 3, attention_axes=(2,))
    with pytest.raises(ValueError, match="argument `use_causal_mask`"):
        layer(x, x, use_causal_mask=True)
    out = MultiHeadAttention(2, 3, attention_axes=(1,))(x, x, use_causal_mask=True)
    assert tuple(out.shape) == x.shape
