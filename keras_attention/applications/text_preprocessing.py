"""Text preprocessing of the translation applications, on keras-hub.

`TranslationPreprocessor` turns sentence pairs into padded token ids with a
keras-hub tokenizer (character-level `UnicodeCodepointTokenizer`, or
`WordPieceTokenizer` with a vocabulary computed from the training data by
`keras_hub.tokenizers.compute_word_piece_vocabulary`) and turns generated ids
back into sentences. `corpus_bleu` scores translations with
`keras_hub.metrics.Bleu` (SacreBLEU's 13a tokenisation).

Token id 0 is padding on both sides, so `Embedding(mask_zero=True)` or
`ids != 0` gives the padding mask of any batch.
"""

import re
import warnings

import keras
import numpy as np

from keras_attention._validation import check_bool
from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention._config import ArgumentConfig

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED_TOKENS = (PAD, UNK, START, END)
TOKENIZERS = ("character", "word_piece")

# Character ids are Unicode code points. Code point 0 pads; the control
# characters "start of text" (2) and "end of text" (3) mark the target's
# start and end; every code point at or above `character_vocabulary_size - 1`
# is clamped there by the tokenizer and read as unknown. Other control
# characters are mapped to unknown too, so text never contains a marker.
_CHAR_PAD, _CHAR_START, _CHAR_END = 0, 2, 3
_FIRST_PRINTABLE = 32


def _check_sentences(argument, sentences):
    """A list of non-empty strings, or a clear `ValueError`."""
    if isinstance(sentences, str):
        raise invalid(argument, "a list of strings, not one string", sentences)
    if isinstance(sentences, np.ndarray):
        sentences = sentences.tolist()
    if isinstance(sentences, (str, bytes)) or not hasattr(sentences, "__iter__"):
        raise invalid(argument, "a list of strings", sentences)
    sentences = list(sentences)
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, bytes):
            sentence = sentence.decode("utf-8")
            sentences[i] = sentence
        if not isinstance(sentence, str):
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, "
                f"expected strings. Received: {argument}[{i}]={sentence!r}"
            )
        if not sentence.strip():
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, "
                "expected non-empty sentences (an empty sentence has nothing "
                f"to translate). Received: {argument}[{i}]={sentence!r}"
            )
    return sentences


