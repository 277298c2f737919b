"""LoRA and quantization of every layer with projection kernels.

The projections are keras `EinsumDense` / `Dense` / `Conv` sublayers, so
`layer.enable_lora(rank)` and `model.quantize(mode)` have keras's meaning:

- LoRA: the base kernels are frozen, the low-rank factors `A`, `B` are
  trainable and start with `B = 0` (outputs unchanged); saving merges
  `A B * alpha / rank` into the kernels, so a `.keras` file reloads as a
  plain model with the same outputs.
- Quantization: `int8` and `float8` kernels for the dense projections
  (keras quantizes no convolution, so `SpatialAttention` keeps a float
  kernel). Outputs stay within a relative error (max abs error / max abs
  output) of 5e-2 for int8 and 2e-1 for float8 (e4m3 keeps 3 mantissa bits)
  of the float model on the harness inputs; measured at most 1.3e-2 and
  1.2e-1. A quantized model's `.keras` file reloads with identical outputs
  (the layers save their sublayers' quantized policies as a
  `DTypePolicyMap`).
- Bad input (a rank that is not a positive integer, LoRA twice, an unknown
  quantization mode) raises a `ValueError` naming the argument and value,
  and leaves the model exactly as it was.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attention
from keras_attention.layers.base import projection_sublayers
from tests.cases_sequence import LUONG_GENERAL
from tests.harness import load_cases
from tests.harness import numpy
from tests.harness import symbolic_model

CASES = dict(load_cases())
CASES["scaled_dot_product"] = LUONG_GENERAL  # the score with a kernel
NAMES = sorted(CASES)
TOLERANCE = {"int8": 5e-2, "float8": 2e-1}


def model_for(name, seed=0):
    case = CASES[name]
    inputs = case.make_inputs(np.random.default_rng(seed))
    keras.utils.set_random_seed(seed)
    layer = keras_attention.get(name, **case.kwargs)
    model = symbolic_model(layer, inputs, case)
    return model, layer, inputs


def snapshot(model):
    return [(v.path, v.trainable, np.array(v.numpy())) for v in model.variables]


def assert_unchanged(model, before):
    after = snapshot(model)
    assert [(p, t) for p, t, _ in after] == [(p, t) for p, t, _ in before]
    for (_, _, a), (_, _, b) in zip(after, before):
        np.testing.assert_array_equal(a, b)


def relative_error(actual, expected):
    return float(np.abs(actual - expected).max()) / max(1.0, float(np.abs(expected).max()))


@pytest.mark.parametrize("name", NAMES)
def test_every_layer_with_kernels_has_projection_sublayers(name):
    _, layer, _ = model_for(name)
    projections = projection_sublayers(layer)
    assert projections, f"{name} has no keras projection sublayer"
    raw = [v.path for v in layer.weights if "kernel" in v.path.split("/")[-1]
           and not any(v.path.startswith(s.path + "/") for s in projections.values())]
    # Raw kernels left on purpose are score vectors, not projections.
    assert all(
        any(word in p for word in ("attention_", "score_kernel", "concat_kernel"))
        for p in raw
    ), raw


@pytest.mark.parametrize("name", NAMES)
def test_enable_lora_freezes_kernels_trains_factors_and_saves_merged(name, tmp_path):
    model, layer, inputs = model_for(name)
    x = tuple(inputs) if isinstance(inputs, (list, tuple)) else inputs
    before = numpy(model(x))
    layer.enable_lora(2)
    for sub in projection_sublayers(layer).values():
        assert sub.lora_enabled and not sub._kernel.trainable
        assert sub.lora_kernel_a.trainable and sub.lora_kernel_b.trainable
    np.testing.assert_allclose(numpy(model(x)), before, atol=1e-6)  # B = 0
    frozen = {s.path: np.array(s._kernel.numpy()) for s in projection_sublayers(layer).values()}
    target = np.random.default_rng(1).normal(size=before.shape).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # One whole batch (graph inputs have no batch axis), as the harness fits.
    model.fit(tf.data.Dataset.from_tensors((x, target)).repeat(2), verbose=0)
    for sub in projection_sublayers(layer).values():
        np.testing.assert_array_equal(sub._kernel.numpy(), frozen[sub.path])
    assert any(np.any(s.lora_kernel_b.numpy()) for s in projection_sublayers(layer).values())
    tuned = numpy(model(x))
    assert not np.allclose(tuned, before)
    path = str(tmp_path / "lora.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(numpy(loaded(x)), tuned, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_bad_lora_calls_raise_and_change_nothing(name):
    model, layer, _ = model_for(name)
    before = snapshot(model)
    for rank in (0, -1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match=f"rank={rank!r}"):
            layer.enable_lora(rank)
        assert_unchanged(model, before)
    with pytest.raises(ValueError, match="target_names"):
        layer.enable_lora(2, target_names=["no_such_projection"])
    assert_unchanged(model, before)
    layer.enable_lora(2)
    after_first = snapshot(model)
    with pytest.raises(ValueError, match="already enabled.*rank=3"):
        layer.enable_lora(3)
    assert_unchanged(model, after_first)


@pytest.mark.parametrize("mode", ["int8", "float8"])
@pytest.mark.parametrize("name", NAMES)
def test_quantize_stays_close_and_round_trips(name, mode, tmp_path):
    model, layer, inputs = model_for(name)
    x = tuple(inputs) if isinstance(inputs, (list, tuple)) else inputs
    expected = numpy(model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # leaves without kernels say so
        model.quantize(mode)
    dense = [
        s for s in projection_sublayers(layer).values()
        if isinstance(s, (keras.layers.Dense, keras.layers.EinsumDense))
    ]
    if not dense:
        pytest.skip("keras quantizes no convolution")
    assert all(s.quantization_mode == mode for s in dense)
    if mode == "int8":
        assert all(keras.backend.standardize_dtype(s._kernel.dtype) == "int8" for s in dense)
    quantized = numpy(model(x))
    assert relative_error(quantized, expected) <= TOLERANCE[mode]
    path = str(tmp_path / "quantized.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(x)), quantized)


@pytest.mark.parametrize("name", ["multi_head", "channel", "cbam", "non_local", "local_window"])
def test_quantized_layer_in_a_sequential_keras_file_loads(name, tmp_path):
    # A Sequential's name leads its layers' paths when they are quantized,
    # not when they are rebuilt from the file: the policies must still match.
    x = CASES[name].make_inputs(np.random.default_rng(0))
    inner = keras.Sequential([
        keras.Input(x.shape[1:]), keras_attention.get(name, **CASES[name].kwargs),
    ])
    inputs = keras.Input(x.shape[1:])
    for model in (inner, keras.Model(inputs, inner(inputs))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # leaves without kernels say so
            model.quantize("int8") if model is inner else None
        expected = numpy(model(x))
        path = str(tmp_path / "sequential.keras")
        model.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
        modes = [sorted(_modes(m).values()) for m in (loaded, model)]
        assert modes[0] == modes[1] and "int8" in modes[0]
        np.testing.assert_array_equal(numpy(loaded(x)), expected)


@pytest.mark.parametrize("name", ["multi_head", "additive", "cbam"])
def test_unknown_quantization_mode_raises_and_changes_nothing(name):
    model, _, _ = model_for(name)
    before = snapshot(model)
    with pytest.raises(ValueError, match="int3"):
        model.quantize("int3")
    assert_unchanged(model, before)
    assert all(layer.quantization_mode is None for layer in model._flatten_layers())


def test_enable_lora_on_a_preset_backbone_trains_only_the_factors_and_head():
    from keras_attention.applications import VisionTransformer
    from keras_attention.layers import enable_lora

    model = VisionTransformer.from_preset("vit_digits")
    x = np.random.default_rng(0).random((8, 16, 16, 1)).astype("float32")
    y = np.arange(8) % 10
    before = numpy(model(x))
    full = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    backbone = snapshot(model.backbone)
    targets = model.backbone.enable_lora(rank=2)  # keras-hub's method
    assert targets and all(p.split("/")[-1] in ("query", "value") for p in targets)
    np.testing.assert_allclose(numpy(model(x)), before, atol=1e-6)
    trainable = {w.path for w in model.trainable_weights}
    backbone_trainable = {w.path for w in model.backbone.trainable_weights}
    # In the backbone: the factors and the targets' biases, nothing else.
    assert backbone_trainable == {
        w.path for s in targets.values()
        for w in (s.lora_kernel_a, s.lora_kernel_b, s.bias)
    }
    lora = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert lora < full / 4, (lora, full)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    now = {v.path: v for v in model.backbone.variables}
    for path, _, old in backbone:
        if path not in backbone_trainable and "seed_generator" not in path:
            np.testing.assert_array_equal(now[path].numpy(), old, err_msg=path)
    assert trainable  # the head still trains
    # Twice: refused, and nothing changes.
    after = snapshot(model)
    with pytest.raises(ValueError, match="already enabled.*rank=2"):
        enable_lora(model.backbone, rank=2)
    with pytest.raises(ValueError, match="rank=0"):
        enable_lora(model.backbone, rank=0)
    assert_unchanged(model, after)


@pytest.mark.parametrize("name", ["multi_head", "additive", "non_local", "graph"])
def test_layer_quantize_equals_model_quantize(name):
    model, layer, inputs = model_for(name)
    x = tuple(inputs) if isinstance(inputs, (list, tuple)) else inputs
    twin, _, _ = model_for(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twin.quantize("int8")
    before = snapshot(model)
    for bad in ("int3", "int2"):
        # keras checks the mode first, in its wording (`mode=int3`).
        with pytest.raises(ValueError, match=f"mode='?{bad}'?"):
            layer.quantize(bad)
        assert_unchanged(model, before)
    layer.quantize("int8")
    np.testing.assert_array_equal(numpy(model(x)), numpy(twin(x)))
    after = snapshot(model)
    with pytest.raises(ValueError, match="already quantized"):
        layer.quantize("int8")
    assert_unchanged(model, after)


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_model_quantize_skips_a_weightless_layer_as_keras_does(mode):
    # keras's `model.quantize` calls `quantize` on every leaf layer and
    # skips, with a warning, the ones without weights to quantize
    # (`keras.layers.Attention`); the default scores have no kernel.
    from keras_attention.layers import ScaledDotProductAttention

    x = keras.Input((5, 8))
    attention = ScaledDotProductAttention()
    dense = keras.layers.Dense(3)
    model = keras.Model(x, dense(attention(x)))
    data = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    expected = numpy(model(data))
    with pytest.warns(UserWarning, match="no dense projections"):
        model.quantize(mode)
    assert dense.quantization_mode == mode
    assert relative_error(numpy(model(data)), expected) <= 0.2
    # Called on the layer itself, it is still a ValueError naming the mode.
    with pytest.raises(ValueError, match=f"mode='{mode}'"):
        attention.quantize(mode)


@pytest.mark.parametrize("mode", ["gptq", "awq"])
def test_a_weightless_layer_is_skipped_by_gptq_and_awq_too(mode):
    # `model.quantize("gptq", config)` calls every leaf layer's `quantize`
    # and skips a `NotImplementedError`: ours raised a plain ValueError on
    # the mode first, which ended the whole quantization.
    from keras_attention.layers import ScaledDotProductAttention

    attention = ScaledDotProductAttention()
    attention(np.ones((1, 3, 4), "float32"))
    # The class's method: keras's per-instance wrapper wants a GPTQ/AWQ
    # config (a calibration set) before it calls it.
    with pytest.raises(NotImplementedError, match="no dense projections"):
        type(attention).quantize(attention, mode)


def _outputs(model, x):
    y = model(x)
    if isinstance(y, dict):  # DETR: logits and boxes
        return {k: numpy(v) for k, v in y.items()}
    return {"": numpy(y)}


def _modes(model):
    return {
        layer.path: layer.quantization_mode
        for layer in model._flatten_layers() if layer.quantization_mode
    }


def _quantized_and_loaded(model, x, tmp_path):
    """`(loaded, outputs)`: `model` quantized to int8, saved to a `.keras`
    file and loaded back, and the quantized model's outputs on `x`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    quantized = _outputs(model, x)
    path = str(tmp_path / "quantized.keras")
    model.save(path)
    return keras.saving.load_model(path), quantized


