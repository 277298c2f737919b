"""Every application trains a step and predicts on the backend in use.

CI runs this file with `KERAS_BACKEND=jax` and `KERAS_BACKEND=torch` beside
the layer harness (on TensorFlow the applications' own test files cover it);
the README's backend table comes from it. XLA (`jit_compile=True`) is used
where the backend compiles with it (TensorFlow, JAX); torch runs eagerly.
"""

import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_attention import applications  # noqa: E402
from tests.test_multi_head_keras import (  # noqa: E402,F401 - run here too
    test_activity_regularizer_losses_equal_keras_under_xla,
)
from tests.test_lora_freezing import (  # noqa: E402,F401 - run here too
    test_enable_lora_keeps_the_layers_its_user_froze_frozen,
)
from tests.test_dataset_batch_checks import (  # noqa: E402,F401 - run here too
    test_ids_outside_the_vocabulary_fail_and_the_weights_are_kept,
)

JIT = keras.backend.backend() != "torch"
# On TensorFlow the application test files cover all of this and more.
pytestmark = pytest.mark.skipif(
    keras.backend.backend() == "tensorflow",
    reason="TensorFlow: covered by the applications' own test files",
)
RNG = np.random.default_rng(0)


def fits(model, x, y, **kwargs):
    history = model.fit(x, y, epochs=2, verbose=0, **kwargs)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses


def test_image_classifiers():
    x = RNG.random((8, 8, 8, 1)).astype("float32")
    y = (np.arange(8) % 3).astype("int32")
    for model in (
        applications.VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
            num_heads=2, mlp_dim=32, num_channels=1,
        ),
        applications.CBAMResNet(image_size=8, num_channels=1, num_classes=3, filters=(8, 16)),
    ):
        model.compile(jit_compile=JIT)
        fits(model, x, y)
        assert model.predict(x, verbose=0).shape == (8, 3)


def test_text_classifier():
    model = applications.TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8,
    )
    ids = RNG.integers(1, 20, (8, 6)).astype("int32")
    model.compile(jit_compile=JIT)
    fits(model, ids, np.arange(8) % 2)
    assert model.predict(ids, verbose=0).shape == (8, 2)


def test_gat_node_classifier():
    from keras_attention.applications.node_classification import (
        GATNodeClassifier,
        node_classification_data,
    )
    from keras_attention.datasets import load_karate_club

    data = node_classification_data(load_karate_club(seed=0))
    model = GATNodeClassifier(num_features=34, num_classes=2, hidden_units=4, num_heads=2)
    model.compile(jit_compile=JIT)
    fits(model, data.inputs, data.labels, sample_weight=data.train_weights)
    assert tuple(model.predict(data.inputs, verbose=0).shape) == (1, 34, 2)


