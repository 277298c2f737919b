"""`keras-attention explore` reads its INPUT for every application: text for
a causal or masked language model, an image file for DETR, named arrays for
a model of named inputs."""

import numpy as np

from keras_attention import cli
from keras_attention.applications import DETR
from keras_attention.applications import CausalLM
from keras_attention.applications import CausalLMPreprocessor
from keras_attention.applications import TextClassifierBackbone
from keras_attention.applications import TextClassifierPreprocessor
from keras_attention.applications.masked_lm import MaskedLanguageModel
from tests.test_explorer import page_data


def explored(tmp_path, capsys, model_path, text):
    page = tmp_path / "page.html"
    code = cli.main(["explore", str(model_path), str(text), "--out", str(page)])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    return page_data(page)


def test_a_causal_lm_reads_text(tmp_path, capsys):
    # Its preprocessor is not callable: "not callable" was a traceback.
    model = CausalLM(preprocessor=CausalLMPreprocessor(), hidden_dim=16,
                     depth=1, num_heads=2)
    model(model.preprocessor.encode("12 = ")[None])
    model.save(tmp_path / "lm.keras")
    data = explored(tmp_path, capsys, tmp_path / "lm.keras", "1 may = ")
    assert data["layers"][0]["keys"] == list("1 may = ")
    # One text is a batch of one: another index is an error, not ignored.
    argv = ["explore", str(tmp_path / "lm.keras"), "1 may", "--index", "1",
            "--out", str(tmp_path / "other.html")]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "`--index`" in capsys.readouterr().err


def test_a_masked_language_model_reads_text_and_named_arrays(tmp_path, capsys):
    texts = ["a good film", "a bad film", "good acting", "bad plot"] * 10
    preprocessor = TextClassifierPreprocessor.from_texts(texts, 60, 12)
    backbone = TextClassifierBackbone(
        vocabulary_size=preprocessor.vocabulary_size, sequence_length=12,
        hidden_dim=16, depth=1, num_heads=2, mlp_dim=16,
    )
    model = MaskedLanguageModel(backbone, preprocessor=preprocessor)
    model.save(tmp_path / "mlm.keras")
    data = explored(tmp_path, capsys, tmp_path / "mlm.keras", "a bad film")
    assert data["layers"][0]["keys"] == ["a", "bad", "film"]
    ids = np.asarray(preprocessor(["a good film"]))
    # Either order of the names: they are passed by name.
    np.savez(tmp_path / "ids.npz", mask_positions=np.zeros((1, model.mask_length), "int32"),
             token_ids=ids)
    assert explored(tmp_path, capsys, tmp_path / "mlm.keras", tmp_path / "ids.npz")["layers"]


def test_detr_reads_an_image_file_in_its_channels_and_size(tmp_path, capsys):
    from matplotlib.image import imsave

    model = DETR(num_classes=3, num_queries=4, hidden_dim=32, backbone_filters=(16, 32))
    model(np.zeros((1, 32, 32, 1), "float32"))
    model.save(tmp_path / "detr.keras")
    imsave(tmp_path / "colour.png", np.random.default_rng(0).random((40, 50, 3)))
    data = explored(tmp_path, capsys, tmp_path / "detr.keras", tmp_path / "colour.png")
    assert data["kind"] == "detection"
    assert (data["image"]["height"], data["image"]["width"]) == (32, 32)
