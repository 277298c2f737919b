"""Keras's model utilities on every registered layer, as on keras's own.

`clone_model` (with and without `clone_function`), `to_json` /
`model_from_json`, `serialize_keras_object` / `deserialize_keras_object`
with no `custom_objects`, `get_config` / `from_config` with every
constructor argument changed, Keras masks (`Embedding(mask_zero=True)`,
`Masking`, `TimeDistributed`), wrappers, a shared layer, `summary`,
`count_params`, symbolic shapes, `trainable = False` and per-layer dtype
policies.
"""

import inspect
import json

import keras
import numpy as np
import pytest

import keras_attention
from tests.harness import call
from tests.harness import first
from tests.harness import from_list
from tests.harness import load_cases
from tests.harness import make_layer
from tests.harness import symbolic_model
from tests.harness import to_list

CASES = load_cases()
NAMES = sorted(keras_attention.names())
TOKEN_NAMES = ["additive", "multi_head", "scaled_dot_product"]
IDS = np.array([[3, 5, 7, 0, 0], [2, 9, 4, 6, 1]])

# Every constructor argument of every layer, none at its default.
NON_DEFAULT = {
    "additive": dict(
        units=5, dropout=0.25, use_bias=False, kernel_initializer="he_normal",
        seed=3,
    ),
    "scaled_dot_product": dict(
        score_mode="general", dropout=0.1, use_causal_mask=True,
        kernel_initializer="he_normal", seed=4,
    ),
    "multi_head": dict(
        num_heads=4, key_dim=6, value_dim=5, dropout=0.1, use_bias=False,
        output_shape=(6,), attention_axes=(1,), sliding_window=3,
        flash_attention=False, kernel_initializer="he_normal",
        bias_initializer="ones", kernel_regularizer="l2",
        bias_regularizer="l1", activity_regularizer="l2",
        kernel_constraint="non_neg", bias_constraint="unit_norm",
        use_gate=True, seed=5, num_key_value_heads=2, use_causal_mask=True,
        implementation="dense", position_encoding="rope",
        rope_max_wavelength=500.0, rope_scaling_factor=2.0,
        alibi_bias_max=4.0,
    ),
    "cbam": dict(reduction=4, kernel_size=3),
    "channel": dict(reduction=4),
    "spatial": dict(kernel_size=5),
    "non_local": dict(
        mode="concatenation", inter_channels=3, sub_sample=True,
        use_batch_norm=True, zero_init_residual=False,
    ),
    "graph": dict(
        units=3, num_heads=2, concat_heads=False, negative_slope=0.1,
        dropout=0.2, add_self_loops=False, version="v2", use_bias=False,
        activation="elu", kernel_initializer="he_normal",
        bias_initializer="ones", kernel_regularizer="l2",
        bias_regularizer="l1", kernel_constraint="non_neg",
        bias_constraint="unit_norm", seed=6, feature_dropout=0.3,
    ),
    "local_window": dict(
        num_heads=2, window_size=4, shift_size=2, key_dim=5, dropout=0.1,
        use_bias=False, kernel_initializer="he_normal",
        bias_initializer="ones", kernel_regularizer="l2",
        bias_regularizer="l1", seed=7,
    ),
}


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def case_model(name, seed=0, **overrides):
    case = CASES[name]
    inputs = case.make_inputs(np.random.default_rng(seed))
    layer = make_layer(name, case, **overrides)
    return layer, symbolic_model(layer, inputs, case), inputs


def assert_same_outputs(model, other, inputs):
    other.set_weights(model.get_weights())
    np.testing.assert_allclose(
        numpy(other(inputs)), numpy(model(inputs)), rtol=1e-6, atol=1e-6
    )


def comparable(value):
    """A config value as JSON text (keras objects serialized)."""
    if not isinstance(value, (str, int, float, bool, tuple, list, type(None))):
        value = keras.saving.serialize_keras_object(value)
    return json.dumps(value, default=str)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("from_config", [False, True])
def test_clone_model_gives_the_same_outputs(name, from_config):
    _, model, inputs = case_model(name)
    clone_function = (
        (lambda layer: layer.__class__.from_config(layer.get_config()))
        if from_config
        else None
    )
    clone = keras.models.clone_model(model, clone_function=clone_function)
    assert type(clone.layers[-1]) is type(model.layers[-1])
    assert clone.layers[-1] is not model.layers[-1]
    assert_same_outputs(model, clone, inputs)


@pytest.mark.parametrize("name", NAMES)
def test_model_from_json_gives_the_same_outputs(name):
    _, model, inputs = case_model(name)
    # No custom_objects: importing keras_attention registered the classes.
    rebuilt = keras.models.model_from_json(model.to_json())
    assert type(rebuilt.layers[-1]) is type(model.layers[-1])
    assert_same_outputs(model, rebuilt, inputs)