def test_detr():
    from keras_attention.applications.detection import DETR

    model = DETR(
        num_classes=3, num_queries=4, hidden_dim=16, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, feedforward_dim=32,
        backbone_filters=(8, 16),
    )
    images = RNG.random((4, 16, 16, 1)).astype("float32")
    boxes = np.tile(np.array([[[0.5, 0.5, 0.2, 0.2], [0, 0, 0, 0]]], "float32"), (4, 1, 1))
    labels = np.tile(np.array([[1, -1]], "int32"), (4, 1))
    model.compile(optimizer="adam", jit_compile=JIT)
    fits(model, images, {"boxes": boxes, "labels": labels}, batch_size=2)
    found = model.predict_boxes(images[:1])
    assert len(found) == 1


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_translators(kind):
    from keras_attention.applications import Seq2SeqTranslator
    from keras_attention.applications import TransformerTranslator
    from keras_attention.applications import TranslationPreprocessor

    preprocessor = TranslationPreprocessor(source_length=8, target_length=8)
    if kind == "transformer":
        model = TransformerTranslator(
            preprocessor, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32
        )
    else:
        model = Seq2SeqTranslator(preprocessor, embedding_dim=8, hidden_dim=16)
    model.compile(jit_compile=JIT)
    words = ["abc", "de", "fgh", "ab"] * 4
    x, y = model.prepare(words, words)
    fits(model, x, y, batch_size=8)
    assert len(model.translate(words[:2])) == 2
    # A per-sentence weight (B,) weighs every token of its sentence (on
    # torch a (B, 1) weight failed in Keras's in-place masked product).
    weights = (np.arange(16) % 4 != 1).astype("float32")
    fits(model, x, y, batch_size=8, sample_weight=weights)
    weighted = model.evaluate(x, y, sample_weight=weights, return_dict=True, verbose=0)
    kept = model.evaluate(
        {k: v[weights > 0] for k, v in x.items()}, y[weights > 0],
        return_dict=True, verbose=0,
    )
    assert weighted["token_loss"] == pytest.approx(kept["token_loss"], rel=1e-4)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="jax.grad")
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_blocked_equals_dense_band_under_jit(causal):
    import jax

    from keras_attention import ops as attention_ops

    t, window = 22, 4
    q = RNG.normal(size=(2, t, 2, 8)).astype("float32")
    k = RNG.normal(size=(2, t, 1, 8)).astype("float32")
    v = RNG.normal(size=(2, t, 1, 8)).astype("float32")
    distance = np.arange(t)[:, None] - np.arange(t)[None, :]
    band = (distance >= 0) & (distance < window) if causal else abs(distance) < window

    def loss(fn):
        return lambda q, k, v: (lambda o: (o * np.cos(1.0) * o).sum())(fn(q, k, v))

    dense = loss(lambda q, k, v: attention_ops.dot_product_attention(
        q, k, v, attention_mask=band[None], is_causal=causal,
        implementation="dense",
    ))
    windowed = loss(lambda q, k, v: attention_ops.blocked_attention(
        q, k, v, is_causal=causal, block_size=4, query_block_size=8,
        sliding_window=window,
    ))
    want = jax.value_and_grad(dense, argnums=(0, 1, 2))(q, k, v)
    got = jax.jit(jax.value_and_grad(windowed, argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.parametrize("key_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 3])
def test_fused_kernel_takes_alibi_with_masks_and_grouped_heads(key_heads, causal, window):
    # torch's kernel takes a bias or a mask, and no bias with `is_causal`:
    # ALiBi with a padding mask, the causal mask or a window crashed there.
    from keras_attention import ops as attention_ops
    from keras_attention.ops import positions

    q = RNG.normal(size=(2, 7, 4, 8)).astype("float32")
    k, v = (RNG.normal(size=(2, 7, key_heads, 8)).astype("float32") for _ in "kv")
    mask = np.ones((2, 7), bool)
    mask[1, 4:] = False
    mask[1, :2] = False  # causal: queries 0-1 of example 1 see no key
    out = {
        impl: keras.ops.convert_to_numpy(attention_ops.dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=causal, sliding_window=window,
            implementation=impl, alibi_slopes=positions.alibi_slopes(4),
        ))
        for impl in ("dense", "fused")
    }
    np.testing.assert_allclose(out["fused"], out["dense"], atol=2e-6, rtol=2e-6)
    if causal:
        assert np.all(out["fused"][1, :2] == 0.0)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("scaled_dot_product", {}),
        ("additive", {"units": 4}),
        ("multi_head", {"num_heads": 2, "key_dim": 4}),
    ],
)
def test_sequence_layers_on_unknown_lengths_with_embedding_masks(name, kwargs):
    # JAX traces a functional model's unknown lengths as symbolic
    # dimensions; `int()` of one failed in the core's path choice.
    import keras_attention

    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(20, 8, mask_zero=True)(ids)
    attended = keras_attention.get(name, **kwargs)(embedded, embedded)
    assert tuple(attended.shape) == (None, None, 8)
    model = keras.Model(ids, keras.layers.GlobalAveragePooling1D()(attended))
    batch = np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]], "int32")
    pooled = keras.ops.convert_to_numpy(model(batch))
    # The padding changes nothing: the first row alone, unpadded.
    alone = keras.ops.convert_to_numpy(model(batch[:1, :3]))
    np.testing.assert_allclose(pooled[:1], alone, atol=1e-5)


def test_non_local_block_on_an_unknown_image_size():
    import keras_attention

    images = keras.Input((None, None, 6))
    model = keras.Model(images, keras_attention.get("non_local")(images))
    assert tuple(model.output.shape) == (None, None, None, 6)
    assert model(RNG.random((2, 5, 4, 6)).astype("float32")).shape == (2, 5, 4, 6)


@pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="torch traces unknown dimensions with sizes, and the windows are built",
)
def test_local_window_refuses_an_unknown_image_size_by_name():
    import keras_attention

    layer = keras_attention.get("local_window", num_heads=2, window_size=2)
    with pytest.raises(ValueError, match="known height and width"):
        layer(keras.Input((None, None, 8)))