@pytest.mark.parametrize("application", ["vit", "text"])
def test_quantized_application_keras_file_loads(application, tmp_path):
    # An application's config is its constructor's arguments: rebuilt from
    # it, its layers were float and could not load the quantized weights
    # ("Layer 'key' expected 2 variables, but received 3").
    from keras_attention import applications

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if application == "vit":
        model = applications.VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1,
        )
        x = rng.random((2, 8, 8, 1)).astype("float32")
    else:
        model = applications.TextClassifier(
            vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
            depth=1, num_heads=2, mlp_dim=8, attention="additive",
        )
        x = rng.integers(0, 20, (2, 6)).astype("int32")
    loaded, quantized = _quantized_and_loaded(model, x, tmp_path)
    modes = _modes(loaded)
    assert "predictions" in modes and any("attention" in p for p in modes), modes
    np.testing.assert_array_equal(_outputs(loaded, x)[""], quantized[""])
    # The backbone alone too.
    model.backbone.save(str(tmp_path / "backbone.keras"))
    backbone = keras.saving.load_model(str(tmp_path / "backbone.keras"))
    np.testing.assert_array_equal(numpy(backbone(x)), numpy(model.backbone(x)))


def _tiny_subclassed_application(kind):
    """`(model, inputs)`: a built translator or DETR, whose config is its
    constructor's arguments and whose layers are not a functional graph."""
    from keras_attention import applications

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if kind == "detr":
        model = applications.DETR(
            num_classes=3, num_queries=4, hidden_dim=16, num_heads=2,
            num_encoder_layers=1, num_decoder_layers=1, feedforward_dim=32,
            backbone_filters=(8, 16),
        )
        x = rng.random((2, 16, 16, 1)).astype("float32")
        model(x)
        return model, x
    preprocessor = applications.TranslationPreprocessor(
        source_length=6, target_length=6
    )
    if kind == "transformer":
        model = applications.TransformerTranslator(
            preprocessor, num_layers=1, hidden_dim=16, num_heads=2,
            intermediate_dim=32,
        )
    else:
        model = applications.Seq2SeqTranslator(
            preprocessor, embedding_dim=8, hidden_dim=16
        )
    words = ["abc", "bca", "cab"]
    return model, model.prepare(words, words)[0]


