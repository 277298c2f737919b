"""What the WordPiece preprocessors share (`TextClassifierPreprocessor`,
`BertPreprocessor`): the vocabulary, checked by each, the sequence length
and lowercasing, kept as the constructor's arguments."""

from keras_attention._validation import check_bool
from keras_attention._validation import check_positive_int
from keras_attention._config import ArgumentConfig


class WordPiecePreprocessor(ArgumentConfig):
    """Base of a preprocessor of texts into WordPiece ids.

    Keeps `vocabulary` as a list (after `check_vocabulary`, the subclass's
    rule for its special tokens), `sequence_length` (a positive int) and
    `lowercase` (a bool); the subclass builds its tokenizer from them.
    """

    def __init__(self, vocabulary, sequence_length, lowercase):
        vocabulary = list(vocabulary)
        self.check_vocabulary(vocabulary)
        self.vocabulary = vocabulary
        self.sequence_length = check_positive_int(
            "sequence_length", sequence_length
        )
        self.lowercase = check_bool("lowercase", lowercase)

    def check_vocabulary(self, vocabulary):
        """Hook: raise a `ValueError` unless `vocabulary` (a list of
        strings) holds the special tokens where the subclass needs them."""

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)
