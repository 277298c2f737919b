"""`model.export` for every registered layer and the applications.

Each artefact is run by its own runtime (the SavedModel signature,
onnxruntime, the LiteRT interpreter) and must give Keras's outputs within
1e-4 (relative to the outputs' scale).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras_attention  # noqa: E402
from tests.exporting import FORMATS, by_shape, run_exported  # noqa: E402
from tests.harness import load_cases, make_layer, numpy, symbolic_model, tolerance_close  # noqa: E402

pytest.importorskip("onnxruntime")
pytest.importorskip("tf2onnx")
pytest.importorskip("ai_edge_litert")

if keras.backend.backend() != "tensorflow":
    pytest.skip("export is checked on the TensorFlow backend", allow_module_level=True)

CASES = load_cases()
NAMES = [n for n in keras_attention.names() if n in CASES]


def assert_exports(model, inputs, folder, what, formats=FORMATS):
    expected = model(inputs)
    expected = [numpy(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]
    for format in formats:
        outputs = run_exported(model, inputs, format, folder)
        for e in expected:
            tolerance_close(by_shape(outputs, e.shape), e, 1e-4, f"{what} as {format}")


@pytest.mark.parametrize("name", NAMES)
def test_every_layer_exports_to_every_format(name, tmp_path):
    case = CASES[name]
    inputs = case.make_inputs(np.random.default_rng(0))
    keras.utils.set_random_seed(0)
    model = symbolic_model(make_layer(name, case), inputs, case)
    assert_exports(model, inputs, tmp_path, name)


@pytest.mark.parametrize("name", ["additive", "scaled_dot_product"])
def test_one_head_layers_of_unknown_length_run_in_litert(name, tmp_path):
    # `[:, :, None]` on a length unknown when traced is a strided slice
    # with a new axis, which LiteRT runs only with TensorFlow's own ops: the
    # file was written, and its interpreter refused it.
    from keras_attention.layers import AdditiveAttention
    from keras_attention.layers import ScaledDotProductAttention

    layer = AdditiveAttention(4) if name == "additive" else ScaledDotProductAttention()
    inputs = keras.Input((None, 8))
    mask = keras.Input((None,), dtype="bool")
    model = keras.Model(
        [inputs, mask], layer([inputs, inputs], mask=[None, mask])
    )
    x = np.random.default_rng(0).normal(size=(2, 11, 8)).astype("float32")
    valid = np.arange(11)[None] < np.array([[11], [7]])
    assert_exports(model, [x, valid], tmp_path, name, formats=("litert",))


def test_image_classifiers_export(tmp_path):
    from keras_attention.applications import CBAMResNet, VisionTransformer

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((2, 8, 8, 1)).astype("float32")
    vit = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
        num_heads=2, mlp_dim=32, num_channels=1,
    )
    assert_exports(vit, x, tmp_path / "vit", "VisionTransformer")
    resnet = CBAMResNet(image_size=8, num_channels=1, num_classes=3, filters=(8, 16))
    assert_exports(resnet, x, tmp_path / "resnet", "CBAMResNet")


def test_text_classifier_exports(tmp_path):
    from keras_attention.applications import TextClassifier

    keras.utils.set_random_seed(0)
    model = TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8,
    )
    ids = np.array([[2, 5, 7, 0, 0, 0], [3, 4, 5, 6, 7, 8]], "int32")
    assert_exports(model, ids, tmp_path, "TextClassifier")


def test_gat_exports(tmp_path):
    from keras_attention.applications.node_classification import (
        GATNodeClassifier,
        node_classification_data,
    )
    from keras_attention.datasets import load_karate_club

    keras.utils.set_random_seed(0)
    data = node_classification_data(load_karate_club(seed=0))
    model = GATNodeClassifier(num_features=34, num_classes=2, hidden_units=4, num_heads=2)
    assert_exports(model, data.inputs, tmp_path, "GATNodeClassifier")


def test_detr_inference_exports(tmp_path):
    from keras_attention.applications.detection import DETR

    keras.utils.set_random_seed(0)
    detr = DETR(
        num_classes=5, num_queries=4, hidden_dim=16, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, feedforward_dim=32,
        backbone_filters=(8, 16),
    )
    images = keras.Input((16, 16, 1), batch_size=2)
    out = detr(images)
    # The inference signature: class logits (B, Q, C + 1), boxes (B, Q, 4).
    model = keras.Model(images, [out["logits"], out["boxes"]])
    x = np.random.default_rng(0).random((2, 16, 16, 1)).astype("float32")
    assert_exports(model, x, tmp_path, "DETR")


@pytest.mark.parametrize(
    "kind", [pytest.param("transformer", marks=pytest.mark.large), "rnn"]
)
def test_translator_decoding_exports_as_one_saved_model(kind, tmp_path):
    import tensorflow as tf

    from keras_attention.applications import (
        Seq2SeqTranslator,
        TransformerTranslator,
        TranslationPreprocessor,
    )

    keras.utils.set_random_seed(0)
    preprocessor = TranslationPreprocessor(source_length=8, target_length=8)
    if kind == "transformer":
        model = TransformerTranslator(
            preprocessor, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32
        )
    else:
        model = Seq2SeqTranslator(preprocessor, embedding_dim=8, hidden_dim=16)
    source_ids = preprocessor.encode_sources(["abc", "de", "fgh"])
    for beam_width in (1, 2):
        path = str(tmp_path / f"{kind}_{beam_width}")
        model.export_generator(path, beam_width=beam_width, verbose=False)
        expected, _ = model.generate_ids(source_ids, beam_width=beam_width)
        loaded = tf.saved_model.load(path)  # kept: its variables live with it
        served = loaded.generate(tf.constant(source_ids, tf.int32))
        np.testing.assert_array_equal(served.numpy(), expected)
    with pytest.raises(ValueError, match="beam_width"):
        model.export_generator(str(tmp_path / "bad"), beam_width=0)
    assert not os.path.exists(tmp_path / "bad")
    # Keras's own `export` of the teacher-forced model: its signature is the
    # preprocessor's ids (Keras said the translator was never called).
    model.export(str(tmp_path / "forced"), verbose=False)
    x, _ = model.prepare(["abc", "de"], ["ab", "fgh"])
    forced = tf.saved_model.load(str(tmp_path / "forced"))  # kept, as above
    served = forced.serve({k: tf.constant(v, tf.int32) for k, v in x.items()})
    np.testing.assert_allclose(
        served.numpy(), keras.ops.convert_to_numpy(model(x)), atol=1e-5
    )
    # Its serving signature names the inputs (they were `args_0`, `args_0_1`).
    signature = forced.signatures["serving_default"].structured_input_signature[1]
    assert set(signature) == {"source_ids", "target_ids"}
