"""Hugging Face BERT checkpoints convert exactly, or not at all.

The reference models are built locally from small random `BertConfig`s (no
download); the bert-base layout runs under `--run-large`. Hidden states,
pooled outputs and logits are compared on padded inputs with two token
types, within 1e-4 in float32; padded positions (which Hugging Face still
computes and this library zeroes) are left out of the comparison.
"""

import json
import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the converters' tests need torch")
transformers = pytest.importorskip(
    "transformers", reason="the converters' tests need transformers"
)

from keras_attention.applications import TextClassifier  # noqa: E402
from keras_attention.applications import TextClassifierBackbone  # noqa: E402
from keras_attention.applications.bert_preprocessor import BertPreprocessor  # noqa: E402

ATOL = 1e-4
LENGTH = 12
VOCABULARY = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was",
    "not", "good", "bad", "a", "great", "story", "##s", "##ly", "act",
    "##ing", ",", ".", "!", "it", "is", "cafe", "movie", "very",
] + [f"w{i}" for i in range(34)]


def _config(**options):
    defaults = dict(
        vocab_size=len(VOCABULARY), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=24, type_vocab_size=2,
    )
    return transformers.BertConfig(**{**defaults, **options})


def _reference(kind="BertForSequenceClassification", seed=0, **options):
    torch.manual_seed(seed)
    return getattr(transformers, kind)(_config(**options)).eval()


def _inputs(seed=0, length=LENGTH, vocabulary_size=len(VOCABULARY)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocabulary_size, (3, length)).astype("int32")
    ids[:, 0] = 2
    ids[1, 8:] = 0
    ids[2, 5:] = 0
    types = np.zeros_like(ids)
    types[:, 4:] = 1
    types[ids == 0] = 0
    return {"token_ids": ids, "token_type_ids": types}


def _torch_outputs(reference, inputs):
    ids = inputs["token_ids"]
    with torch.no_grad():
        return reference(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
            token_type_ids=torch.tensor(inputs["token_type_ids"], dtype=torch.long),
            output_hidden_states=True,
        )


def _logit_difference(reference, model, inputs=None):
    inputs = inputs or _inputs()
    ours = keras.ops.convert_to_numpy(model(inputs, training=False))
    return np.abs(ours - _torch_outputs(reference, inputs).logits.numpy()).max()


def test_bert_for_sequence_classification_converts_exactly():
    reference = _reference(num_labels=3)
    model = TextClassifier.from_transformers(reference, sequence_length=LENGTH)
    inputs = _inputs()
    expected = _torch_outputs(reference, inputs)
    assert _logit_difference(reference, model, inputs) < ATOL
    tokens = model.backbone.token_features(inputs)
    real = inputs["token_ids"] != 0
    difference = np.abs(tokens - expected.hidden_states[-1].numpy())[real]
    assert difference.max() < ATOL
    assert model.num_classes == 3 and model.backbone.layer_norm_epsilon == 1e-12


def test_bert_model_gives_the_encoder_and_pooler():
    reference = _reference("BertModel", layer_norm_eps=1e-5)
    backbone = TextClassifierBackbone.from_transformers(reference, sequence_length=10)
    inputs = _inputs(length=10)
    expected = _torch_outputs(reference, inputs)
    pooled = keras.ops.convert_to_numpy(backbone(inputs))
    assert np.abs(pooled - expected.pooler_output.numpy()).max() < ATOL
    real = inputs["token_ids"] != 0
    tokens = backbone.token_features(inputs)
    assert np.abs(tokens - expected.last_hidden_state.numpy())[real].max() < ATOL
    # The full position table is kept: the weight holds all 24 rows.
    embedding = backbone.get_layer("embedding")
    assert tuple(embedding.position_embedding.shape) == (24, 32)
    with pytest.raises(ValueError, match="num_classes"):
        TextClassifier.from_transformers(reference)
    model = TextClassifier.from_transformers(reference, num_classes=4)
    assert model.num_classes == 4 and model.backbone.sequence_length == 24



def test_classifier_from_a_masked_lm_checkpoint_warns_of_its_new_pooler():
    # BertForMaskedLM has no pooler: the encoder is loaded exactly, the
    # pooler stays as initialised, and the user is told (as Hugging Face
    # tells of newly initialised weights).
    reference = _reference("BertForMaskedLM")
    with pytest.warns(UserWarning, match="no pooler"):
        model = TextClassifier.from_transformers(
            reference, num_classes=2, sequence_length=LENGTH
        )
    inputs = _inputs()
    real = inputs["token_ids"] != 0
    expected = _torch_outputs(reference.bert, inputs).last_hidden_state.numpy()
    tokens = model.backbone.token_features(inputs)
    assert np.abs(tokens - expected)[real].max() < ATOL
    with pytest.warns(UserWarning, match="no pooler"):
        TextClassifierBackbone.from_transformers(reference, sequence_length=LENGTH)