@pytest.mark.parametrize("kind", ["transformer", "seq2seq", "detr"])
def test_quantized_and_frozen_subclassed_application_keras_file_loads(
    kind, tmp_path
):
    # The translators' and DETR's configs held no quantized layers, so their
    # quantized `.keras` files did not load ("Layer 'key' expected 2
    # variables, but received 0"), and frozen layers came back trainable.
    model, x = _tiny_subclassed_application(kind)
    frozen = model.layers[0].name
    model.get_layer(frozen).trainable = False
    loaded, quantized = _quantized_and_loaded(model, x, tmp_path)
    assert _modes(loaded) == _modes(model) and _modes(model)
    assert not loaded.get_layer(frozen).trainable
    got = _outputs(loaded, x)
    for key, value in quantized.items():
        np.testing.assert_array_equal(got[key], value)


def test_quantize_collects_only_objects_made_while_it_runs(monkeypatch):
    # Keras runs `gc.collect()` per replaced kernel; over everything the
    # imports left that took seconds (BENCHMARKS.md, `quantize`). During an
    # application's `quantize` the older objects are frozen out of the
    # collector's way, and unfrozen after; a caller's own freeze is kept.
    import gc

    from keras_attention import applications

    keras.utils.set_random_seed(0)
    model = applications.VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    frozen_during = []
    collect = gc.collect
    monkeypatch.setattr(
        gc, "collect",
        lambda *args: frozen_during.append(gc.get_freeze_count()) or collect(*args),
    )
    already = gc.get_freeze_count()  # tests/conftest.py freezes after collection
    gc.unfreeze()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.quantize("int8")
        assert gc.get_freeze_count() == 0
        # One collection per replaced kernel while frozen, one after.
        assert len(frozen_during) > 2 and all(frozen_during[:-1]), frozen_during
        assert frozen_during[-1] == 0
    finally:
        if already:
            gc.freeze()
    # Something frozen already: left as the caller set it.
    frozen_during.clear()
    model = applications.VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    gc.freeze()
    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    monkeypatch.undo()
    assert calls == [] and gc.get_freeze_count() > 0
    assert model.get_layer("predictions").quantization_mode == "int8"
    if not already:
        gc.unfreeze()