def test_text_classifier_predict_keeps_the_padding_mask():
    # Under JAX's jit a tracer takes no `_keras_mask` attribute (keras keeps
    # it aside): the encoder block read the attribute and dropped the mask,
    # so `predict` (compiled) differed from an eager call on padded ids.
    keras.utils.set_random_seed(0)
    model = applications.TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=2, num_heads=2, mlp_dim=8,
    )
    ids = np.array([[17, 12, 10, 5, 6, 0], [1, 0, 3, 16, 12, 18]], "int32")
    eager = keras.ops.convert_to_numpy(model(ids))
    np.testing.assert_allclose(model.predict(ids, verbose=0), eager, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_the_chunked_path_equals_the_dense_one(monkeypatch, causal):
    # Chunks of 16 rows: 21 queries make two chunks, the second padded.
    from keras_attention import ops as attention_ops
    from keras_attention.ops import dense

    monkeypatch.setattr(dense, "CHUNK_SCORE_BYTES", 16 * 4 * 2 * 2 * 21)
    q = RNG.normal(size=(2, 21, 2, 8)).astype("float32")
    k = RNG.normal(size=(2, 21, 1, 8)).astype("float32")
    v = RNG.normal(size=(2, 21, 1, 8)).astype("float32")
    mask = RNG.random((2, 21)) > 0.2

    def loss(implementation):
        def fn(q, k, v):
            out = attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, is_causal=causal,
                implementation=implementation,
            )
            return keras.ops.sum(out * keras.ops.cos(out))
        return fn

    def value_and_grads(fn):
        if keras.backend.backend() == "jax":
            import jax

            value, grads = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(q, k, v)
            return [np.asarray(value)] + [np.asarray(g) for g in grads]
        import torch

        xs = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        value = fn(*xs)
        value.backward()
        return [value.detach().numpy()] + [x.grad.numpy() for x in xs]

    got, want = value_and_grads(loss("chunked")), value_and_grads(loss("dense"))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="XLA on a CPU: JAX")
def test_dense_core_fast_forms_equal_autodiff_on_jax(monkeypatch):
    # JAX on a CPU takes `ops/xla_cpu.py`'s forms: the unnormalised weights,
    # and (any length here) the looped keys products, then the forward and
    # the backward pair by pair. Against autodiff through the softmax.
    import jax

    from keras_attention import ops as attention_ops

    if jax.default_backend() != "cpu":
        pytest.skip("XLA on a CPU only")
    q = RNG.normal(size=(2, 7, 4, 8)).astype("float32")
    k = RNG.normal(size=(2, 5, 2, 8)).astype("float32")
    v = RNG.normal(size=(2, 5, 2, 6)).astype("float32")
    masks = [RNG.random((2, 7, 5)) > 0.3, RNG.random((2, 4, 7, 5)) > 0.3]
    for mask in masks:  # one for every head, then one a head
        _fast_forms_equal_autodiff(monkeypatch, q, k, v, mask)
    assert {"dense core forward", "dense core backward"} <= {
        c.key[0] for c in attention_ops.dispatch_choices()}


def _fast_forms_equal_autodiff(monkeypatch, q, k, v, mask):
    import jax

    from keras_attention import ops as attention_ops
    from keras_attention.ops import xla_cpu

    def loss(custom):
        def fn(q, k, v):
            out = attention_ops.dot_product_attention(
                q, k, v, attention_mask=mask, implementation="dense",
                custom_gradient=custom,
            )
            return (out * keras.ops.cos(out)).sum()

        return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))

    want = loss(False)(q, k, v)
    for grouped in (2**62, 0):  # keys products looped, then pair by pair
        monkeypatch.setattr(xla_cpu, "_LOOPED_PRODUCT_SIZE", 1)
        monkeypatch.setattr(xla_cpu, "_GROUPED_PRODUCT_SIZE", grouped)
        got = loss(True)(q, k, v)
        # The loss is a sum of terms of about 1 that cancels to ~0.2: an
        # absolute part (2.1e-6 off, relative 1.2e-5, failed one CI run).
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=2e-5)
        for g, w in zip(got[1], want[1]):
            np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="measured on JAX")