def _save_folder(reference, path, vocabulary=True):
    reference.save_pretrained(path)
    if vocabulary:
        with open(os.path.join(path, "vocab.txt"), "w") as f:
            f.write("\n".join(VOCABULARY) + "\n")
    return str(path)


def test_folder_converts_and_tokenizes_like_hugging_face(tmp_path):
    reference = _reference()
    folder = _save_folder(reference, tmp_path / "bert")
    model = TextClassifier.from_transformers(folder, sequence_length=16)
    assert _logit_difference(reference, model, _inputs(length=16)) < ATOL

    texts = ["The film was not good!", "A great story, very good.",
             "It is the CAFÉ movie", "acting badly"]
    pairs = ["the story is bad", "Films.", "it", "good acting"]
    hf = transformers.BertTokenizer.from_pretrained(folder)
    preprocessor = model.preprocessor
    assert isinstance(preprocessor, BertPreprocessor)
    ours = preprocessor(texts)
    theirs = hf(texts, padding="max_length", max_length=16)
    np.testing.assert_array_equal(ours["token_ids"], theirs["input_ids"])
    ours = preprocessor(texts, pairs)
    theirs = hf(texts, pairs, padding="max_length", max_length=16)
    np.testing.assert_array_equal(ours["token_ids"], theirs["input_ids"])
    np.testing.assert_array_equal(ours["token_type_ids"], theirs["token_type_ids"])
    probabilities = model.predict_texts(texts)
    assert probabilities.shape == (4, 2)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("lower, accents", [(False, None), (True, False), (False, True)])
def test_a_cased_folder_tokenizes_like_hugging_face(tmp_path, lower, accents):
    # The casing is in tokenizer_config.json, not the model's config.json:
    # a cased BERT was lowercased and its accents stripped.
    cased = VOCABULARY + ["The", "Film", "Paris", "paris", "café"]
    reference = transformers.BertForSequenceClassification(
        _config(vocab_size=len(cased))
    ).eval()
    reference.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(cased) + "\n")
    transformers.BertTokenizer(
        str(tmp_path / "vocab.txt"), do_lower_case=lower, strip_accents=accents
    ).save_pretrained(tmp_path)
    model = TextClassifier.from_transformers(str(tmp_path), sequence_length=10)
    texts = ["The Film Paris café.", "the film paris cafe", "Café THE"]
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))(
        texts, padding="max_length", max_length=10
    )
    np.testing.assert_array_equal(model.preprocessor(texts)["token_ids"],
                                  theirs["input_ids"])


def test_other_architectures_and_options_are_refused(tmp_path):
    vit = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, image_size=16, patch_size=8,
    ))
    with pytest.raises(ValueError, match="ViTModel"):
        TextClassifier.from_transformers(vit)
    folder = _save_folder(vit, tmp_path / "vit", vocabulary=False)
    with pytest.raises(ValueError, match="architectures"):
        TextClassifier.from_transformers(folder)
    with pytest.raises(ValueError, match="hidden_act"):
        TextClassifier.from_transformers(_reference(hidden_act="relu"))
    with pytest.raises(ValueError, match="position_embedding_type"):
        TextClassifier.from_transformers(
            _reference(position_embedding_type="relative_key")
        )
    with pytest.raises(ValueError, match="sequence_length"):
        TextClassifier.from_transformers(_reference(), sequence_length=25)
    with pytest.raises(ValueError, match="source"):
        TextClassifier.from_transformers(str(tmp_path / "nothing"))


def _edit_folder(folder, edit_tensors=None, edit_config=None):
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path = os.path.join(folder, "model.safetensors")
    if edit_tensors:
        tensors = load_file(path)
        edit_tensors(tensors)
        save_file(tensors, path)
    if edit_config:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        edit_config(config)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
    return folder


def test_missing_extra_misshapen_and_disagreeing_are_named(tmp_path, assigned_variables):
    def damage(tensors):
        del tensors["bert.encoder.layer.1.output.dense.bias"]
        tensors["bert.encoder.layer.0.extra"] = np.zeros(3, "float32")
        tensors["classifier.bias"] = np.zeros(5, "float32")

    folder = _edit_folder(
        _save_folder(_reference(), tmp_path / "a"), edit_tensors=damage
    )
    with pytest.raises(ValueError) as info:
        TextClassifier.from_transformers(folder)
    message = str(info.value)
    assert "missing tensor 'encoder.layer.1.output.dense.bias'" in message
    assert "unexpected tensor 'encoder.layer.0.extra'" in message
    assert "classifier.bias" in message and "no weight was assigned" in message
    assert assigned_variables == []

    def fewer_layers(config):
        config["num_hidden_layers"] = 1

    def wider(config):
        config["intermediate_size"] = 128

    for edit in (fewer_layers, wider):
        folder = _edit_folder(
            _save_folder(_reference(), tmp_path / edit.__name__), edit_config=edit
        )
        with pytest.raises(ValueError, match="config disagrees"):
            TextClassifier.from_transformers(folder)
    assert assigned_variables == []