def test_backbone_enable_lora_target_names_none_takes_the_default():
    # keras-hub's `enable_lora(rank, target_layer_names=None)` takes its
    # default targets; ours raised a TypeError from `list(None)`.
    from keras_attention.applications import VisionTransformer

    def tiny():
        keras.utils.set_random_seed(0)
        return VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1,
        )

    default = tiny().backbone.enable_lora(2)
    model = tiny()
    assert sorted(model.backbone.enable_lora(2, target_names=None)) == sorted(default)
    before = snapshot(model)
    for bad in (3, {"query": 1}):
        with pytest.raises(ValueError, match="target_names"):
            model.backbone.enable_lora(2, target_names=bad)
        assert_unchanged(model, before)


def test_default_lora_targets_are_each_layers_own():
    """With no `target_names`, a Swin-style backbone adapts its window
    attention's fused `qkv` (it raised: no `query`/`value` there), a
    multi-head one its query and value, as before."""
    from keras_attention.applications import VisionTransformer

    def tiny(**options):
        return VisionTransformer(
            image_size=8, patch_size=2, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1, **options,
        )

    swin = tiny(attention="local_window", window_size=2)
    adapted = swin.backbone.enable_lora(2)
    assert adapted and {p.split("/")[-1] for p in adapted} == {"qkv"}
    x = np.random.default_rng(0).random((2, 8, 8, 1), "float32")
    swin.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    swin.fit(x, np.array([0, 1]), epochs=1, verbose=0)
    vit = tiny()
    assert {p.split("/")[-1] for p in vit.backbone.enable_lora(2)} == {
        "query", "value"
    }