def test_auto_measures_the_paths_on_jax(monkeypatch):
    # A long call on JAX's CPU (no fused kernel there) times the dense and
    # blocked paths while it is traced, forward and backward under
    # `jax.grad`, forward alone otherwise, and keeps the faster.
    import jax

    from keras_attention import ops as attention_ops
    from keras_attention.ops import autotune
    from keras_attention.ops import dispatch

    if jax.default_backend() != "cpu":
        pytest.skip("a fused kernel decides elsewhere")
    monkeypatch.setattr(dispatch, "DENSE_THRESHOLD", 100)
    monkeypatch.setattr(autotune, "_OPTIONS", dict(autotune._OPTIONS, enabled=True,
                                                   cache_file=None))
    monkeypatch.setattr(autotune, "_CHOICES", {})
    q = RNG.normal(size=(2, 12, 2, 8)).astype("float32")
    k = RNG.normal(size=(2, 16, 2, 8)).astype("float32")

    def attend(q, k, implementation="auto"):
        out = attention_ops.dot_product_attention(
            q, k, k, is_causal=True, implementation=implementation)
        return (out * keras.ops.cos(out)).sum()

    got = jax.jit(jax.value_and_grad(attend, argnums=(0, 1)))(q, k)
    want = jax.value_and_grad(
        lambda q, k: attend(q, k, "dense"), argnums=(0, 1))(q, k)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, atol=2e-5)
    jax.jit(attend)(q, k)
    chosen = {c.key[2]: c for c in attention_ops.dispatch_choices()
              if c.key[0] == "jax"}
    assert set(chosen) == {"train", "infer"}
    for choice in chosen.values():
        assert set(choice.timings_ms) == {"dense", "blocked"}
        # The fastest, or the rule's (blocked) within timing noise of it.
        assert choice.implementation == autotune._fastest(
            choice.key, choice.timings_ms, rule="blocked"
        ).implementation


def test_the_applications_xla_default_runs_eagerly_on_torch():
    # The translators' and the causal LM's default `jit_compile=True` was
    # `torch.compile` on torch: a recompilation for every batch shape
    # (far slower than eager for a tiny translator's few epochs).
    from keras_attention.applications import TransformerTranslator
    from keras_attention.applications import TranslationPreprocessor

    model = TransformerTranslator(
        TranslationPreprocessor(source_length=8, target_length=8),
        num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32,
    )
    model.compile()
    assert model.jit_compile is (keras.backend.backend() != "torch")
    # The default is saved as one: a file saved on TensorFlow or JAX fits
    # eagerly on torch.
    assert model.get_compile_config()["jit_compile"] is None
    model.compile(jit_compile=True)  # asked for: Keras's meaning
    assert model.jit_compile is True
    assert model.get_compile_config()["jit_compile"] is True


def _as_saved_on_torch(path, torch_path):
    """`path`'s `.keras` file with its optimizer named as torch's Keras
    saves it: `keras.src.backend.torch.optimizers.torch_adam.Adam`."""
    import json
    import zipfile

    with zipfile.ZipFile(path) as source, zipfile.ZipFile(torch_path, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "config.json":
                config = json.loads(data)
                config["compile_config"]["optimizer"].update(
                    module="keras.src.backend.torch.optimizers.torch_adam",
                    registered_name="Adam",
                )
                data = json.dumps(config)
            target.writestr(item, data)


@pytest.mark.parametrize(
    "kind", ["classifier", pytest.param("detr", marks=pytest.mark.large)]
)
def test_a_file_saved_on_torch_loads_with_this_backends_optimizer(kind, tmp_path):
    # Loading such a file gave torch's optimizer on JAX (a TypeError in
    # `fit`) and crashed TensorFlow's process (torch imported after it).
    if kind == "classifier":
        model = applications.TextClassifier(
            vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
            depth=1, num_heads=2, mlp_dim=8,
        )
        model.compile(jit_compile=JIT)
        x, y = RNG.integers(1, 20, (4, 6)).astype("int32"), np.arange(4) % 2
    else:
        model = applications.DETR(
            num_classes=3, num_queries=2, hidden_dim=8, num_heads=2,
            num_encoder_layers=1, num_decoder_layers=1, feedforward_dim=8,
            backbone_filters=(4, 8),
        )
        model.compile(optimizer="adam", jit_compile=JIT)
        x = RNG.random((2, 16, 16, 1)).astype("float32")
        y = {"boxes": np.full((2, 1, 4), 0.5, "float32"),
             "labels": np.ones((2, 1), "int32")}
    # Built and compiled, not trained: the optimizer the file names is the
    # point, and one compiled step (the loaded model's) runs it.
    model(x)
    model.save(tmp_path / "saved.keras")
    _as_saved_on_torch(tmp_path / "saved.keras", tmp_path / "torch.keras")
    loaded = keras.saving.load_model(tmp_path / "torch.keras")
    assert type(loaded.optimizer) is type(model.optimizer)
    loss = loaded.fit(x, y, epochs=1, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss)), loss


