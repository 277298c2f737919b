"""BERT's text preprocessing with keras-hub: WordPiece and segment packing.

`BertPreprocessor` turns texts (and optional second texts) into the inputs
of a BERT-layout `TextClassifierBackbone`:
`[CLS] a [SEP] (b [SEP])` padded with `[PAD]` (id 0), and token types 0 for
the first segment, 1 for the second, as Hugging Face's `BertTokenizer`
gives them. `normalize_text` cleans, lowercases and strips accents as
Hugging Face's `BertNormalizer` does; the word pieces come from keras-hub's
`WordPieceTokenizer` (punctuation and CJK splitting like BERT's basic
tokenizer), the packing from keras-hub's `MultiSegmentPacker`.
"""

import functools
import os
import re

import keras
import numpy as np
from keras import ops

from keras_attention import _validation as base
from keras_attention.applications import base as app_base
from keras_attention.applications.word_pieces import WordPiecePreprocessor

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def normalize_text(text, lowercase, strip_accents):
    """A text as Hugging Face's `BertNormalizer` leaves it for splitting.

    Its own normaliser (the `tokenizers` library): control, format and
    private-use characters are dropped, every other whitespace character
    (no-break space, ideographic space, ...) becomes a space, accents are
    stripped (NFD, marks removed) and each character is lowercased on its
    own ("ß", "ﬁ" and full-width letters stay, unlike keras-hub's NFKC case
    folding). Chinese characters are left to keras-hub's splitting.
    """
    return _bert_normalizer(bool(lowercase), bool(strip_accents)).normalize_str(
        text
    )


@functools.lru_cache(maxsize=None)
def _bert_normalizer(lowercase, strip_accents):
    from tokenizers.normalizers import BertNormalizer

    return BertNormalizer(
        clean_text=True,
        handle_chinese_chars=False,
        strip_accents=strip_accents,
        lowercase=lowercase,
    )


def read_vocabulary(path):
    """The tokens of a `vocab.txt` (one per line), in id order."""
    with open(os.fspath(path), encoding="utf-8") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class BertPreprocessor(WordPiecePreprocessor):
    """Texts to BERT's `{"token_ids", "token_type_ids"}`, with keras-hub.

    Args:
        vocabulary: the WordPiece vocabulary (a list of strings, or the
            path of a `vocab.txt`); it holds `[PAD]`, `[UNK]`, `[CLS]`,
            `[SEP]` (and `[MASK]` for pretraining), `[PAD]` at id 0.
        sequence_length: the length `T`, at least 3 (5 for pairs); longer
            texts are truncated (pairs round-robin, as keras-hub does).
        lowercase: lowercase (the uncased models); accents are stripped
            with it unless `strip_accents` says otherwise.
        strip_accents: `None` follows `lowercase`, as Hugging Face does.

    Call arguments:
        texts: a list of strings.
        pairs: optional second texts (sentence pairs), one per text.

    Returns:
        `{"token_ids": int32 (B, T), "token_type_ids": int32 (B, T)}`.

    Example:

    ```python
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good",
                  "film", "##s"]
    preprocessor = BertPreprocessor(vocabulary, sequence_length=8)
    preprocessor(["A good films"])["token_ids"]  # [[2, 5, 6, 7, 8, 3, 0, 0]]
    ```
    """

    def __init__(self, vocabulary, sequence_length=128, lowercase=True, strip_accents=None):
        import keras_hub

        if isinstance(vocabulary, (str, os.PathLike)):
            vocabulary = read_vocabulary(vocabulary)
        super().__init__(vocabulary, sequence_length, lowercase)
        if self.sequence_length < 3:  # keras-hub's packer overflows it
            raise base.invalid(
                "sequence_length",
                "at least 3 ([CLS], a word piece, [SEP])",
                sequence_length,
            )
        vocabulary = self.vocabulary
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        # `normalize_text` lowercases and strips accents as Hugging Face
        # does; keras-hub's own lowercasing is NFKC case folding.
        # A special token written in a text ("the film was [MASK].") is
        # that token, as Hugging Face's tokenizers read it.
        self._specials = [t for t in SPECIAL_TOKENS if t in vocabulary]
        self._special_pattern = re.compile(
            "(" + "|".join(re.escape(t) for t in self._specials) + ")"
        )
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=vocabulary,
            lowercase=False,
            strip_accents=False,
            oov_token="[UNK]",
            special_tokens=self._specials,
            special_tokens_in_strings=True,
            dtype="int32",
        )
        ids = {token: i for i, token in enumerate(vocabulary)}
        self.cls_id, self.sep_id = ids["[CLS]"], ids["[SEP]"]
        self.mask_id = ids.get("[MASK]")
        self.packer = keras_hub.layers.MultiSegmentPacker(
            sequence_length=sequence_length,
            start_value=self.cls_id,
            end_value=self.sep_id,
            pad_value=0,
        )

    def check_vocabulary(self, vocabulary):
        missing = [t for t in SPECIAL_TOKENS[:4] if t not in vocabulary]
        if missing or vocabulary[0] != "[PAD]":
            raise base.invalid(
                "vocabulary",
                "a WordPiece vocabulary with [PAD] at id 0 and [UNK], [CLS], "
                f"[SEP] (missing: {missing})",
                vocabulary[:5],
            )

    def tokenize(self, texts):
        """The word-piece ids of each text, a ragged tensor."""
        return self.tokenizer([
            " ".join(
                part if part in self._specials
                else normalize_text(part, self.lowercase, self.strip_accents)
                for part in self._special_pattern.split(text)
            )
            for text in base.check_texts(texts)
        ])

    def __call__(self, texts, pairs=None):
        texts = base.check_texts(texts)
        if pairs is not None:
            pairs = base.check_texts(pairs)
            if len(pairs) != len(texts):
                raise base.invalid(
                    "pairs", f"{len(texts)} texts, one per text", len(pairs)
                )
            if self.sequence_length < 5:
                raise ValueError(
                    "Received `pairs` with sequence_length="
                    f"{self.sequence_length}, expected a sequence_length of "
                    "at least 5 for pairs ([CLS] a [SEP] b [SEP]): shorter "
                    "rows overflow or hold no text."
                )
        if not texts:  # keras-hub packs an empty list as one unbatched row
            empty = np.zeros((0, self.sequence_length), "int32")
            return {"token_ids": empty, "token_type_ids": empty.copy()}
        segments = [self.tokenize(texts)]
        if pairs is not None:
            segments.append(self.tokenize(pairs))
        token_ids, token_type_ids = self.packer(tuple(segments))
        return {
            "token_ids": ops.convert_to_numpy(token_ids).astype("int32"),
            "token_type_ids": ops.convert_to_numpy(token_type_ids).astype("int32"),
        }