def test_default_lora_targets_of_the_image_and_graph_layers():
    # CBAM, the non-local block and GAT named no targets of their own, so
    # the default (query, value) matched nothing: a ValueError about a
    # `target_names` the user had not given.
    from keras_attention.applications import CBAMResNet
    from keras_attention.applications import GATNodeClassifier
    from keras_attention.applications import VisionTransformer

    resnet = CBAMResNet(
        image_size=8, num_classes=2, filters=(4,), blocks_per_stage=1,
        num_channels=1, attention="cbam",
    )
    assert {p.split("/")[-1] for p in resnet.backbone.enable_lora(2)} == {
        "hidden", "output", "conv"
    }
    vit = VisionTransformer(
        image_size=8, patch_size=2, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1, attention="non_local",
    )
    assert {p.split("/")[-1] for p in vit.backbone.enable_lora(2)} == {
        "theta", "g", "output"
    }
    for version, names in (("v1", {"projection"}), ("v2", {"source", "target"})):
        gat = GATNodeClassifier(num_features=4, num_classes=2, hidden_units=2,
                                num_heads=2, version=version)
        gat([np.zeros((1, 3, 4), "float32"), np.array([[[0, 1], [1, 2]]], "int32")])
        assert {p.split("/")[-1] for p in keras_attention.layers.enable_lora(gat, 2)} == names


def test_default_lora_targets_of_the_additive_and_luong_general_layers():
    # The default (query, value) adapted the additive score's W1 only (it
    # has no value projection) and named nothing of Luong's `general` W.
    from keras_attention.layers import AdditiveAttention
    from keras_attention.layers import ScaledDotProductAttention

    for layer, names in (
        (AdditiveAttention(units=4), {"query", "key"}),
        (ScaledDotProductAttention(score_mode="general"), {"general"}),
    ):
        q = keras.Input((3, 4))
        model = keras.Model(q, layer([q, q]))
        adapted = keras_attention.layers.enable_lora(model, 2)
        assert {p.split("/")[-1] for p in adapted} == names, type(layer).__name__


def test_model_wide_lora_freezing_is_not_saved(tmp_path):
    # The translators, DETR and GAT have no backbone: the model-wide
    # `enable_lora` froze their leaf layers, the file recorded them as
    # frozen, and the loaded model (the updates merged, no LoRA) never
    # trained its embeddings, norms and output projection again.
    from keras_attention.applications import TransformerTranslator
    from keras_attention.applications import VisionTransformer

    def trainable_count(model):
        return sum(int(np.prod(w.shape)) for w in model.trainable_weights)

    translator = TransformerTranslator(
        num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16
    )
    before = trainable_count(translator)
    translator.get_layer("decoder_norm").trainable = False  # the user's own
    frozen_by_user = trainable_count(translator)
    keras_attention.layers.enable_lora(translator, 2)
    assert trainable_count(translator) < frozen_by_user < before
    translator.save(tmp_path / "translator.keras")
    loaded = keras.saving.load_model(tmp_path / "translator.keras")
    assert trainable_count(loaded) == frozen_by_user
    assert not loaded.get_layer("decoder_norm").trainable
    vit = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    before = trainable_count(vit)
    keras_attention.layers.enable_lora(vit.backbone, 2)  # the docstring's route
    vit.save(tmp_path / "vit.keras")
    assert trainable_count(keras.saving.load_model(tmp_path / "vit.keras")) == before


def test_lora_on_a_float8_model_is_refused_before_anything_changes():
    from keras_attention.applications import VisionTransformer

    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    model.quantize("float8")
    before = snapshot(model)
    trainable = len(model.trainable_weights)
    with pytest.raises(ValueError, match="float8"):
        model.backbone.enable_lora(2)
    assert_unchanged(model, before)
    assert len(model.trainable_weights) == trainable