@pytest.mark.large  # 14 s: TensorFlow's SavedModel writer and loader
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="jax2tf: JAX's export")
def test_a_masked_layer_exports_as_a_saved_model_on_jax(tmp_path):
    # The dense core's own gradient closed over the mask: jax2tf converts
    # that backward pass apart, where the mask was an unbound tracer.
    import tensorflow as tf

    import keras_attention

    ids = keras.Input((4,), dtype="int32")
    embedded = keras.layers.Embedding(9, 4, mask_zero=True)(ids)
    attended = keras_attention.get("scaled_dot_product", use_causal_mask=True)(
        embedded, embedded)
    model = keras.Model(ids, attended)
    model.export(tmp_path / "saved", format="tf_saved_model", verbose=False)
    batch = np.array([[1, 2, 0, 0], [3, 4, 5, 6]], "int32")
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    got = loaded.serve(tf.constant(batch))
    np.testing.assert_allclose(np.asarray(got), keras.ops.convert_to_numpy(model(batch)),
                               atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's ONNX export")
def test_a_sequence_layer_exports_to_onnx_on_torch(tmp_path):
    # The exporter traces sizes as tensors, a new object each: the batch
    # check counted three batch sizes in `{1, 1, 1}`.
    pytest.importorskip("onnxruntime")
    import onnxruntime

    import keras_attention

    x = RNG.normal(size=(1, 3, 4)).astype("float32")
    inputs = keras.Input((3, 4))
    model = keras.Model(inputs, keras_attention.get("scaled_dot_product")(inputs, inputs))
    want = keras.ops.convert_to_numpy(model(x))
    model.export(str(tmp_path / "model.onnx"), format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's shape polymorphism")
def test_multi_head_attention_traces_with_a_symbolic_length_on_jax():
    # `model.export` on JAX traces unknown sizes as symbolic dimensions;
    # the long-context check compared the length with an int and raised.
    import jax
    from jax import export

    import keras_attention

    layer = keras_attention.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    want = keras.ops.convert_to_numpy(layer(x))
    variables = [v.value for v in layer.trainable_variables]

    def forward(variables, x):
        return layer.stateless_call(variables, [], x)[0]

    def gradient(variables, x):
        return jax.grad(lambda x: forward(variables, x).sum())(x)

    batch, length = export.symbolic_shape("b, t")
    spec = jax.ShapeDtypeStruct((batch, length, 8), "float32")
    exported = export.export(jax.jit(forward))(variables, spec)
    np.testing.assert_allclose(np.asarray(exported.call(variables, x)), want, atol=1e-6)
    # The backward pass too (a SavedModel traces it): the core's gradient
    # compared the symbolic lengths with an int.
    exported = export.export(jax.jit(gradient))(variables, spec)
    np.testing.assert_allclose(
        np.asarray(exported.call(variables, x)), np.asarray(gradient(variables, x)),
        atol=1e-6,
    )


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's ONNX export")
def test_a_layer_with_returned_weights_exports_to_onnx_for_any_length(tmp_path):
    # The exporter traces unknown sizes as 1: the softmax's one-key form
    # (weights all 1) was written into the file for every length.
    pytest.importorskip("onnxruntime")
    import onnxruntime

    import keras_attention

    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, keras_attention.get("additive", units=4)(inputs, inputs))
    model(RNG.normal(size=(2, 3, 4)).astype("float32"))
    model.export(str(tmp_path / "model.onnx"), format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    for length in (1, 5):
        x = RNG.normal(size=(2, length, 4)).astype("float32")
        (got,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(x)), atol=1e-5)


def test_detr_and_its_recipe_save_the_xla_default_as_a_default(tmp_path):
    # `run detection` compiled with `jit_compile=not xla_slower_here(...)`:
    # the file held True, and on torch `torch.compile` made the first
    # predict of a loaded model take minutes.
    from keras_attention.applications import DETR
    from tests.test_detection import TINY

    model = DETR(**TINY)
    model.compile(optimizer="adam")
    assert model.jit_compile is (keras.backend.backend() != "torch")
    assert model.get_compile_config()["jit_compile"] is None
    model(np.zeros((1, 16, 16, 1), "float32"))
    model.save(tmp_path / "detr.keras")
    loaded = keras.models.load_model(tmp_path / "detr.keras")
    assert loaded.jit_compile is model.jit_compile and loaded.optimizer is not None
    model.compile(optimizer="adam", jit_compile=True)  # asked for: kept
    assert model.get_compile_config()["jit_compile"] is True


def test_a_choice_file_entry_names_the_backend_version_and_accelerators():
    # On JAX it named neither: a choice measured before a jax upgrade, or
    # on the same CPU without its GPU, was taken as this machine's.
    from keras_attention.ops import choice_file

    found = choice_file.machine("oneDNN: off")
    assert "accelerators" in found
    if keras.backend.backend() == "jax":
        import jax

        assert found["jax"].startswith(jax.__version__ + "/")


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_graph_attention_reads_no_edge_values_under_torch_compile():
    # Reading the edge ids into NumPy (the eager range check) broke the
    # compiled graph; `torch.compile` leaves that check to eager calls.
    import torch

    from keras_attention.layers import GraphAttention

    layer = GraphAttention(units=4, num_heads=2)
    nodes = torch.ones((5, 3))
    edges = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]], dtype=torch.int32)
    eager = keras.ops.convert_to_numpy(layer([nodes, edges]))
    explained = torch._dynamo.explain(lambda n, e: layer([n, e]))(nodes, edges)
    reasons = " ".join(str(r.reason) for r in explained.break_reasons)
    assert "ndarray" not in reasons and "numpy" not in reasons.lower()
    compiled = torch.compile(lambda n, e: layer([n, e]), backend="eager")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(compiled(nodes, edges)), eager, atol=1e-6
    )


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_sequence_layers_trace_as_one_graph_under_torch_compile():
    # The score scale went through a NumPy float64 (TensorFlow's precision
    # fix), which Dynamo cannot trace: the additive layer, and the
    # multi-head and scaled dot-product layers returning their weights,
    # broke into several graphs.
    import torch

    from keras_attention.layers import AdditiveAttention
    from keras_attention.layers import MultiHeadAttention
    from keras_attention.layers import ScaledDotProductAttention

    x = torch.rand(2, 6, 8)
    calls = {
        "additive": (AdditiveAttention(units=4), lambda l: l([x, x])),
        "multi_head": (MultiHeadAttention(num_heads=2, key_dim=4),
                       lambda l: l(x, return_attention_scores=True)),
        "scaled_dot_product": (ScaledDotProductAttention(),
                               lambda l: l([x, x], return_attention_scores=True)),
    }
    for name, (layer, call) in calls.items():
        call(layer)  # built eagerly
        explained = torch._dynamo.explain(lambda: call(layer))()
        assert explained.graph_break_count == 0, (name, explained.break_reasons)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_image_layers_trace_as_one_graph_under_torch_compile():
    # The local-window layer built its position index and shifted-window
    # mask in NumPy, CBAM pooled with Keras's torch `ops.max` (which
    # checks its result for `.values`), and a Keras layer called after
    # Keras's `ops.pad` (padded windows, Swin's patch merging of odd
    # grids): Dynamo broke each into several graphs.
    import torch

    from keras_attention.applications.patches import PatchMerging
    from keras_attention.layers import CBAM
    from keras_attention.layers import LocalWindowAttention
    from keras_attention.layers import NonLocalBlock

    x = torch.rand(2, 7, 5, 8)  # padded and shifted windows: a mask
    layers = {
        "local_window": (LocalWindowAttention(2, window_size=4, shift_size=2), x),
        "cbam": (CBAM(reduction=2), x),
        "non_local": (NonLocalBlock(), x),
        "patch_merging": (PatchMerging((7, 5)), torch.rand(2, 35, 8)),
    }
    for name, (layer, x) in layers.items():
        eager = keras.ops.convert_to_numpy(layer(x))
        explained = torch._dynamo.explain(lambda t: layer(t))(x)
        assert explained.graph_break_count == 0, (name, explained.break_reasons)
        compiled = torch.compile(lambda t: layer(t), backend="eager")
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(compiled(x)), eager, atol=1e-6
        )


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX transforms")
def test_the_blocked_path_with_a_mask_under_checkpoint_and_scan_equals_dense():
    # The blocked core's custom gradient closed over its mask (the keys'
    # padding, a value mask, ALiBi's slopes): under `jax.checkpoint` or a
    # `lax.scan` the backward met an unbound tracer.
    import jax

    from keras_attention.layers import MultiHeadAttention

    x = RNG.normal(size=(2, 300, 8)).astype("float32")  # keys padded to blocks
    value_mask = np.arange(300)[None] < np.array([[300], [250]])
    layers = {
        name: MultiHeadAttention(
            2, 4, implementation=name, position_encoding="alibi"
        )
        for name in ("blocked", "dense")
    }
    for layer in layers.values():
        layer(x[:, :4])
    layers["dense"].set_weights(layers["blocked"].get_weights())
    weights = [v.value for v in layers["blocked"].trainable_variables]

    def gradient(layer):
        def loss(w, x):
            def block(h, scale):
                out = layer.stateless_call(
                    [u * scale for u in w], [], h, value_mask=value_mask,
                    use_causal_mask=True,
                )[0]
                return h + out, None

            h, _ = jax.lax.scan(
                jax.checkpoint(block), x, np.array([1.0, 0.5], "float32")
            )
            return (h**2).mean()

        return jax.jit(jax.grad(loss))(weights, x)

    for got, want in zip(gradient(layers["blocked"]), gradient(layers["dense"])):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="RematScope: JAX")
