"""The shared layer checks, parametrized over every registered layer name."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attention
from tests.harness import (
    call,
    first,
    load_cases,
    make_layer,
    mask_arguments,
    numpy,
    symbolic_model,
    to_list,
    tolerance_close,
)

CASES = load_cases()
NAMES = keras_attention.names()
# Layers registered by keras_attention itself must have a case; plugins
# registered by other packages are checked when they bring one.
OWN = [n for n, o in keras_attention.registry.origins().items() if o == "keras_attention"]


def case_for(name):
    if name not in CASES:
        pytest.skip(f"no harness case for the plugin layer {name!r}")
    return CASES[name]


def built(name, seed=0):
    case = case_for(name)
    inputs = case.make_inputs(np.random.default_rng(seed))
    keras.utils.set_random_seed(seed)
    layer = make_layer(name, case)
    outputs = call(layer, inputs, case)
    return case, layer, inputs, outputs


@pytest.mark.parametrize("name", OWN)
def test_every_own_layer_has_a_case(name):
    assert name in CASES, f"add a LayerCase for {name!r} in tests/cases_*.py"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_names_a_registered_layer(name):
    # Else a plugin's case file that does not import (register) its layer
    # would be silently left out, and the run pass on the built-ins alone.
    assert name in NAMES, (
        f"a harness case names {name!r}, which no layer is registered as: "
        "import the module that registers it in the case file"
    )


@pytest.mark.parametrize("name", NAMES)
def test_reference_values(name):
    case, layer, inputs, outputs = built(name)
    if case.reference is None:
        pytest.skip("no NumPy reference for this layer")
    expected = case.reference(layer, inputs)
    tolerance_close(numpy(first(outputs)), expected, case.atol, "vs NumPy reference")


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip(name):
    case, layer, inputs, outputs = built(name)
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    call(clone, inputs, case)
    clone.set_weights(layer.get_weights())
    tolerance_close(numpy(first(call(clone, inputs, case))), numpy(first(outputs)), 1e-6, "clone")


@pytest.mark.parametrize("name", NAMES)
def test_symbolic_equals_eager_and_keras_file(name, tmp_path):
    case, layer, inputs, outputs = built(name)
    model = symbolic_model(layer, inputs, case)
    expected = numpy(first(outputs))
    tolerance_close(numpy(model(inputs)), expected, 1e-6, "functional model")
    shapes = [tuple(x.shape) for x in to_list(inputs)]
    shape_arg = shapes if isinstance(inputs, (list, tuple)) else shapes[0]
    assert tuple(layer.compute_output_shape(shape_arg)) == expected.shape
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(inputs)), numpy(model(inputs)))


# On the torch backend `jit_compile=True` is `torch.compile`, whose C++
# code generation takes 20-50 s per layer on a 2-core CPU (cold cache: the
# whole CI torch pass 5 min); CI compiles this one (dense products; the
# graph layer's segment sums took another 35 s), `--run-large` every layer.
TORCH_COMPILED = ("multi_head",)


@pytest.mark.parametrize("name", NAMES)
def test_fit_step_with_xla(name, request):
    case = case_for(name)
    if not case.trainable:
        pytest.skip("no trainable weights")
    if (
        keras.backend.backend() == "torch"
        and name not in TORCH_COMPILED
        and not request.config.getoption("--run-large")
    ):
        pytest.skip("torch.compile of this layer's train step: --run-large")
    inputs = case.make_inputs(np.random.default_rng(1))
    keras.utils.set_random_seed(1)
    layer = make_layer(name, case)
    model = symbolic_model(layer, inputs, case)
    target = np.random.default_rng(2).normal(size=model(inputs).shape).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=True)
    before = [w.copy() for w in model.get_weights()]
    x = tuple(inputs) if isinstance(inputs, (list, tuple)) else inputs
    data = tf.data.Dataset.from_tensors((x, target)).repeat(3)
    history = model.fit(data, epochs=1, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    changed = [not np.array_equal(a, b) for a, b in zip(before, model.get_weights())]
    assert any(changed), "no weight changed in the fit step"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision(name, policy):
    case, layer, inputs, outputs = built(name)
    low = make_layer(name, case, dtype=policy)
    call(low, inputs, case)
    low.set_weights(layer.get_weights())
    result = first(call(low, inputs, case))
    assert keras.backend.standardize_dtype(result.dtype) == policy.split("_")[1]
    result = numpy(result).astype("float32")
    assert np.all(np.isfinite(result))
    tolerance_close(result, numpy(first(outputs)), case.low_precision_atol, policy)


@pytest.mark.parametrize("name", NAMES)
def test_masked_values_do_not_matter(name):
    case = case_for(name)
    if case.mask is None:
        pytest.skip("the layer takes no sequence mask")
    rng = np.random.default_rng(3)
    inputs = case.make_inputs(rng)
    mask = case.mask(rng)
    layer = make_layer(name, case)
    items = to_list(inputs)
    masks = [mask] + [None] * (len(items) - 1)
    keras_mask = masks if isinstance(inputs, (list, tuple)) else mask
    out = numpy(first(call(layer, inputs, case, **mask_arguments(layer, inputs, keras_mask))))
    noisy = items[0].copy()
    noisy[~mask] = rng.normal(size=noisy[~mask].shape) * 100
    changed = [noisy] + items[1:] if isinstance(inputs, (list, tuple)) else noisy
    if isinstance(inputs, (list, tuple)) and len(items) == 1:
        changed = [noisy]
    out2 = numpy(first(call(layer, changed, case, **mask_arguments(layer, inputs, keras_mask))))
    np.testing.assert_allclose(out[mask], out2[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_score_contract(name):
    """`return_attention_scores=True` as docs/design.md's score contract says:
    the layout, normalised over the keys (or gates in (0, 1)), taken before
    dropout, zero for a query that sees no key."""
    case = case_for(name)
    contract = case.scores
    if contract is None:
        assert name not in OWN, f"add a ScoreContract to the case of {name!r}"
        pytest.skip(f"no score contract for the plugin layer {name!r}")
    inputs = case.make_inputs(np.random.default_rng(4))
    keras.utils.set_random_seed(4)
    layer = make_layer(name, case, **(contract.dropout or {}))
    out, scores = call(layer, inputs, case, return_attention_scores=True, training=False)
    parts = list(scores) if isinstance(scores, (list, tuple)) else [scores]
    assert [tuple(p.shape) for p in parts] == [tuple(s) for s in contract.shapes(inputs)]
    for part, kind in zip(parts, contract.kinds):
        w = numpy(part).astype("float32")
        assert np.all(np.isfinite(w))
        if kind == "gate":
            assert np.all((w > 0) & (w < 1))
            continue
        assert np.all(w >= 0)
        sums = contract.sums(w, inputs) if contract.sums else w.sum(-1)
        # Each query's weights sum to 1, or are all zero where the query
        # sees no key (e.g. the padding tokens of local windows).
        assert np.all((np.abs(sums - 1.0) < 1e-5) | (sums == 0.0)), sums
        assert np.mean(np.abs(sums - 1.0) < 1e-5) > 0.5
    if contract.dropout:
        out_train, train_scores = call(
            layer, inputs, case, return_attention_scores=True, training=True
        )
        np.testing.assert_allclose(numpy(train_scores), numpy(scores), atol=1e-6)
        assert not np.allclose(numpy(out_train), numpy(out)), "dropout had no effect"
    if contract.no_key:
        kwargs, index = contract.no_key(np.random.default_rng(5), inputs)
        _, masked = call(layer, inputs, case, return_attention_scores=True, **kwargs)
        masked = numpy(masked)
        assert np.all(masked[index] == 0)
        sums = masked.sum(-1)
        seen = np.ones(sums.shape, bool)
        seen[index] = False
        np.testing.assert_allclose(sums[seen], 1.0, atol=1e-5)


def test_a_plugin_following_the_call_contract_gets_its_masks(tmp_path, monkeypatch):
    # A layer written to the documented sequence contract (query_mask,
    # value_mask; no `mask`, which Keras passes only to a call declaring
    # it) is masked the contract's way; and a plugin's own cases, in a file
    # `KERAS_ATTENTION_CASES` names, join the harness.
    from tests import harness
    from tests.test_plugins import TokenPlugin

    layer = TokenPlugin(num_heads=2, key_dim=4)
    x = np.ones((1, 3, 4), "float32")
    mask = np.array([[True, True, False]])
    assert mask_arguments(layer, x, mask) == {"query_mask": mask, "value_mask": mask}
    assert mask_arguments(layer, [x, x], [mask, None]) == {"query_mask": mask}
    assert mask_arguments(layer, [x, x], [None, mask]) == {"value_mask": mask}
    own = keras_attention.get("multi_head", num_heads=1, key_dim=2)
    assert mask_arguments(own, x, mask) == {"mask": mask}
    out = numpy(layer(x, **mask_arguments(layer, x, mask)))
    noisy = x.copy()
    noisy[0, 2] = 100.0
    np.testing.assert_allclose(
        numpy(layer(noisy, **mask_arguments(layer, noisy, mask)))[mask], out[mask]
    )
    cases = tmp_path / "cases_mine.py"
    cases.write_text(
        "from tests.harness import LayerCase\n"
        "CASES = {'test_mine': LayerCase(kwargs={}, make_inputs=None)}\n"
    )
    monkeypatch.setenv(harness.CASES_VARIABLE, str(cases))
    assert "test_mine" in harness.load_cases() and "multi_head" in harness.load_cases()
    monkeypatch.setenv(harness.CASES_VARIABLE, str(tmp_path / "missing.py"))
    with pytest.raises(FileNotFoundError, match="KERAS_ATTENTION_CASES.*missing.py"):
        harness.load_cases()


def test_multi_head_attention_leaves_the_callers_masks_in_place():
    # keras's MultiHeadAttention clears the Keras masks of the tensors it is
    # given; another layer reading the same tensor afterwards then attended
    # to padding. Ours sets them aside for its projections only.
    from keras_attention.layers import MultiHeadAttention
    from keras_attention.layers import ScaledDotProductAttention

    embed = keras.layers.Embedding(20, 8, mask_zero=True)
    ids = np.array([[1, 2, 3, 4], [1, 2, 0, 0]])
    x = embed(ids)
    mask = keras.ops.convert_to_numpy(keras.src.backend.get_keras_mask(x))
    other = ScaledDotProductAttention()
    before = numpy(other(x))
    MultiHeadAttention(num_heads=2, key_dim=4)(x)
    after_mask = keras.src.backend.get_keras_mask(x)
    assert after_mask is not None
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(after_mask), mask)
    np.testing.assert_allclose(numpy(other(x)), before, atol=1e-6)
    # In a functional model: the attention built on the same (q, v) before
    # it sees the values' padding mask too.
    q_ids, v_ids = keras.Input((4,), dtype="int32"), keras.Input((4,), dtype="int32")
    embed_values = keras.layers.Embedding(20, 8, mask_zero=True)
    q, v = embed(q_ids), embed_values(v_ids)
    a = other([q, v])
    b = MultiHeadAttention(num_heads=2, key_dim=4)(q, v)
    model = keras.Model([q_ids, v_ids], [a, b])
    v_ids_value = np.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    got = numpy(model([ids, v_ids_value])[0])
    q_value, v_value = embed(ids), embed_values(v_ids_value)
    expected = numpy(other(
        [q_value, v_value], query_mask=ids > 0, value_mask=v_ids_value > 0
    ))
    np.testing.assert_allclose(got, expected, atol=1e-6)