def test_layer_lora_on_a_float8_layer_is_refused_before_anything_changes():
    # The model-wide call refused it; the layer's own `enable_lora` took it,
    # and every call of the model failed after (keras's float8 has no LoRA).
    from keras_attention.layers import MultiHeadAttention

    x = keras.Input((3, 8))
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    model = keras.Model(x, layer(x))
    model.quantize("float8")
    before = snapshot(model)
    with pytest.raises(ValueError, match="float8"):
        layer.enable_lora(2)
    assert_unchanged(model, before)
    model(np.ones((1, 3, 8), "float32"))


def test_application_quantize_leaves_out_keras_per_layer_warnings():
    # Keras warns once per layer without a quantized form (norms, dropout,
    # the input): half a dozen a call, read as failures; and NumPy 2's
    # DeprecationWarning from Keras's quantizers, once per kernel.
    from keras_attention.applications import VisionTransformer

    model = VisionTransformer(image_size=8, patch_size=4, num_classes=2,
                              hidden_dim=8, depth=1, num_heads=2, mlp_dim=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    assert not [w for w in caught if "quantize` method" in str(w.message)]
    assert not [w for w in caught if "copy keyword" in str(w.message)]
    assert model.get_layer("predictions").quantization_mode == "int8"


def test_model_wide_lora_refuses_a_second_call_and_a_misspelt_target():
    # A second call with other targets froze the first one's factors (and
    # its own, whose layers the first had frozen); a misspelt name beside
    # a right one was skipped without a word.
    from keras_attention.applications import VisionTransformer

    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    before = snapshot(model)
    trainable = [w.path for w in model.trainable_weights]
    with pytest.raises(ValueError, match=r"unknown: \['valeu'\]"):
        model.backbone.enable_lora(4, target_names=["query", "valeu"])
    assert_unchanged(model, before)
    assert [w.path for w in model.trainable_weights] == trainable
    model.backbone.enable_lora(4)
    after = snapshot(model)
    trainable = [w.path for w in model.trainable_weights]
    with pytest.raises(ValueError, match="already enabled.*target_names=\\['key'\\]"):
        model.backbone.enable_lora(4, target_names=["key"])
    assert_unchanged(model, after)
    assert [w.path for w in model.trainable_weights] == trainable
    assert any("lora_kernel" in path for path in trainable)


def test_lora_on_a_frozen_backbone_trains_its_factors(tmp_path):
    # keras-hub's `enable_lora` makes the model trainable first; ours left
    # a frozen backbone without a trainable factor.
    from keras_attention.applications import VisionTransformer

    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    model.backbone.get_layer("final_norm").trainable = False
    model.backbone.trainable = False
    model.backbone.enable_lora(2)
    paths = [w.path for w in model.backbone.trainable_weights]
    assert paths and all("lora_kernel" in p or p.endswith("bias") for p in paths)
    assert sum("lora_kernel" in p for p in paths) == 2 * 2  # query, value: a and b
    # The file freezes what was frozen before, layer by layer (the leaves:
    # a frozen container's are frozen with it).
    model.save(tmp_path / "vit.keras")
    loaded = keras.saving.load_model(tmp_path / "vit.keras")
    assert not loaded.backbone.get_layer("final_norm").trainable


def test_application_quantize_checks_every_layer_before_the_first_change():
    # A quantized head made Keras quantize the backbone, then raise: half a
    # model in int8, its config changed. float8 after LoRA went through and
    # the model could not be called (keras's float8 call has no LoRA path).
    from keras_attention.applications import VisionTransformer

    def vit():
        return VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_channels=1,
        )

    model = vit()
    model.get_layer("predictions").quantize("int8")
    before, config = snapshot(model), model.get_config()
    with pytest.raises(ValueError, match=r"\['predictions'\].*already quantized"):
        model.quantize("int8")
    assert_unchanged(model, before)
    assert model.get_config() == config
    model = vit()
    model.backbone.enable_lora(2, target_names=["value"])
    before = snapshot(model)
    with pytest.raises(ValueError, match="float8 cannot quantize.*value.*LoRA"):
        model.quantize("float8")
    assert_unchanged(model, before)
    model.quantize("int8")  # int8 takes LoRA (QLoRA-style)
    model(np.zeros((1, 8, 8, 1), "float32"))


def test_a_head_activation_keras_cannot_read_is_named():
    from keras_attention.applications import VisionTransformer

    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    with pytest.raises(ValueError, match="argument `activation`.*nope"):
        model.with_head(2, activation="nope")
