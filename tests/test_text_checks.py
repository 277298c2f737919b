"""A user's checks of the text tools: files, empty inputs, Hugging Face's
normalisation of BERT's input."""

import numpy as np
import pytest

from keras_attention.applications import BertPreprocessor
from keras_attention.applications import TextClassifier
from keras_attention.applications import TextClassifierPreprocessor
from keras_attention.datasets import load_text_corpus
from keras_attention.training import pretrain_masked_lm
from keras_attention.training import read_text_folder

TINY = dict(hidden_dim=8, depth=1, num_heads=2, mlp_dim=8, pooling_units=4)
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_a_missing_folder_is_named_as_missing(tmp_path):
    # It said "expected a list of strings, a folder or a file".
    missing = tmp_path / "my_texts"
    with pytest.raises(FileNotFoundError, match="no such file or folder.*my_texts"):
        pretrain_masked_lm(missing, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="`texts`"):
        read_text_folder(str(missing))


def test_a_byte_order_mark_is_not_text(tmp_path):
    # Notepad's UTF-8 starts with U+FEFF; it became part of the first text.
    (tmp_path / "a.txt").write_text("the film\nwas good\n", encoding="utf-8-sig")
    (tmp_path / "b.txt").write_text("the book\n", encoding="utf-8-sig")
    assert read_text_folder(tmp_path) == ["the film", "was good", "the book"]
    corpus = load_text_corpus(tmp_path, val_fraction=0.5)
    assert "\ufeff" not in corpus["train"] + corpus["val"]


def test_pretraining_refuses_texts_with_nothing_to_mask():
    # Validation texts without a word piece reported val_loss 0.0.
    texts = ["the film was good", "the book was bad"] * 4
    with pytest.raises(ValueError, match="`validation_texts`.*empty"):
        pretrain_masked_lm(
            texts, vocabulary_size=40, sequence_length=8, epochs=1,
            validation_texts=["", " "], verbose=0, **TINY,
        )
    preprocessor = TextClassifierPreprocessor.from_texts(
        texts, 40, 8, special_tokens=("[MASK]",)
    )
    with pytest.raises(ValueError, match="`texts`.*empty"):
        pretrain_masked_lm(["", ""], preprocessor=preprocessor, epochs=1, verbose=0)


def test_no_texts_give_no_rows_of_the_sequence_length():
    # keras-hub gave shape (0,) for the classifier's preprocessor, and one
    # unbatched row [CLS] [SEP] for BERT's.
    preprocessor = TextClassifierPreprocessor(["[PAD]", "[UNK]", "film"], 6)
    assert preprocessor([]).shape == (0, 6)
    model = TextClassifier(num_classes=2, preprocessor=preprocessor, **TINY)
    assert model.explain([]) == ([], [])
    bert = BertPreprocessor(SPECIAL + ["film"], sequence_length=6)
    for inputs in (bert([]), bert([], pairs=[])):
        assert {k: v.shape for k, v in inputs.items()} == {
            "token_ids": (0, 6), "token_type_ids": (0, 6)
        }


# Each text and its word pieces as Hugging Face's uncased BertTokenizer
# gives them (tokenizers' BertNormalizer); keras-hub's own normalisation
# (NFKC case folding, ASCII whitespace only) gave the pieces in comments.
UNCASED = [
    ("the\u00a0film", ["the", "film"]),  # no-break space: [UNK]
    ("the\u3000film", ["the", "film"]),  # ideographic space: [UNK]
    ("\ufeffthe film", ["the", "film"]),  # a byte-order mark (as before)
    ("fi\u00adlm", ["film"]),  # soft hyphen: fi lm
    ("fi\x07lm", ["film"]),  # a control character: fi lm
    ("Straße", ["straße"]),  # strasse
    ("\ufb01lm", ["\ufb01", "##lm"]),  # the "fi" ligature: film
    ("\uff26ilm", ["\uff46", "##ilm"]),  # a full-width F: film
    ("ΟΔΟΣ", ["οδοσ"]),  # no final sigma (as before)
    ("Café", ["cafe"]),  # (as before)
]
UNCASED_VOCABULARY = SPECIAL + [
    "the", "film", "fi", "lm", "##lm", "##ilm", "straße", "strasse",
    "\ufb01", "\uff46", "οδοσ", "cafe",
]


