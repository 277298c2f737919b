"""MultiHeadAttention against keras's, masks, Sequential use and bad input."""

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention.layers import (
    AdditiveAttention,
    MultiHeadAttention,
    ScaledDotProductAttention,
)
from tests.cases_sequence import LUONG_GENERAL, softmax
from tests.harness import values_and_grads

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 7, 16)).astype("float32")
Y = RNG.normal(size=(2, 5, 12)).astype("float32")


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        pytest.param(dict(value_dim=6), marks=pytest.mark.skipif(
            keras.backend.backend() == "jax",
            reason="keras 3.15's JAX `dot_product_attention` (under keras's "
            "MultiHeadAttention) reshapes its output to the query's shape: "
            "value_dim=6 with key_dim=8 raises there",
        )),
        dict(output_shape=10),
        dict(use_bias=False),
    ],
)
def test_multi_head_matches_keras_with_the_same_weights(kwargs):
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8, **kwargs)
    ours = MultiHeadAttention(num_heads=4, key_dim=8, **kwargs)
    theirs(X, Y)
    ours([X, Y])
    assert [w.shape for w in ours.get_weights()] == [w.shape for w in theirs.get_weights()]
    ours.set_weights(theirs.get_weights())
    mask = RNG.random((2, 5)) > 0.3
    mask[:, 0] = True
    a, wa = theirs(X, Y, value_mask=mask, return_attention_scores=True)
    b, wb = ours(X, Y, value_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(np_(b), np_(a), atol=2e-6)
    np.testing.assert_allclose(np_(wb), np_(wa), atol=1e-6)
    a = theirs(X, Y, use_causal_mask=True)
    b = ours(X, Y, use_causal_mask=True)
    np.testing.assert_allclose(np_(b), np_(a), atol=2e-6, rtol=2e-6)


def test_grouped_query_heads_match_keras_group_query_attention():
    theirs = keras.layers.GroupQueryAttention(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    ours = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2)
    theirs(X, Y)
    ours([X, Y])
    ours.set_weights(theirs.get_weights())
    np.testing.assert_allclose(np_(ours([X, Y])), np_(theirs(X, Y)), atol=2e-6)


def test_blocked_implementation_equals_dense_in_the_layer():
    dense = MultiHeadAttention(num_heads=2, key_dim=8, implementation="dense")
    blocked = MultiHeadAttention(num_heads=2, key_dim=8, implementation="blocked")
    dense(X)
    blocked(X)
    blocked.set_weights(dense.get_weights())
    mask = RNG.random((2, 7)) > 0.3
    np.testing.assert_allclose(
        np_(blocked(X, query_mask=mask, use_causal_mask=True)),
        np_(dense(X, query_mask=mask, use_causal_mask=True)),
        atol=1e-5,
    )


def test_sequential_model_trains_and_round_trips(tmp_path):
    model = keras.Sequential(
        [
            keras.Input((10, 8)),
            MultiHeadAttention(num_heads=2, key_dim=4, use_causal_mask=True),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse", jit_compile=True)
    x = RNG.normal(size=(32, 10, 8)).astype("float32")
    y = x.sum(axis=(1, 2))[:, None]
    losses = model.fit(x, y, epochs=5, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    path = str(tmp_path / "seq.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(np_(loaded(x)), np_(model(x)))


def test_keras_masks_flow_from_embedding_through_attention():
    tokens = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    h = MultiHeadAttention(num_heads=2, key_dim=4)(h)
    h, scores = MultiHeadAttention(num_heads=2, key_dim=4)(h, return_attention_scores=True)
    pooled = keras.layers.GlobalAveragePooling1D()(h)  # uses the mask
    model = keras.Model(tokens, [pooled, scores])
    ids = np.array([[3, 4, 5, 0, 0, 0], [7, 8, 9, 10, 11, 0]])
    changed = ids.copy()
    # Padding positions: the mask hides them whatever attends to them.
    pooled_a, scores_a = model(ids)
    assert h._keras_mask is not None
    np.testing.assert_allclose(np_(scores_a)[0, :, :3, 3:], 0.0)
    changed[0, 3:] = 0
    pooled_b, _ = model(changed)
    np.testing.assert_allclose(np_(pooled_a), np_(pooled_b), atol=1e-6)


def test_additive_one_decoder_step_and_masks():
    layer = AdditiveAttention(units=6)
    query = RNG.normal(size=(2, 16)).astype("float32")
    mask = np.array([[True] * 5, [True, True, False, False, False]])
    context, weights = layer([query, Y], mask=[None, mask], return_attention_scores=True)
    assert context.shape == (2, 12) and weights.shape == (2, 5)
    np.testing.assert_allclose(np_(weights)[1, 2:], 0.0)
    np.testing.assert_allclose(np_(weights).sum(-1), 1.0, atol=1e-6)
    w1, w2, b, v = (
        np_(w) for w in (layer.query_kernel, layer.key_kernel, layer.bias, layer.score_kernel)
    )
    scores = np.tanh((query @ w1)[:, None, :] + Y @ w2 + b) @ v
    np.testing.assert_allclose(np_(weights), softmax(scores, mask), atol=1e-6)


def test_additive_projected_key_equals_the_plain_path_values_and_gradients():
    layer = AdditiveAttention(units=6)
    query = RNG.normal(size=(2, 3, 16)).astype("float32")
    mask = np.array([[True] * 5, [True, True, True, False, False]])
    layer([query, Y])  # build

    def run(projected):
        def fn(query, value):
            extra = {"projected_key": layer.project_key(value)} if projected else {}
            out, weights = layer(
                query, value, value_mask=mask, return_attention_scores=True, **extra
            )
            sum_ = keras.ops.sum
            return (out, weights), sum_(out * out) + sum_(weights[..., 0])

        return values_and_grads(fn, query, Y, variables=layer.trainable_variables)

    for plain, fast in zip(run(False), run(True)):
        np.testing.assert_allclose(plain, fast, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="projected_key"):
        layer(query, Y, projected_key=np.zeros((2, 4, 6), "float32"))


@pytest.mark.parametrize(
    "make",
    [lambda: AdditiveAttention(units=6), lambda: ScaledDotProductAttention()],
    ids=["additive", "scaled_dot"],
)
def test_use_causal_mask_equals_the_explicit_lower_triangular_mask(make):
    layer = make()
    causal = np.tril(np.ones((7, 7), bool))[None].repeat(2, 0)
    out, w = layer(X, use_causal_mask=True, return_attention_scores=True)
    ref, ref_w = layer(X, attention_mask=causal, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(ref), atol=1e-6)
    np.testing.assert_allclose(np_(w), np_(ref_w), atol=1e-6)
    np.testing.assert_allclose(np_(w)[:, 0, 1:], 0.0)
    with pytest.raises(ValueError, match="use_causal_mask"):
        layer(X[:, 0], X, use_causal_mask=True)  # one step: no positions


@pytest.mark.parametrize("score_mode", ["scaled_dot", "general"])
def test_dot_product_one_decoder_step_equals_the_first_row(score_mode):
    layer = ScaledDotProductAttention(score_mode=score_mode)
    query = RNG.normal(size=(2, 3, 12 if score_mode == "scaled_dot" else 16))
    query = query.astype("float32")
    mask = np.array([[True] * 5, [True, True, False, False, False]])
    full, full_w = layer(query, Y, value_mask=mask, return_attention_scores=True)
    step, step_w = layer(query[:, 0], Y, value_mask=mask, return_attention_scores=True)
    assert step.shape == (2, 12) and step_w.shape == (2, 5)
    np.testing.assert_allclose(np_(step), np_(full)[:, 0], atol=1e-6)
    np.testing.assert_allclose(np_(step_w), np_(full_w)[:, 0], atol=1e-6)
    with pytest.raises(ValueError, match="needs a `value`"):
        ScaledDotProductAttention()(query[:, 0])


def test_an_unknown_call_argument_is_named():
    with pytest.raises(TypeError, match="projected_key"):
        ScaledDotProductAttention()(X, projected_key=X)
    with pytest.raises(TypeError, match="cache"):
        AdditiveAttention(units=4)(X, cache=X)


def test_a_causal_block_refuses_a_layer_without_use_causal_mask():
    """The decoder block used to drop `use_causal_mask` for a layer that did
    not take it, so each position saw the later ones; `AdditiveAttention`
    now takes it, and a layer without it is refused."""
    from keras_attention.applications.blocks import TransformerDecoderBlock
    from keras_attention.applications.blocks.attention_call import call_attention

    block = TransformerDecoderBlock(2, 32, attention="additive", attention_kwargs={"units": 8})
    tokens, memory = X, np.pad(Y, ((0, 0), (0, 0), (0, 4)))  # (2, 5, 16)
    out = np_(block(tokens, memory, use_causal_mask=True))
    changed = tokens.copy()
    changed[:, 4:] = 0.0
    out_changed = np_(block(changed, memory, use_causal_mask=True))
    np.testing.assert_allclose(out[:, :4], out_changed[:, :4], atol=1e-5)
    assert np.abs(out[:, 4:] - out_changed[:, 4:]).max() > 1e-3
    plain = keras.layers.Dense(16)
    with pytest.raises(ValueError, match="use_causal_mask"):
        call_attention(plain, frozenset(), X, use_causal_mask=True)


def test_luong_general_and_dot_scores():
    inputs = LUONG_GENERAL.make_inputs(np.random.default_rng(1))
    layer = keras_attention.get("scaled_dot_product", **LUONG_GENERAL.kwargs)
    out = layer(inputs)
    np.testing.assert_allclose(np_(out), LUONG_GENERAL.reference(layer, inputs), atol=1e-5)
    dot = ScaledDotProductAttention(score_mode="dot")
    out, w = dot(X, return_attention_scores=True)
    np.testing.assert_allclose(np_(w), softmax(X @ X.transpose(0, 2, 1)), atol=1e-5)
    assert not dot.weights


def test_return_attention_scores_in_a_functional_model():
    q = keras.Input((4, 16))
    v = keras.Input((None, 12))
    for layer, shape in (
        (MultiHeadAttention(2, 4), (None, 2, 4, None)),
        (AdditiveAttention(3), (None, 4, None)),
        (ScaledDotProductAttention("general"), (None, 4, None)),
    ):
        out, scores = layer([q, v], return_attention_scores=True)
        assert tuple(scores.shape) == shape
        model = keras.Model([q, v], [out, scores])
        a, w = model([X[:, :4], Y])
        assert w.shape[-1] == 5


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: MultiHeadAttention(num_heads=0, key_dim=4), "num_heads=0"),
        (lambda: MultiHeadAttention(num_heads=2, key_dim=-1), "key_dim=-1"),
        (lambda: MultiHeadAttention(num_heads=4, key_dim=2, num_key_value_heads=3), "num_key_value_heads=3"),
        (lambda: MultiHeadAttention(num_heads=2, key_dim=2, dropout=1.5), "dropout=1.5"),
        (lambda: AdditiveAttention(units=0), "units=0"),
        (lambda: ScaledDotProductAttention(score_mode="cosine"), "score_mode='cosine'"),
    ],
)
def test_bad_arguments_name_the_argument(make, message):
    with pytest.raises(ValueError, match="Received an invalid value for argument") as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize("symbolic", [False, True])
def test_bad_shapes_fail_alike_eagerly_and_symbolically(symbolic):
    def tensor(shape, dtype="float32"):
        if symbolic:
            return keras.Input(batch_shape=shape, dtype=dtype)
        return np.zeros(shape, dtype)

    with pytest.raises(ValueError, match="query"):
        MultiHeadAttention(2, 4)(tensor((2, 16)))
    with pytest.raises(ValueError, match="query_mask"):
        MultiHeadAttention(2, 4)(tensor((2, 7, 16)), query_mask=tensor((2, 6), "bool"))
    with pytest.raises(ValueError, match="must be equal"):  # keras's wording
        MultiHeadAttention(2, 4)([tensor((2, 7, 16)), tensor((2, 5, 12)), tensor((2, 4, 12))])
    with pytest.raises(ValueError, match="attention_mask"):
        ScaledDotProductAttention()(tensor((2, 7, 16)), attention_mask=tensor((2, 7, 3), "bool"))
    with pytest.raises(ValueError, match="attention_mask"):
        MultiHeadAttention(2, 4)(tensor((2, 7, 16)), attention_mask=tensor((2, 7, 3), "bool"))
    with pytest.raises(ValueError, match="same last dimension"):
        ScaledDotProductAttention()([tensor((2, 7, 16)), tensor((2, 5, 12))])


@pytest.mark.parametrize(
    "make",
    [lambda: AdditiveAttention(units=6), lambda: ScaledDotProductAttention()],
    ids=["additive", "scaled_dot"],
)
def test_single_head_layers_refuse_an_attention_mask_of_several_heads(make):
    # One head: a (B, H, T, S) mask with H > 1 has no meaning (it used to
    # apply its first head only, silently); (B, 1, T, S) is (B, T, S).
    mask = RNG.random((2, 7, 7)) > 0.3
    mask[..., 0] = True
    layer = make()
    out, w = layer(X, attention_mask=mask, return_attention_scores=True)
    out4, w4 = layer(X, attention_mask=mask[:, None], return_attention_scores=True)
    np.testing.assert_allclose(np_(out4), np_(out), atol=1e-6)
    np.testing.assert_allclose(np_(w4), np_(w), atol=1e-6)
    heads = np.stack([mask, np.ones_like(mask)], axis=1)  # (B, 2, T, S)
    with pytest.raises(ValueError, match="attention_mask") as info:
        layer(X, attention_mask=heads)
    assert "(2, 1, 7, 7)" in str(info.value)


@pytest.mark.parametrize(
    "make",
    [lambda: AdditiveAttention(units=6), lambda: ScaledDotProductAttention()],
    ids=["additive", "scaled_dot"],
)
def test_single_head_layers_broadcast_an_attention_mask_as_multi_head_does(make):
    # (T, S), (1, T, S), (B, 1, S), (B, T, 1), (1, 1, T, S): as keras's
    # MultiHeadAttention reads them, each the same as its (B, T, S) copy.
    full = RNG.random((2, 7, 7)) > 0.3
    layer = make()
    for mask in (full[0], full[:1], full[:, :1], full[:, :, :1], full[:1, None]):
        out, w = layer(X, attention_mask=mask, return_attention_scores=True)
        whole = np.broadcast_to(mask.reshape(mask.shape[-3:] if mask.ndim == 4
                                             else mask.shape), full.shape)
        want, want_w = layer(X, attention_mask=whole.copy(), return_attention_scores=True)
        np.testing.assert_array_equal(np_(out), np_(want))
        np.testing.assert_array_equal(np_(w), np_(want_w))
    with pytest.raises(ValueError, match="attention_mask") as info:
        layer(X, attention_mask=full[:, :3])
    assert "(2, 1, 7, 7)" in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AdditiveAttention(units=6),
        lambda: ScaledDotProductAttention(),
        lambda: MultiHeadAttention(2, 4),
    ],
    ids=["additive", "scaled_dot", "multi_head"],
)
def test_masks_given_as_python_lists(make):
    # keras's layers take nested lists as masks (ops.cast converts them).
    value_mask = [[True] * 5, [True, True, False, False, False]]
    query_mask = [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    attention_mask = np.tril(np.ones((7, 5), bool))[None].repeat(2, 0)
    layer = make()
    query = X[..., :12] if isinstance(layer, ScaledDotProductAttention) else X
    for masks in (
        dict(value_mask=value_mask, query_mask=query_mask),
        dict(attention_mask=attention_mask),
    ):
        expected = layer(
            query, Y, **{k: np.array(v) for k, v in masks.items()}
        )
        lists = {k: np.array(v).tolist() for k, v in masks.items()}
        np.testing.assert_allclose(np_(layer(query, Y, **lists)), np_(expected))


@pytest.mark.parametrize(
    "make",
    [
        lambda: AdditiveAttention(units=6),
        lambda: ScaledDotProductAttention(score_mode="general"),
        lambda: MultiHeadAttention(2, 4),
    ],
    ids=["additive", "general", "multi_head"],
)
def test_mismatched_batch_and_lengths_are_named_on_a_built_layer(make):
    # Checked in every call, not only in the first one (`build`): a built
    # layer used to fail deep in TensorFlow (BatchMatMul, AddV2).
    layer = make()
    layer(X, Y)
    with pytest.raises(ValueError, match="batch size"):
        layer(X, np.concatenate([Y, Y]))
    with pytest.raises(ValueError, match="batch size"):
        layer(keras.Input(batch_shape=(2, 7, 16)), keras.Input(batch_shape=(3, 5, 12)))
    with pytest.raises(ValueError, match="key"):
        layer(X, Y, key=np.concatenate([Y, Y], axis=1))


@pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="JAX has no float64 arrays unless `jax_enable_x64` is set (off "
    "by default): float64 inputs become float32",
)
def test_float64_layers_compute_in_float64():
    # The float32 softmax guards low-precision policies; float64 keeps float64
    # (keras's own layer does): keras's float64 MultiHeadAttention to 1e-12.
    x = X.astype("float64")
    ours = MultiHeadAttention(2, 4, dtype="float64")
    theirs = keras.layers.MultiHeadAttention(2, 4, dtype="float64")
    out, w = ours(x, x, return_attention_scores=True)
    theirs.build(x.shape, x.shape)
    theirs.set_weights(ours.get_weights())
    want, want_w = theirs(x, x, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(want), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np_(w), np_(want_w), rtol=0, atol=1e-12)
    images = RNG.normal(size=(2, 4, 4, 8))
    for layer, inputs in (
        (MultiHeadAttention(2, 4, dtype="float64", position_encoding="alibi",
                            use_causal_mask=True), x),
        (ScaledDotProductAttention(dtype="float64"), x),
        (keras_attention.get("non_local", dtype="float64"), images),
        (keras_attention.get("local_window", num_heads=2, window_size=2,
                             dtype="float64"), images),
    ):
        out, w = layer(inputs, return_attention_scores=True)
        assert keras.backend.standardize_dtype(out.dtype) == "float64"
        assert keras.backend.standardize_dtype(w.dtype) == "float64"
        np.testing.assert_allclose(np_(w).sum(-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{}, {"position_encoding": "alibi"}])
def test_scores_dtype_under_mixed_precision_is_the_declared_one(kwargs):
    # keras's layer returns float16 scores under mixed_float16; ALiBi's
    # float32 bias made ours float32 while the symbolic call said float16.
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        _, w = MultiHeadAttention(2, 4, **kwargs)(X, return_attention_scores=True)
        _, spec = MultiHeadAttention(2, 4, **kwargs)(
            keras.Input(X.shape[1:]), return_attention_scores=True
        )
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert keras.backend.standardize_dtype(w.dtype) == spec.dtype == "float16"