def test_layers_made_in_a_remat_scope_train_as_without_it():
    # Under Keras's RematScope `training` reaches the layers traced, and
    # `bool(training)` (for dropout, even at rate 0, and for the measured
    # path's key) failed the model's build.
    from keras_attention.layers import AdditiveAttention
    from keras_attention.layers import MultiHeadAttention

    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    labels = np.array([0, 1])
    losses = []
    for remat in (True, False):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 8))
        scope = keras.RematScope(mode="full") if remat else contextlib.nullcontext()
        with scope:
            attention = MultiHeadAttention(2, 4)
            additive = AdditiveAttention(units=4)
        h = additive([attention(inputs, inputs), inputs])
        pooled = keras.layers.GlobalAveragePooling1D()(h)
        model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
        model.compile(
            "sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        losses.append([model.train_on_batch(x, labels) for _ in range(2)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


X64_SCRIPT = """
import jax
jax.config.update("jax_enable_x64", True)
from keras_attention.applications import CausalLM, TransformerTranslator
translator = TransformerTranslator.from_preset("transformer_dates")
print(translator.translate("March 3, 1998"))
print(translator.translate("March 3, 1998", beam_width=2))
try:
    CausalLM.from_preset("causal_lm_dates").generate_text("14 july 1989 = ")
except RuntimeError as error:
    print(error)
"""


@pytest.mark.large  # CI time (18 s on JAX)
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's x64 mode")
def test_translators_decode_in_jax_x64_mode_and_generation_says_why_not():
    # keras-hub's position embedding adds a Python 0 (int64 under x64) to
    # the decoder's int32 step; its samplers do the same, so CausalLM's
    # generation is refused with the way out rather than a dtype error
    # from deep inside the loop.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", X64_SCRIPT], capture_output=True, text=True,
        env={**os.environ, "KERAS_BACKEND": "jax"}, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-3:-1] == ["1998-03-03", "1998-03-03"], lines
    assert "jax_enable_x64', False" in lines[-1]


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="jax.jvp")
def test_forward_mode_works_with_autodiffs_backward_as_the_readme_says():
    import jax

    from keras_attention.layers import MultiHeadAttention
    from keras_attention.ops import dense_custom_gradient

    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    tangent = RNG.normal(size=x.shape).astype("float32")
    layer = MultiHeadAttention(2, 4)
    layer(x)
    weights = [v.value for v in layer.trainable_variables]

    def f(z):
        return layer.stateless_call(weights, [], z)[0]

    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(f, (x,), (tangent,))
    with dense_custom_gradient(False):
        _, forward = jax.jvp(f, (x,), (tangent,))
        step = 1e-3
        central = (f(x + step * tangent) - f(x - step * tangent)) / (2 * step)
    np.testing.assert_allclose(np.asarray(forward), np.asarray(central), atol=2e-3)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_dynamic_shapes_compile_once_and_as_one_graph_on_torch():
    # The batch check put the symbolic batch size in a set (a guard, so a
    # compile for every batch size), and the causal and window masks called
    # Keras's torch `arange` on a symbolic length, which it refuses.
    import torch
    import torch._dynamo.testing

    from keras_attention.layers import MultiHeadAttention

    layers = {
        "plain": (MultiHeadAttention(2, 8), {}),
        "window": (MultiHeadAttention(2, 8, sliding_window=3), {}),
        "causal scores": (
            MultiHeadAttention(2, 8, position_encoding="alibi"),
            {"use_causal_mask": True, "return_attention_scores": True},
        ),
        # Its memory budget asked `os.sysconf` at each call: a graph break.
        "chunked": (MultiHeadAttention(2, 8, implementation="chunked"), {}),
    }
    for name, (layer, kwargs) in layers.items():
        layer(torch.randn(2, 8, 16), **kwargs)
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
        compiled = torch.compile(
            lambda x: layer(x, **kwargs), dynamic=True, fullgraph=True,
            backend=counter,
        )
        for shape in ((2, 8, 16), (3, 8, 16), (4, 11, 16), (5, 6, 16)):
            x = torch.randn(*shape)
            got = compiled(x)
            want = layer(x, **kwargs)
            for a, b in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
                np.testing.assert_allclose(
                    a.detach().numpy(), b.detach().numpy(), atol=1e-5
                )
        assert counter.frame_count == 1, (name, counter.frame_count)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.func")