@pytest.mark.parametrize("name", NAMES)
def test_every_constructor_argument_survives_the_config(name):
    cls = keras_attention.get_class(name)
    arguments = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    # A new constructor argument needs a non-default value here.
    assert arguments == set(NON_DEFAULT[name]), name
    layer = cls(
        **NON_DEFAULT[name], name="renamed", trainable=False, dtype="mixed_bfloat16"
    )
    config = layer.get_config()
    text = json.dumps(keras.saving.serialize_keras_object(layer))
    for restored in (
        cls.from_config(config),
        keras.saving.deserialize_keras_object(json.loads(text)),
    ):
        assert type(restored) is cls
        restored_config = restored.get_config()
        for argument in arguments:
            assert comparable(restored_config[argument]) == comparable(
                config[argument]
            ), argument
        assert restored.name == "renamed"
        assert restored.trainable is False
        assert restored.dtype_policy.name == "mixed_bfloat16"


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_embedding_mask_in_a_sequential_model(name):
    layer = make_layer(name, CASES[name])
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(10, 8, mask_zero=True),
            layer,
            keras.layers.GlobalAveragePooling1D(),
        ]
    )
    tokens = keras.Model(model.inputs[0], layer.output)
    padded, short = numpy(tokens(IDS)), numpy(tokens(IDS[:1, :3]))
    np.testing.assert_allclose(padded[0, :3], short[0], atol=1e-6)
    # The pooling reads the mask the layer passed on: the padding is left out.
    np.testing.assert_allclose(
        numpy(model(IDS))[0], short[0].mean(0), rtol=1e-5, atol=1e-6
    )
    clone = keras.models.clone_model(model)
    assert_same_outputs(model, clone, IDS)


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_compute_mask_is_keras_attentions(name):
    layer = make_layer(name, CASES[name])
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    layer(x, x)
    query_mask, value_mask = IDS != 0, np.ones((2, 5), bool)
    reference = keras.layers.Attention()
    reference([x, x])
    for inputs, mask in (([x, x], [query_mask, value_mask]), ([x, x], [None, value_mask])):
        expected = reference.compute_mask(inputs, mask)
        got = layer.compute_mask(inputs, mask)
        if expected is None:
            assert got is None
        else:
            np.testing.assert_array_equal(numpy(got), numpy(expected))
    np.testing.assert_array_equal(numpy(layer.compute_mask(x, query_mask)), query_mask)


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_masking_layer(name):
    inputs = keras.Input((None, 8))
    layer = make_layer(name, CASES[name])
    model = keras.Model(inputs, layer(keras.layers.Masking(0.0)(inputs)))
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    x[0, 3:] = 0.0
    np.testing.assert_allclose(
        numpy(model(x))[0, :3], numpy(model(x[:1, :3]))[0], atol=1e-6
    )


