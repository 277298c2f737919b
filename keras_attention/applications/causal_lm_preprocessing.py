"""Text to token ids and back for `CausalLM`, on keras-hub's tokenizer.

Characters are ids (Unicode code points) through
`keras_hub.tokenizers.UnicodeCodepointTokenizer`, as for the translators'
character preprocessor: no vocabulary to learn, so the date lines and any
text folder tokenize the same way. Id 0 pads, `"\\n"` (10) ends a line and
is the stop token of generation, and every code point at or above
`vocabulary_size - 1` (and every other control character) is the unknown
id `vocabulary_size - 1`, which decodes to `"\ufffd"`.
"""

import keras
import numpy as np

from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention._config import ArgumentConfig

PACKAGE = "keras_attention"
_NEWLINE = 10
_FIRST_PRINTABLE = 32
_REPLACEMENT = 0xFFFD  # "\ufffd"


@keras.saving.register_keras_serializable(package=PACKAGE)
class CausalLMPreprocessor(ArgumentConfig):
    """Character ids for a causal language model.

    Args:
        vocabulary_size: code points below `vocabulary_size - 1` are their
            own id; the rest are unknown (`vocabulary_size - 1`). 128 keeps
            ASCII.
        lowercase: lowercase the text first (keras-hub's default; the
            presets were trained so, and their `generate_text` returns the
            prompt lowercased). `False` keeps the case, for a cased corpus.

    Example:

    ```python
    preprocessor = CausalLMPreprocessor()
    ids = preprocessor.encode("3 may 1999 = ")  # int32 (13,)
    preprocessor.decode(ids)  # '3 may 1999 = '
    x, y = preprocessor.sequences("abcdefgh" * 8, sequence_length=16)
    x.shape, y.shape  # (3, 16), (3, 16): y is x shifted by one
    ```
    """

    def __init__(self, vocabulary_size=128, lowercase=True):
        self.vocabulary_size = check_positive_int(
            "vocabulary_size", vocabulary_size
        )
        if not isinstance(lowercase, (bool, np.bool_)):
            raise invalid("lowercase", "True or False", lowercase)
        self.lowercase = bool(lowercase)
        if vocabulary_size <= _FIRST_PRINTABLE:
            raise invalid(
                "vocabulary_size", f"an integer above {_FIRST_PRINTABLE}",
                vocabulary_size,
            )
        import keras_hub

        self._tokenizer = keras_hub.tokenizers.UnicodeCodepointTokenizer(
            vocabulary_size=vocabulary_size,
            errors="replace",
            replacement_char=vocabulary_size - 1,
            lowercase=self.lowercase,
        )

    @property
    def end_id(self):
        """The id of `"\\n"`, which ends a generated line."""
        return _NEWLINE

    @property
    def unknown_id(self):
        return self.vocabulary_size - 1

    def encode(self, text):
        """int32 ids `(N,)` of one string, or a list of arrays for a list."""
        if isinstance(text, (list, tuple)):
            return [self.encode(t) for t in text]
        if not isinstance(text, str):
            raise invalid("text", "a string or a list of strings", text)
        if not text:
            raise invalid("text", "a non-empty string", text)
        ids = np.asarray(self._tokenizer(text), dtype="int32").reshape(-1)
        control = (ids < _FIRST_PRINTABLE) & (ids != _NEWLINE)
        return np.where(control, self.unknown_id, ids).astype("int32")

    def decode(self, ids):
        """The text of ids `(N,)` (padding dropped), or a list of texts for
        `(B, N)`; the unknown id reads `"\ufffd"`."""
        ids = np.asarray(ids)
        if ids.ndim == 2:
            return [self.decode(row) for row in ids]
        ids = ids[ids != 0]
        if not ids.size:
            return ""
        # The unknown id is a code point too (DEL for 128, "c" for 100):
        # shown as the replacement character, not as that character.
        ids = np.where(ids == self.unknown_id, _REPLACEMENT, ids)
        text = self._tokenizer.detokenize(ids)
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return str(text)

    def sequences(self, text, sequence_length, stride=None):
        """Training pairs of a text: ids `x` `(N, L)` and next ids `y`.

        Windows of `sequence_length + 1` ids every `stride` (default
        `sequence_length`) ids; `y` is `x` shifted left by one.
        """
        check_positive_int("sequence_length", sequence_length)
        stride = check_positive_int(
            "stride", sequence_length if stride is None else stride
        )
        ids = self.encode(text)
        if len(ids) < sequence_length + 1:
            raise ValueError(
                f"The text has {len(ids)} characters, fewer than "
                f"sequence_length + 1 = {sequence_length + 1}. Received: "
                f"sequence_length={sequence_length}"
            )
        starts = np.arange(0, len(ids) - sequence_length, stride)
        windows = ids[starts[:, None] + np.arange(sequence_length + 1)]
        return windows[:, :-1], windows[:, 1:]