@pytest.mark.parametrize("implementation", ["dense", "blocked", "chunked"])
def test_torch_func_goes_through_the_librarys_own_backward(implementation):
    # `torch.func` refused the library's backward ("must override the
    # setup_context staticmethod"); under its transforms a Function of the
    # new form now takes it. 512 queries: two query blocks on the blocked
    # path, whose rows are written into buffers (batched under `vmap`).
    import torch

    from keras_attention.ops import dot_product_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 512, 1, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(2, 512, 512, generator=gen) > 0.3

    def attention(impl, q, k, v, mask, **kwargs):
        return dot_product_attention(
            q, k, v, attention_mask=mask, is_causal=True, implementation=impl, **kwargs
        )

    def transforms(impl, **kwargs):
        def loss(v):
            return (attention(impl, q, k, v, mask, **kwargs) ** 3).sum()

        def row(a, b, c, m):
            return torch.func.grad(
                lambda a: (attention(impl, a[None], b[None], c[None], m[None], **kwargs) ** 2).sum()
            )(a)

        return [
            torch.func.grad(loss)(v),
            torch.func.jacrev(lambda v: (attention(impl, q, k, v, mask, **kwargs) ** 2).sum((1, 2, 3)))(v),
            torch.func.jvp(lambda q: attention(impl, q, k, v, mask, **kwargs), (q,), (torch.ones_like(q),))[1],
            torch.func.jvp(torch.func.grad(loss), (v,), (torch.ones_like(v),))[1],  # Hessian x vector
            torch.func.vmap(row)(q, k, v, mask),
        ]

    reference = transforms("dense", custom_gradient=False)  # autodiff's backward
    for got, want in zip(transforms(implementation), reference):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-10)