@pytest.mark.parametrize("text, pieces", UNCASED)
def test_bert_preprocessor_normalizes_text_as_hugging_face(text, pieces):
    preprocessor = BertPreprocessor(UNCASED_VOCABULARY, sequence_length=8)
    ids = preprocessor([text])["token_ids"][0]
    got = [UNCASED_VOCABULARY[i] for i in ids if i]
    assert got == ["[CLS]", *pieces, "[SEP]"]


def test_bert_preprocessor_matches_the_hugging_face_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(UNCASED_VOCABULARY), encoding="utf-8")
    texts = [text for text, _ in UNCASED] + [
        "Ｃafé\u200b crème\u2028à\tParis", "naïve ÉCOLE 😀", "한국", "İ",
        # Special tokens written in a text are those tokens (they were
        # split: [ mask ]); in the wrong case they are text.
        "the film [MASK].", "[CLS]the[SEP] [mask]", "[MASK][MASK]film",
    ]
    for lowercase, strip_accents in ((True, None), (True, False), (False, None)):
        reference = transformers.BertTokenizer(
            str(path), do_lower_case=lowercase, strip_accents=strip_accents
        )
        ours = BertPreprocessor(
            str(path), 12, lowercase=lowercase, strip_accents=strip_accents
        )(texts)["token_ids"]
        expected = reference(texts, max_length=12, padding="max_length",
                             truncation=True)["input_ids"]
        np.testing.assert_array_equal(ours, np.asarray(expected))


def test_text_classifier_splits_words_on_every_unicode_space():
    # keras-hub's tokenizer splits on ASCII whitespace only: "good\u00a0film"
    # (a no-break space, common in web text) was one unknown piece.
    import tensorflow as tf

    preprocessor = TextClassifierPreprocessor.from_texts(
        ["a good film", "a\u00a0bad\u3000film"] * 10, vocabulary_size=50,
        sequence_length=6,
    )
    assert "\u00a0" not in "".join(preprocessor.vocabulary)
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    texts = [f"a{space}good film" for space in spaces]
    expected = preprocessor(["a good film"])
    np.testing.assert_array_equal(preprocessor(texts), np.repeat(expected, len(texts), 0))
    as_tensor = preprocessor(tf.constant(texts))  # a tf.data pipeline's path
    np.testing.assert_array_equal(as_tensor, np.repeat(expected, len(texts), 0))


def test_texts_given_to_predict_point_to_predict_texts():
    model = TextClassifier(
        vocabulary_size=30, sequence_length=8, num_classes=2,
        hidden_dim=8, depth=1, num_heads=2, mlp_dim=8,
    )
    # Was "expected integer ids of shape (None, 8). Received: (3,)".
    for texts in (np.array(["a b", "c", "d e f"]), np.array(["a"], dtype=object)):
        with pytest.raises(ValueError, match="not text.*predict_texts"):
            model.predict(texts, verbose=0)
    assert model.predict(np.ones((2, 8), "int32"), verbose=0).shape == (2, 2)


def test_bert_rows_too_short_for_the_special_tokens_are_refused():
    # keras-hub's packer gave rows longer than sequence_length (1 -> 2;
    # pairs at 2 -> 3) or [CLS] [SEP] [SEP] without any text (pairs at 3).
    for length in (1, 2):
        with pytest.raises(ValueError, match="`sequence_length`.*at least 3"):
            BertPreprocessor(SPECIAL + ["film"], sequence_length=length)
    bert = BertPreprocessor(SPECIAL + ["film"], sequence_length=4)
    assert bert(["film film film"])["token_ids"].tolist() == [[2, 5, 5, 3]]
    with pytest.raises(ValueError, match="`pairs`.*at least 5"):
        bert(["film"], pairs=["film"])
    pair = BertPreprocessor(SPECIAL + ["film"], sequence_length=5)
    assert pair(["film film"], pairs=["film"])["token_ids"].tolist() == [[2, 5, 3, 5, 3]]
