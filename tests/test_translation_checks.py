"""Checks of the translators as a user drives them: LoRA files, decoding
arguments, per-sentence weights, whitespace, date alignment.

Tiny untrained models, decoded eagerly (no XLA compilation).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras_attention  # noqa: E402
from keras_attention.applications import Seq2SeqTranslator  # noqa: E402
from keras_attention.applications import TransformerTranslator  # noqa: E402
from keras_attention.applications import TranslationPreprocessor  # noqa: E402
from keras_attention.datasets.dates import date_alignment  # noqa: E402
from keras_attention.datasets.dates import parse_date  # noqa: E402

WORDS = ["abc", "hgfe", "a", "dcbabcd"]


def preprocessor():
    return TranslationPreprocessor(source_length=8, target_length=8)


def tiny_rnn():
    return Seq2SeqTranslator(
        preprocessor(), embedding_dim=8, hidden_dim=8, dropout=0.1
    )


def tiny_transformer():
    return TransformerTranslator(
        preprocessor(), num_layers=1, hidden_dim=8, num_heads=2,
        intermediate_dim=16, dropout=0.1,
    )


@pytest.mark.parametrize("make", [tiny_rnn, tiny_transformer])
def test_lora_translator_file_loads_after_other_models(make, tmp_path):
    # The file names the layers its user froze (LoRA's own freezing is not
    # saved: the file holds the updates merged). The dropout layers had
    # Keras's per-process names ("dropout_2"), so the rebuilt model
    # ("dropout_4") had no such layer: load_model raised "No such layer".
    keras.utils.set_random_seed(0)
    model = make()
    model.get_layer("embedding_dropout").trainable = False
    keras_attention.layers.enable_lora(model, 2)
    rng = np.random.default_rng(0)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(size=variable.shape).astype(variable.dtype))
    ids = model.preprocessor.encode_sources(WORDS)
    expected = model.generate_ids(ids, jit_compile=False)[0]
    path = str(tmp_path / "lora.keras")
    model.save(path)
    make()  # more layers named in this process
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        loaded.generate_ids(ids, jit_compile=False)[0], expected
    )
    frozen = {layer.name for layer in loaded.layers if not layer.trainable}
    assert frozen == {"embedding_dropout"}


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), "0.6", None, True]
)
def test_length_penalty_is_checked_by_name(value):
    # NaN made every normalised score NaN: beam search returned an arbitrary
    # beam without an error; a string or None failed inside float().
    model = tiny_transformer()
    with pytest.raises(ValueError, match="`length_penalty`"):
        model.translate("abc", beam_width=2, length_penalty=value)
    ids = model.preprocessor.encode_sources(WORDS)
    with pytest.raises(ValueError, match="`length_penalty`"):
        model.generate_ids(ids, beam_width=2, length_penalty=value)
    # Any finite exponent is fine (negative favours shorter beams).
    model.generate_ids(ids, beam_width=2, length_penalty=-0.5, jit_compile=False)


@pytest.mark.parametrize(
    "make", [tiny_rnn, pytest.param(tiny_transformer, marks=pytest.mark.large)]
)
def test_per_sentence_sample_weight_weighs_its_tokens(make):
    # A `(B,)` sample_weight raised a shape error in the loss (Keras
    # multiplied it with the `(B, T)` mask of `ignore_class`), and in graph
    # mode the token metrics took `len()` of a shape of unknown rank (graph
    # mode, as XLA: both failed there).
    keras.utils.set_random_seed(0)
    model = make()
    model.compile(jit_compile=False)
    x, y = model.prepare(WORDS, WORDS[::-1])
    weights = np.array([0.5, 2.0, 0.0, 1.0], "float32")
    per_token = np.repeat(weights[:, None], y.shape[1], axis=1)
    sentence = model.evaluate(
        x, y, sample_weight=weights, batch_size=4, verbose=0, return_dict=True
    )
    token = model.evaluate(
        x, y, sample_weight=per_token, batch_size=4, verbose=0,
        return_dict=True,
    )
    for name in ("loss", "token_accuracy", "token_loss"):
        assert sentence[name] == pytest.approx(token[name], rel=1e-5), name
    model.fit(x, y, sample_weight=weights, batch_size=4, epochs=1, verbose=0)


def test_surrounding_whitespace_is_not_a_token():
    # A trailing space or a file line's "\r\n" became tokens (the control
    # characters unknown ones): the shipped seq2seq_dates wrote "198-03-03"
    # for "March 3, 1998 " and "March 3, 1998\r\n".
    p = TranslationPreprocessor(source_length=16, target_length=16)
    plain = p.encode_sources(["March 3, 1998"])
    for spaced in (" March 3, 1998", "March 3, 1998 ", "March 3, 1998\r\n",
                   "\tMarch 3, 1998\n"):
        np.testing.assert_array_equal(p.encode_sources([spaced]), plain)
    inputs, labels = p.encode_targets(["1998-03-03 \n"])
    np.testing.assert_array_equal(
        labels, p.encode_targets(["1998-03-03"])[1]
    )
    # Inner whitespace is kept.
    assert (p.encode_sources(["March  3"]) != p.encode_sources(["March 3"])).any()


@pytest.mark.parametrize(
    "source", ["  3 March 1998", " the 3rd of march 1998 ", "\tMar 3, 1998"]
)
def test_date_alignment_spans_index_the_source(source):
    # With leading whitespace, the spans of dates written with words were
    # counted in the stripped text: the year pointed at "h 19".
    ranges = date_alignment(source)
    assert source[slice(*ranges[0])] == "1998"
    assert source[slice(*ranges[5])].lower() in ("march", "mar")
    assert source[slice(*ranges[8])] == "3"
    assert parse_date(source) == "1998-03-03"


def test_corpus_files_with_a_byte_order_mark(tmp_path):
    # The first sentence of each file began with "\ufeff", an unknown token.
    from keras_attention.applications.translation import load_translation_corpus

    (tmp_path / "train.en").write_bytes(b"\xef\xbb\xbfHello world\r\nGood day\r\n")
    (tmp_path / "train.de").write_bytes(b"\xef\xbb\xbfHallo Welt\nGuten Tag\n")
    corpus = load_translation_corpus(str(tmp_path))
    assert corpus == {
        "train": (["Hello world", "Good day"], ["Hallo Welt", "Guten Tag"])
    }


@pytest.mark.parametrize(
    "source_ids, match",
    [
        (np.array([4, 5, 6]), r"\(B, length\)"),  # one row without its batch axis
        (np.array([[4, 5, 10_000]]), r"in \[0, \d+\)"),  # outside the vocabulary
        (np.array([[4.7, 5.2, 6.0]]), "integer token ids"),  # truncated before
    ],
)
def test_generate_ids_names_source_ids_that_are_not_token_ids(source_ids, match):
    # An IndexError, a raw TensorFlow gather error, and float ids truncated.
    model = tiny_transformer()
    with pytest.raises(ValueError, match=f"`source_ids`.*{match}"):
        model.generate_ids(source_ids, max_length=4, jit_compile=False)
    ids, _ = model.generate_ids([[4, 5, 6]], max_length=4, jit_compile=False)
    assert ids.shape == (1, 4)  # a list of rows is ids too


@pytest.mark.parametrize("implementation", ["blocked", "chunked", "fused"])
def test_a_weightless_attention_path_is_refused_when_the_transformer_is_built(implementation):
    # Its decoder reads the cross-attention weights: `fit` failed at its
    # first step, naming `return_weights`, which the user never set.
    with pytest.raises(ValueError, match="attention_kwargs"):
        TransformerTranslator(attention_kwargs={"implementation": implementation})