@keras.saving.register_keras_serializable(package="keras_attention")
class TranslationPreprocessor(ArgumentConfig):
    """Sentence pairs to padded token ids and generated ids to sentences.

    Wraps two keras-hub tokenizers, one per language. With
    `tokenizer="character"` both are `keras_hub.tokenizers.
    UnicodeCodepointTokenizer` (ids are code points; no vocabulary to learn,
    the default for the date task). With `tokenizer="word_piece"` both are
    `keras_hub.tokenizers.WordPieceTokenizer`; build them from data with
    `TranslationPreprocessor.from_corpus`. The vocabularies are part of
    `get_config`, so a model that holds this preprocessor translates on its
    own after `.keras` save and load.

    Sources become `(N, source_length)` ids; targets become decoder inputs
    `[START] y_1 ... y_n` and labels `y_1 ... y_n [END]`, both
    `(N, target_length)`. Id 0 pads. Sentences longer than the length are
    **truncated with a warning** (the label then has no `[END]`); empty
    sentences raise a `ValueError`; unknown characters or word pieces map to
    the unknown token.

    Args:
        tokenizer: `"character"` or `"word_piece"`.
        source_vocabulary: the source word-piece vocabulary (a list of
            tokens starting with `RESERVED_TOKENS`); `None` for characters.
        target_vocabulary: the same for the target language.
        source_length: the number of source tokens `S` the models see.
        target_length: the number of target tokens `T`, `[END]` included;
            also the default maximum length of a generated translation.
        lowercase_source: lowercase the sources before tokenizing (targets
            keep their case: the model has to write it).
        character_vocabulary_size: code points at or above
            `character_vocabulary_size - 1` are unknown (character
            tokenizer only; 128 keeps ASCII).

    Example:

    ```python
    preprocessor = TranslationPreprocessor(source_length=32, target_length=11)
    x, y = preprocessor.encode_pairs(["3 March 1998"], ["1998-03-03"])
    x["source_ids"].shape, x["target_ids"].shape, y.shape
    # (1, 32), (1, 11), (1, 11)
    preprocessor.decode(y)  # ['1998-03-03']
    ```
    """

    def __init__(
        self,
        tokenizer="character",
        source_vocabulary=None,
        target_vocabulary=None,
        source_length=32,
        target_length=16,
        lowercase_source=False,
        character_vocabulary_size=128,
    ):
        if tokenizer not in TOKENIZERS:
            raise invalid("tokenizer", f"one of {TOKENIZERS}", tokenizer)
        self.tokenizer = tokenizer
        self.source_length = check_positive_int("source_length", source_length)
        self.target_length = check_positive_int("target_length", target_length)
        self.lowercase_source = check_bool("lowercase_source", lowercase_source)
        self.character_vocabulary_size = check_positive_int(
            "character_vocabulary_size", character_vocabulary_size
        )
        if tokenizer == "character":
            if self.character_vocabulary_size <= _FIRST_PRINTABLE:
                raise invalid(
                    "character_vocabulary_size",
                    f"an integer above {_FIRST_PRINTABLE}",
                    character_vocabulary_size,
                )
            if source_vocabulary is not None or target_vocabulary is not None:
                raise ValueError(
                    "The character tokenizer has no vocabulary. Received: "
                    "source_vocabulary or target_vocabulary with "
                    "tokenizer='character'"
                )
            self.source_vocabulary = None
            self.target_vocabulary = None
        else:
            for name, vocabulary in (
                ("source_vocabulary", source_vocabulary),
                ("target_vocabulary", target_vocabulary),
            ):
                if vocabulary is None or list(vocabulary[:4]) != list(
                    RESERVED_TOKENS
                ):
                    raise invalid(
                        name,
                        f"a list of tokens starting with {list(RESERVED_TOKENS)}"
                        " (see `TranslationPreprocessor.from_corpus`)",
                        None if vocabulary is None else list(vocabulary[:4]),
                    )
            self.source_vocabulary = [str(t) for t in source_vocabulary]
            self.target_vocabulary = [str(t) for t in target_vocabulary]
        self._source_tokenizer = self._make_tokenizer(
            self.source_vocabulary, self.lowercase_source
        )
        self._target_tokenizer = self._make_tokenizer(
            self.target_vocabulary, False
        )

    def _make_tokenizer(self, vocabulary, lowercase):
        import keras_hub

        if self.tokenizer == "character":
            return keras_hub.tokenizers.UnicodeCodepointTokenizer(
                lowercase=lowercase,
                vocabulary_size=self.character_vocabulary_size,
                errors="replace",
                replacement_char=self.character_vocabulary_size - 1,
            )
        return keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=vocabulary, lowercase=lowercase, oov_token=UNK
        )

    @classmethod
    def from_corpus(
        cls,
        sources,
        targets,
        tokenizer="word_piece",
        vocabulary_size=8000,
        source_length=None,
        target_length=None,
        lowercase_source=False,
        **kwargs,
    ):
        """Builds the tokenizers (and lengths) from training sentences.

        Word-piece vocabularies are computed with
        `keras_hub.tokenizers.compute_word_piece_vocabulary`. A length left
        `None` becomes the longest tokenized sentence of the corpus (the
        target's plus one for `[END]`).
        """
        sources = _check_sentences("sources", sources)
        targets = _check_sentences("targets", targets)
        if len(sources) != len(targets):
            raise ValueError(
                "Expected as many targets as sources. Received: "
                f"len(sources)={len(sources)}, len(targets)={len(targets)}"
            )
        if tokenizer == "word_piece":
            import keras_hub
            import tensorflow as tf

            check_positive_int("vocabulary_size", vocabulary_size)

            def learn(sentences, lowercase):
                data = tf.data.Dataset.from_tensor_slices(sentences).batch(1024)
                return keras_hub.tokenizers.compute_word_piece_vocabulary(
                    data,
                    vocabulary_size,
                    lowercase=lowercase,
                    reserved_tokens=list(RESERVED_TOKENS),
                )

            kwargs["source_vocabulary"] = learn(sources, lowercase_source)
            kwargs["target_vocabulary"] = learn(targets, False)
        probe = cls(
            tokenizer=tokenizer,
            lowercase_source=lowercase_source,
            **kwargs,
        )
        if source_length is None:
            source_length = max(len(t) for t in probe._tokenize(sources, True))
        if target_length is None:
            target_length = 1 + max(
                len(t) for t in probe._tokenize(targets, False)
            )
        return cls(
            tokenizer=tokenizer,
            source_length=source_length,
            target_length=target_length,
            lowercase_source=lowercase_source,
            **kwargs,
        )

    # Special ids -----------------------------------------------------------

    @property
    def pad_id(self):
        return 0

    @property
    def start_id(self):
        return _CHAR_START if self.tokenizer == "character" else 2

    @property
    def end_id(self):
        return _CHAR_END if self.tokenizer == "character" else 3

    @property
    def unknown_id(self):
        if self.tokenizer == "character":
            return self.character_vocabulary_size - 1
        return 1

    @property
    def source_vocabulary_size(self):
        if self.tokenizer == "character":
            return self.character_vocabulary_size
        return len(self.source_vocabulary)

    @property
    def target_vocabulary_size(self):
        if self.tokenizer == "character":
            return self.character_vocabulary_size
        return len(self.target_vocabulary)

    # Encoding --------------------------------------------------------------

    def _tokenize(self, sentences, source):
        tokenizer = self._source_tokenizer if source else self._target_tokenizer
        # Surrounding whitespace means nothing (word pieces ignore it), but
        # the character tokenizer made tokens of it: a trailing space or a
        # line's "\r\n" (then unknown tokens) changed the translation.
        ids = tokenizer([sentence.strip() for sentence in sentences])
        ids = [list(np.asarray(t, dtype="int64").reshape(-1)) for t in ids]
        if self.tokenizer == "character":
            unknown = self.unknown_id
            ids = [[i if i >= _FIRST_PRINTABLE else unknown for i in t] for t in ids]
        return ids

    def _pack(self, token_lists, length, argument):
        out = np.zeros((len(token_lists), length), dtype="int32")
        truncated = 0
        for row, tokens in enumerate(token_lists):
            if len(tokens) > length:
                truncated += 1
                tokens = tokens[:length]
            out[row, : len(tokens)] = tokens
        if truncated:
            warnings.warn(
                f"{truncated} of {len(token_lists)} {argument} are longer "
                f"than {length} tokens and were truncated to {length} tokens.",
                stacklevel=3,
            )
        return out

    def encode_sources(self, sentences):
        """`(N, source_length)` int32 ids; longer sentences are truncated."""
        sentences = _check_sentences("sentences", sentences)
        if not sentences:
            return np.zeros((0, self.source_length), "int32")
        tokens = self._tokenize(sentences, source=True)
        return self._pack(tokens, self.source_length, "source sentences")

    def encode_targets(self, sentences):
        """`(decoder_inputs, labels)`, both `(N, target_length)` int32."""
        sentences = _check_sentences("targets", sentences)
        if not sentences:
            empty = np.zeros((0, self.target_length), "int32")
            return empty, empty.copy()
        tokens = self._tokenize(sentences, source=False)
        labels = self._pack(
            [t + [self.end_id] for t in tokens],
            self.target_length,
            "target sentences (with [END])",
        )
        inputs = np.zeros_like(labels)
        inputs[:, 0] = self.start_id
        inputs[:, 1:] = labels[:, :-1]
        # A truncated label has no [END]; its shifted input keeps every token.
        return inputs, labels

    def encode_pairs(self, sources, targets):
        """`(x, labels)` for `fit`: x = `{"source_ids", "target_ids"}`."""
        source_ids = self.encode_sources(sources)
        target_ids, labels = self.encode_targets(targets)
        if len(source_ids) != len(target_ids):
            raise ValueError(
                "Expected as many targets as sources. Received: "
                f"len(sources)={len(source_ids)}, "
                f"len(targets)={len(target_ids)}"
            )
        return {"source_ids": source_ids, "target_ids": target_ids}, labels

    # Decoding --------------------------------------------------------------

    def _strip(self, ids):
        """Generated ids up to (without) `[END]`, without pads and `[START]`."""
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == self.end_id:
                break
            if i not in (self.pad_id, self.start_id):
                out.append(int(i))
        return out

    # WordPiece splits punctuation off the words, so its detokenizer writes
    # "ein T - Shirt ( rot ) ." for "ein T-Shirt (rot).". BLEU's 13a
    # tokenization keeps intra-word hyphens, so the spaces would cost real
    # matches; these rules restore the usual spacing.
    _SPACING = (
        (re.compile(r"(\w) - (?=\w)"), r"\1-"),  # T - Shirt -> T-Shirt
        (re.compile(r"(\d) ([.,]) (?=\d)"), r"\1\2"),  # 2 . 5 -> 2.5
        (re.compile(r" ([.,!?:;%)\]}])"), r"\1"),  # word . -> word.
        (re.compile(r"([(\[{]) "), r"\1"),  # ( word -> (word
        # Apostrophes inside words (13a keeps them there): English clitics
        # (dog ' s, isn ' t, we ' re) and French/Italian elision (l ' homme,
        # qu ' il). Others stay apart: a quote and an apostrophe look alike.
        (re.compile(r"(\w) ' (?=(?i:s|t|re|ve|ll|d|m)\b)"), r"\1'"),
        (re.compile(r"\b([cdjlmnst]|qu) ' (?=\w)", re.IGNORECASE), r"\1'"),
    )

    @classmethod
    def _join_punctuation(cls, text):
        for pattern, replacement in cls._SPACING:
            text = pattern.sub(replacement, text)
        return text

    def decode(self, ids):
        """Strings from a `(N, T)` batch of generated target ids.

        Word-piece output gets the usual spacing of punctuation back (no
        space before `.,!?:;%)`, after `(`, or around an intra-word hyphen,
        a decimal point or an apostrophe of `dog's`, `isn't`, `l'homme`),
        which the tokenizer's split loses.
        """
        rows = [self._strip(row) for row in np.asarray(ids)]
        texts = []
        for row in rows:
            if not row:
                texts.append("")
                continue
            text = self._target_tokenizer.detokenize([row])[0]
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            text = str(text)
            if self.tokenizer == "word_piece":
                text = self._join_punctuation(text)
            texts.append(text)
        return texts

    def token_strings(self, ids, source):
        """The token strings of one sequence of ids (pads dropped)."""
        vocabulary = self.source_vocabulary if source else self.target_vocabulary
        names = {self.start_id: START, self.end_id: END, self.unknown_id: UNK}
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == self.pad_id:
                continue
            if i in names:
                out.append(names[i])
            elif vocabulary is None:
                out.append(chr(i))
            else:
                out.append(vocabulary[i])
        return out

    # Serialization -----------------------------------------------------------