# (Keras's `TimeDistributed` takes one tensor: not `[query, value]`, graphs.)
@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("additive", "graph")])
def test_time_distributed(name):
    case = CASES[name]
    x = case.make_inputs(np.random.default_rng(0))
    frames = np.stack([x, 2.0 * x, x + 1.0], axis=1)
    layer = make_layer(name, case)
    inputs = keras.Input(frames.shape[1:])
    model = keras.Model(inputs, keras.layers.TimeDistributed(layer)(inputs))
    out = numpy(model(frames))
    assert out.shape == frames.shape
    np.testing.assert_allclose(out[:, 2], numpy(layer(frames[:, 2])), atol=1e-5)


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_time_distributed_passes_the_embedding_mask(name):
    ids = np.array([[[3, 5, 0], [2, 0, 0]], [[1, 2, 3], [4, 5, 0]]])
    inputs = keras.Input((2, 3), dtype="int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    layer = make_layer(name, CASES[name])
    model = keras.Model(inputs, keras.layers.TimeDistributed(layer)(embedding(inputs)))
    expected = numpy(layer(embedding(ids[:1, 0, :2])))
    np.testing.assert_allclose(numpy(model(ids))[0, 0, :2], expected[0], atol=1e-6)


def test_bidirectional_lstm_feeds_additive_attention():
    inputs = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    states = keras.layers.Bidirectional(keras.layers.LSTM(6, return_sequences=True))(
        embedded
    )
    summary = keras.layers.Bidirectional(keras.layers.LSTM(6))(embedded)
    context, weights = keras_attention.AdditiveAttention(units=4)(
        summary, states, return_attention_scores=True
    )
    ours = keras_attention.AdditiveAttention(units=4)([states, states])
    theirs = keras.layers.AdditiveAttention()([states, states])
    model = keras.Model(inputs, [context, weights, ours, theirs])
    context, weights, ours, theirs = (numpy(t) for t in model(IDS))
    assert context.shape == (2, 12) and weights.shape == (2, 5)
    assert ours.shape == theirs.shape == (2, 5, 12)
    np.testing.assert_array_equal(weights[0, 3:], 0.0)  # the padding
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_a_layer_shared_by_two_inputs(name):
    layer = make_layer(name, CASES[name])
    a, b = keras.Input((5, 8)), keras.Input((7, 8))
    model = keras.Model([a, b], [layer(a), layer(b)])
    assert len(model.weights) == len(layer.weights)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 7, 8))
    x, y = x.astype("float32"), y.astype("float32")
    _, out_b = model([x, y])
    np.testing.assert_allclose(numpy(out_b), numpy(layer(y)), atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_summary_count_params_and_unknown_sizes(name):
    layer, model, inputs = case_model(name)
    lines = []
    model.summary(print_fn=lambda line, **kwargs: lines.append(line))
    assert type(layer).__name__ in "\n".join(lines)
    assert layer.count_params() == sum(int(np.prod(w.shape)) for w in layer.weights)
    assert model.count_params() == layer.count_params()
    case = CASES[name]
    symbols = []
    for x in to_list(inputs):
        shape = [None] + list(np.shape(x))[1:]
        if name not in ("graph", "local_window"):  # (Swin needs H and W)
            shape[1:-1] = [None] * (len(shape) - 2)
        symbols.append(keras.Input(batch_shape=tuple(shape), dtype=str(x.dtype)))
    fresh = make_layer(name, case)
    output = first(call(fresh, from_list(symbols, inputs), case))
    spec = first(fresh.compute_output_spec(from_list(symbols, inputs), **case.call_kwargs))
    assert tuple(spec.shape) == tuple(output.shape)
    if name != "graph":  # (the graph layer's shape is the node count's)
        assert output.shape[0] is None
        assert tuple(fresh.compute_output_shape(
            [tuple(s.shape) for s in symbols] if len(symbols) > 1 else tuple(symbols[0].shape)
        )) == tuple(output.shape)


FROZEN_NAMES = [name for name in NAMES if name != "scaled_dot_product"]  # weights


@pytest.mark.parametrize("name", FROZEN_NAMES)
def test_frozen_before_build_freezes_every_weight(name):
    """`trainable = False` before the first call (or in the config a model
    is rebuilt from) freezes the projections `build` makes too."""
    case = CASES[name]
    inputs = case.make_inputs(np.random.default_rng(0))
    layer = make_layer(name, case)
    layer.trainable = False
    model = symbolic_model(layer, inputs, case)
    assert layer.weights and model.trainable_weights == []
    assert all(not w.trainable for w in layer.weights)
    clone = keras.models.clone_model(model)
    assert clone.trainable_weights == []
    before = [numpy(w) for w in layer.weights]
    model.compile("sgd", "mse", jit_compile=False)
    target = numpy(model(inputs))
    model.train_on_batch(inputs, target + 1.0)
    for old, new in zip(before, layer.weights):
        np.testing.assert_array_equal(numpy(new), old)


@pytest.mark.parametrize("name", NAMES)
def test_frozen_after_build(name):
    layer, model, _ = case_model(name)
    layer.trainable = False
    assert model.trainable_weights == []
    assert all(not w.trainable for w in layer.weights)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_per_layer_dtype_policy(name, policy):
    case = CASES[name]
    inputs = case.make_inputs(np.random.default_rng(0))
    layer = make_layer(name, case, dtype=keras.DTypePolicy(policy))
    output = first(symbolic_model(layer, inputs, case)(inputs))
    compute = policy.split("_")[1]
    assert keras.backend.standardize_dtype(output.dtype) == compute
    assert all(w.dtype == "float32" for w in layer.weights)
    for sublayer in layer._flatten_layers(include_self=False):
        assert sublayer.dtype_policy.name == policy, sublayer.name


@pytest.mark.parametrize("name", FROZEN_NAMES)
def test_set_weights_with_one_wrong_shape_assigns_none(name):
    # keras's `set_weights` assigned the weights before the first one of
    # another shape, then raised.
    layer, _, _ = case_model(name)
    before = [numpy(w) for w in layer.weights]
    wrong = [value + 1.0 for value in before]
    wrong[-1] = np.zeros(wrong[-1].shape + (2,), "float32")
    index = len(wrong) - 1
    with pytest.raises(ValueError, match=rf"weights\[{index}\] has shape .*No weight"):
        layer.set_weights(wrong)
    for old, new in zip(before, layer.weights):
        np.testing.assert_array_equal(numpy(new), old)
    # The right shape, but a value that does not convert: Keras raised
    # after assigning the weights before it.
    wrong[-1] = np.full(before[-1].shape, "x")
    with pytest.raises(ValueError):
        layer.set_weights(wrong)
    for old, new in zip(before, layer.weights):
        np.testing.assert_array_equal(numpy(new), old)
    layer.set_weights([value + 1.0 for value in before])  # a right list still
    np.testing.assert_array_equal(numpy(layer.weights[0]), before[0] + 1.0)