def test_the_fused_kernel_is_told_when_flash_attention_is_off(monkeypatch):
    # Keras's own layer passes `flash_attention=False` after
    # `keras.config.disable_flash_attention()`; ours passed nothing, so the
    # kernel could take flash attention (torch on CUDA, JAX on GPU).
    from keras_attention.ops import dispatch

    seen = []
    original = keras.ops.dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("flash_attention"))
        return original(*args, **kwargs)

    monkeypatch.setattr(dispatch.ops, "dot_product_attention", spy)
    q = np.random.default_rng(0).random((1, 4, 2, 8)).astype("float32")
    dispatch.fused_attention(q, q, q)
    keras.config.disable_flash_attention()
    try:
        dispatch.fused_attention(q, q, q)
    finally:
        keras.src.backend.common.global_state.set_global_attribute(
            "flash_attention", None
        )
    assert seen == [None, False]


def test_the_layer_passes_its_flash_attention_to_the_kernel(monkeypatch):
    # Keras's layer passes `flash_attention=True` on (the kernel raises
    # where there is none); ours ran the fused kernel without saying so.
    from keras_attention.layers import MultiHeadAttention
    from keras_attention.ops import dispatch

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("flash_attention"))
        kwargs["flash_attention"] = None
        return original(*args, **kwargs)

    original = keras.ops.dot_product_attention
    monkeypatch.setattr(dispatch.ops, "dot_product_attention", spy)
    x = RNG.normal(size=(1, 4, 8)).astype("float32")
    for flash in (True, False, None):
        MultiHeadAttention(2, 4, flash_attention=flash, implementation="fused")(x)
    assert seen == [True, False, None]


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's autograd")
@pytest.mark.parametrize("implementation", ["dense", "blocked", "chunked"])
def test_second_order_gradients_on_torch_equal_autodiffs(implementation):
    # Keras runs a custom gradient's forward where torch records nothing:
    # the weights (dense core) and the output and log-sum-exp (blocked
    # path) that the backward reads were cut from the inputs, and a
    # Hessian-vector product or gradient penalty came out 50-180 % off,
    # with no error. Float64 (torch's fused kernel is not taken).
    import torch

    from keras_attention.ops import dispatch

    rng = np.random.default_rng(4)
    q, k, v, direction = (
        torch.tensor(rng.normal(size=(2, 9, 2, 4)), requires_grad=True)
        for _ in range(4)
    )

    def second_order(**kwargs):
        out = dispatch.dot_product_attention(q, k, v, is_causal=True, **kwargs)
        loss = (out * torch.cos(out)).sum()
        d_q, d_k = torch.autograd.grad(loss, (q, k), create_graph=True)
        along = torch.autograd.grad((d_q * direction).sum(), (q, k, v),
                                    retain_graph=True)
        penalty = torch.autograd.grad((d_k**2).sum(), (q, k, v))
        return [g.detach().numpy() for g in along + penalty]

    got = second_order(implementation=implementation, block_size=4)
    want = second_order(implementation="dense", custom_gradient=False)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