def corpus_bleu(references, hypotheses):
    """Corpus BLEU (0-100) with `keras_hub.metrics.Bleu` (SacreBLEU 13a).

    Unsmoothed, as sacrebleu's `smooth_method="none"`: a corpus where some
    n-gram order has no match scores 0 (sacrebleu's default `"exp"`
    smoothing gives more there; on a test set of any size both agree).

    Args:
        references: one reference string per sentence (or a list of
            references per sentence, as many for each as you have).
        hypotheses: the translations, one string per sentence.

    Returns:
        A Python float in `[0, 100]`.
    """
    import keras_hub

    if len(references) != len(hypotheses):
        raise ValueError(
            "Expected as many hypotheses as references. Received: "
            f"len(references)={len(references)}, "
            f"len(hypotheses)={len(hypotheses)}"
        )
    if not hypotheses:
        return 0.0
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    for i, sentence in enumerate(refs):
        if not sentence or not all(isinstance(r, str) for r in sentence):
            raise ValueError(
                "Received an invalid value for argument `references`, expected "
                "a string or a non-empty list of strings per sentence. "
                f"Received: references[{i}]={references[i]!r}"
            )
    # keras-hub takes a rectangle: a sentence with fewer references repeats
    # its last one (the clipped counts and the closest length do not change).
    most = max(len(sentence) for sentence in refs)
    refs = [sentence + [sentence[-1]] * (most - len(sentence)) for sentence in refs]
    metric = keras_hub.metrics.Bleu()
    metric.update_state(refs, list(hypotheses))
    return 100.0 * float(keras.ops.convert_to_numpy(metric.result()))