def test_converted_bert_saves_fine_tunes_and_takes_lora(tmp_path):
    reference = _reference()
    folder = _save_folder(reference, tmp_path / "bert")
    model = TextClassifier.from_transformers(folder, sequence_length=LENGTH)
    path = str(tmp_path / "bert.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert _logit_difference(reference, loaded) < ATOL
    assert loaded.preprocessor.vocabulary == VOCABULARY

    inputs, labels = _inputs(), np.array([0, 2, 1])
    tuned = model.with_head(3, head_dropout=0.1)
    tuned.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    before = keras.ops.convert_to_numpy(tuned.backbone.get_layer("pooler").dense.kernel)
    tuned.fit(inputs, labels, epochs=1, verbose=0)
    after = keras.ops.convert_to_numpy(tuned.backbone.get_layer("pooler").dense.kernel)
    assert not np.array_equal(before, after)

    lora = TextClassifier.from_transformers(reference, sequence_length=LENGTH)
    before = keras.ops.convert_to_numpy(lora(inputs))
    assert lora.backbone.enable_lora(rank=2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(lora(inputs)), before, atol=1e-6)
    trainable = {v.path for v in lora.trainable_variables}
    assert any("lora" in p for p in trainable)
    assert not any("token_embedding" in p for p in trainable)
    lora.compile(optimizer="adam", jit_compile=False)
    lora.fit(inputs, labels % 2, epochs=1, verbose=0)


def test_convert_command_takes_a_bert_folder(tmp_path, capsys):
    from keras_attention import cli

    reference = _reference()
    folder = _save_folder(reference, tmp_path / "bert")
    out = str(tmp_path / "bert.keras")
    assert cli.main(["convert", folder, "--out", out]) == 0
    assert "TextClassifier (BERT)" in capsys.readouterr().out
    loaded = keras.saving.load_model(out)
    assert loaded.backbone.sequence_length == 24
    assert _logit_difference(reference, loaded, _inputs(length=24)) < ATOL

    encoder = _save_folder(_reference("BertModel"), tmp_path / "encoder")
    assert cli.main(["convert", encoder, "--out", out]) == 0
    assert "no head" in capsys.readouterr().out
    assert isinstance(keras.saving.load_model(out), TextClassifierBackbone)

    # A masked-LM checkpoint without --num-classes: the whole masked LM.
    from keras_attention.applications import MaskedLanguageModel

    masked = _reference("BertForMaskedLM")
    assert cli.main(["convert", _save_folder(masked, tmp_path / "mlm"), "--out", out]) == 0
    assert "MaskedLanguageModel" in capsys.readouterr().out
    loaded = keras.saving.load_model(out)
    assert isinstance(loaded, MaskedLanguageModel)
    inputs = _inputs(length=24)
    positions = np.tile(np.arange(loaded.mask_length, dtype="int32"), (3, 1))
    ours = keras.ops.convert_to_numpy(loaded({**inputs, "mask_positions": positions}))
    theirs = _torch_outputs(masked, inputs).logits.numpy()[:, : loaded.mask_length]
    real = inputs["token_ids"][:, : loaded.mask_length] != 0
    assert np.abs(ours - theirs)[real].max() < ATOL


@pytest.mark.large
def test_full_size_bert_base():
    reference = _reference(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=512,
    )
    model = TextClassifier.from_transformers(reference, sequence_length=64)
    inputs = _inputs(length=64, vocabulary_size=30522)
    assert _logit_difference(reference, model, inputs) < ATOL


# The masked-LM head of BertForMaskedLM / BertForPreTraining.

MASK_POSITIONS = np.array([[1, 5, 11], [2, 3, 7], [0, 3, 4]], "int32")


def _masked_lm_difference(reference, model, inputs=None):
    """The largest difference of the logits at `MASK_POSITIONS` (real
    tokens of `_inputs()`: rows 1 and 2 are padded from 8 and 5)."""
    inputs = inputs or _inputs()
    ours = model({**inputs, "mask_positions": MASK_POSITIONS}, training=False)
    outputs = _torch_outputs(reference, inputs)
    logits = getattr(outputs, "prediction_logits", None)
    logits = (outputs.logits if logits is None else logits).numpy()
    theirs = np.take_along_axis(logits, MASK_POSITIONS[..., None], axis=1)
    return np.abs(keras.ops.convert_to_numpy(ours) - theirs).max()


@pytest.mark.parametrize("kind", ["BertForMaskedLM", "BertForPreTraining"])
@pytest.mark.parametrize("as_folder", [False, True])
def test_masked_lm_head_converts_exactly(kind, as_folder, tmp_path):
    from keras_attention.applications.masked_lm import MaskedLanguageModel

    reference = _reference(kind, layer_norm_eps=1e-5)
    source = _save_folder(reference, tmp_path / "bert") if as_folder else reference
    model = MaskedLanguageModel.from_transformers(
        source, sequence_length=LENGTH, mask_length=3
    )
    assert _masked_lm_difference(reference, model) < ATOL
    assert model.get_layer("mlm_head")._intermediate_layer_norm.epsilon == 1e-5
    assert isinstance(model.preprocessor, BertPreprocessor) == as_folder


def test_masked_lm_refuses_no_head_and_an_untied_decoder(tmp_path, assigned_variables):
    from keras_attention.applications.masked_lm import MaskedLanguageModel

    with pytest.raises(ValueError, match="has no masked-LM head"):
        MaskedLanguageModel.from_transformers(_reference("BertModel"))
    folder = _save_folder(_reference("BertForSequenceClassification"), tmp_path / "c")
    with pytest.raises(ValueError, match="has no masked-LM head"):
        MaskedLanguageModel.from_transformers(folder)
    untied = _reference("BertForMaskedLM", tie_word_embeddings=False)
    with pytest.raises(ValueError, match="'cls.predictions.decoder.weight' differs"):
        MaskedLanguageModel.from_transformers(untied)

    def shift_bias(tensors):
        tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"] + 1

    folder = _edit_folder(
        _save_folder(_reference("BertForMaskedLM"), tmp_path / "m"),
        edit_tensors=shift_bias,
    )
    with pytest.raises(ValueError, match="'cls.predictions.decoder.bias' differs"):
        MaskedLanguageModel.from_transformers(folder)

    def damage(tensors):
        del tensors["cls.predictions.transform.dense.bias"]
        tensors["cls.predictions.extra"] = np.zeros(3, "float32")

    folder = _edit_folder(
        _save_folder(_reference("BertForMaskedLM"), tmp_path / "d"),
        edit_tensors=damage,
    )
    with pytest.raises(ValueError) as info:
        MaskedLanguageModel.from_transformers(folder)
    assert "missing tensor 'cls.predictions.transform.dense.bias'" in str(info.value)
    assert "unexpected tensor 'cls.predictions.extra'" in str(info.value)
    assert assigned_variables == []


def test_converted_masked_lm_saves_and_fine_tunes(tmp_path):
    from keras_attention.applications.masked_lm import MaskedLanguageModel

    reference = _reference("BertForPreTraining")
    folder = _save_folder(reference, tmp_path / "bert")
    model = MaskedLanguageModel.from_transformers(
        folder, sequence_length=LENGTH, mask_length=3
    )
    path = str(tmp_path / "mlm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, MaskedLanguageModel)
    assert _masked_lm_difference(reference, loaded) < ATOL
    assert loaded.preprocessor.vocabulary == VOCABULARY

    # The pooler (loaded from BertForPreTraining) matches Hugging Face's.
    inputs = _inputs()
    pooled = keras.ops.convert_to_numpy(loaded.backbone(inputs))
    expected = _torch_outputs(reference.bert, inputs).pooler_output.numpy()
    assert np.abs(pooled - expected).max() < ATOL
    classifier = loaded.with_head(num_classes=2)
    classifier.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    pooler = classifier.backbone.get_layer("pooler").dense.kernel
    before = keras.ops.convert_to_numpy(pooler)
    classifier.fit(inputs, np.array([0, 1, 1]), epochs=1, verbose=0)
    assert not np.array_equal(before, keras.ops.convert_to_numpy(pooler))


def test_a_regression_head_is_refused_and_a_new_head_taken():
    # One label is Hugging Face's regression (STS-B): it converted to a
    # one-class softmax, whose loss is 0 whatever the weights.
    reference = _reference(num_labels=1)
    with pytest.raises(ValueError, match="regression head.*pass `num_classes`"):
        TextClassifier.from_transformers(reference, sequence_length=LENGTH)
    model = TextClassifier.from_transformers(
        reference, num_classes=3, sequence_length=LENGTH
    )
    assert model.num_classes == 3


def test_a_folder_naming_no_architecture_says_how_it_is_read(tmp_path):
    _reference().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="names no architecture"):
        TextClassifier.from_transformers(str(tmp_path), sequence_length=LENGTH)
