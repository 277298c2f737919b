"""Text classifier: Transformer encoder and additive-attention pooling.

Token ids go through a token-and-position embedding, pre-norm encoder
blocks with multi-head self-attention (Vaswani et al., 2017; the attention
is chosen by registry name), and an additive-attention pooling (Bahdanau et
al., 2015): a learned query attends over the tokens, so the pooling weights
show which tokens decided the class (Yang et al., 2016, Hierarchical
Attention Networks, use the same learned-context pooling).

Texts become token ids with `TextClassifierPreprocessor`, a keras-hub
`WordPieceTokenizer` whose vocabulary is computed from the training texts
(`keras_hub.tokenizers.compute_word_piece_vocabulary`). Id 0 pads.
"""

import keras
import numpy as np
from keras import ops

from keras_attention.applications import base as app_base
from keras_attention.applications import presets
from keras_attention.applications.blocks import TransformerEncoderBlock
from keras_attention import _validation as base
from keras_attention._validation import check_texts as _check_texts
from keras_attention import registry
from keras_attention.applications.text_layers import AttentionPooling
from keras_attention.applications.text_layers import ClassTokenPooler
from keras_attention.applications.text_layers import TokenAndPositionEmbedding
from keras_attention.applications.word_pieces import WordPiecePreprocessor
from keras_attention.ops.masks import widened

PAD, UNK = "[PAD]", "[UNK]"
POOLINGS = ("attention", "cls")
# keras-hub's WordPiece tokenizer splits on RE2's `\s`, ASCII whitespace
# only: a no-break space (U+00A0, common in web text) or an ideographic space
# would glue two words into one unknown piece. Every Unicode space (what
# Python's `str.split()` splits on) becomes a plain space first.
_UNICODE_SPACES = r"[\s\p{Z}\x{85}\x{1c}-\x{1f}]"


def _plain_spaces(texts):
    """String tensor `texts` with every Unicode space made an ASCII space."""
    import tensorflow as tf

    return tf.strings.regex_replace(texts, _UNICODE_SPACES, " ")


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TextClassifierPreprocessor(WordPiecePreprocessor):
    """Texts to padded WordPiece token ids, with keras-hub's tokenizer.

    Args:
        vocabulary: the WordPiece vocabulary, a list of strings whose first
            two entries are `"[PAD]"` (id 0) and `"[UNK]"`.
        sequence_length: the length `T` of the ids; longer texts are
            truncated, shorter ones padded with 0.
        lowercase: lowercase the texts first.

    Call arguments:
        texts: a list of strings, or a string tensor (e.g. in a `tf.data`
            pipeline).

    Returns:
        int32 ids `(B, T)`: a NumPy array for a list of strings, a tensor
        for a tensor.

    Example:

    ```python
    # A word becomes one piece once it is frequent enough in `texts`
    # (from these two texts once each, every piece is a character).
    preprocessor = TextClassifierPreprocessor.from_texts(
        ["a good film", "a bad film"] * 10, vocabulary_size=50, sequence_length=6
    )
    preprocessor(["a good film"])  # [[id(a), id(good), id(film), 0, 0, 0]]
    ```
    """

    def __init__(self, vocabulary, sequence_length=32, lowercase=True):
        import keras_hub

        super().__init__(vocabulary, sequence_length, lowercase)
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary,
            sequence_length=sequence_length,
            lowercase=lowercase,
            oov_token=UNK,
            dtype="int32",
        )

    @classmethod
    def from_texts(
        cls, texts, vocabulary_size=1000, sequence_length=32, lowercase=True,
        special_tokens=(),
    ):
        """A preprocessor whose vocabulary is learned from `texts`.

        `special_tokens` (e.g. `("[MASK]",)` for pretraining) follow
        `[PAD]` and `[UNK]` at the start of the vocabulary.
        """
        import keras_hub
        import tensorflow as tf

        texts = _check_texts(texts)
        base.check_positive_int("vocabulary_size", vocabulary_size)
        data = tf.data.Dataset.from_tensor_slices(texts).batch(1024).map(_plain_spaces)
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            data,
            vocabulary_size,
            lowercase=lowercase,
            reserved_tokens=[PAD, UNK, *special_tokens],
        )
        return cls(vocabulary, sequence_length=sequence_length, lowercase=lowercase)

    def check_vocabulary(self, vocabulary):
        if vocabulary[:2] != [PAD, UNK]:
            raise base.invalid(
                "vocabulary",
                f"a list starting with {PAD!r}, {UNK!r}",
                vocabulary[:2],
            )

    def __call__(self, texts):
        if isinstance(texts, (list, tuple, np.ndarray, str)):
            texts = _check_texts(texts)
            if not texts:  # keras-hub gives shape (0,): no rows of length T
                return np.zeros((0, self.sequence_length), "int32")
            return ops.convert_to_numpy(self.tokenizer(_plain_spaces(texts)))
        return self.tokenizer(_plain_spaces(texts))

    def tokens(self, texts):
        """The word pieces of each text (without padding), lists of strings."""
        ids = self(texts)
        return [[self.vocabulary[i] for i in row if i != 0] for row in ids]


def _batches(inputs, batch_size):
    """Slices of `batch_size` rows of an array or a dict of arrays."""
    rows = len(keras.tree.flatten(inputs)[0])
    for i in range(0, rows, batch_size):
        yield keras.tree.map_structure(lambda a: a[i : i + batch_size], inputs)


def _as_arrays(inputs):
    """Token ids as NumPy: a dict's values each, anything else whole (a
    list of rows, or of texts, is one array: mapped over as a structure,
    it became a list of rows without a `shape`)."""
    if isinstance(inputs, dict):
        return {key: np.asarray(value) for key, value in inputs.items()}
    return np.asarray(inputs)


def _holds_text(value):
    """Whether `value` is strings: a NumPy array of `str`/`bytes`/objects,
    or a TensorFlow string tensor or spec."""
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, np.dtype):
        return dtype.kind in "USO"
    return getattr(dtype, "name", str(dtype)) == "string"


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TextClassifierBackbone(app_base.Backbone):
    """Transformer encoder with attention pooling over token ids.

    `TokenAndPositionEmbedding` (id 0 is padding and masked),
    `depth` pre-norm `TransformerEncoderBlock`s, a final layer
    normalization and `AttentionPooling`: features `(B, hidden_dim)`.
    BERT's layout (Devlin et al., 2019) is a choice of arguments:
    `token_types=2, embedding_norm=True, norm_first=False,
    final_norm=False, pooling="cls", layer_norm_epsilon=1e-12` (what
    `from_transformers` builds).

    Args:
        vocabulary_size: number of token ids.
        sequence_length: length `T` of the id sequences.
        hidden_dim: token size `C`.
        depth: number of encoder blocks.
        num_heads: attention heads.
        mlp_dim: MLP hidden size.
        dropout: dropout rate of the embedding and the blocks.
        attention: registry name of the self-attention (a layer taking
            `(B, T, C)` and a `mask`; default `"multi_head"`).
        attention_kwargs: extra constructor arguments of that layer.
        pooling_units: hidden size of the additive pooling scorer.
        attention_dropout: dropout rate on the attention weights.
        token_types: number of token types; with `token_types > 0` the
            inputs are a dict `{"token_ids", "token_type_ids"}`.
        max_positions: rows of the position table (`None`: `T`).
        embedding_norm: a LayerNorm on the embeddings (BERT).
        layer_norm_epsilon: epsilon of every LayerNorm.
        norm_first: pre-norm blocks (`True`) or post-norm (BERT).
        final_norm: a LayerNorm after the last block.
        pooling: `"attention"` (additive attention with a learned query)
            or `"cls"` (BERT's pooler, `tanh(Dense(x_0))`).

    Call arguments:
        token_ids: int `(B, T)`, 0 for padding (or the dict above).

    Returns:
        Features `(B, hidden_dim)`; `token_features(inputs)` gives the
        tokens `(B, T, hidden_dim)` before pooling.

    Raises:
        ValueError: naming the argument: `vocabulary_size`,
            `sequence_length`, `hidden_dim` or `depth` not positive
            integers; `dropout` outside `[0, 1)`; an `attention` the
            registry lacks; `pooling` not one of its names; token ids
            that are not integers `(B, sequence_length)` (or text, which
            goes through the preprocessor), or outside
            `[0, vocabulary_size)`.

    Example:

    ```python
    backbone = TextClassifierBackbone(vocabulary_size=100, sequence_length=8)
    ids = np.array([[5, 6, 7, 0, 0, 0, 0, 0]])
    backbone(ids).shape  # (1, 64)
    backbone.token_weights(ids)  # (1, 8), zero on the padding
    ```

    References:
        - Vaswani et al., Attention Is All You Need, 2017.
          https://arxiv.org/abs/1706.03762
        - Yang et al., Hierarchical Attention Networks for Document
          Classification, 2016. https://aclanthology.org/N16-1174
        - Devlin et al., BERT, 2019. https://arxiv.org/abs/1810.04805
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        hidden_dim=64,
        depth=2,
        num_heads=4,
        mlp_dim=128,
        dropout=0.1,
        attention="multi_head",
        attention_kwargs=None,
        pooling_units=64,
        attention_dropout=0.0,
        token_types=0,
        max_positions=None,
        embedding_norm=False,
        layer_norm_epsilon=1e-6,
        norm_first=True,
        final_norm=True,
        pooling="attention",
        **kwargs,
    ):
        base.check_positive_int("vocabulary_size", vocabulary_size)
        base.check_positive_int("sequence_length", sequence_length)
        base.check_positive_int("hidden_dim", hidden_dim)
        base.check_positive_int("depth", depth)
        base.check_rate("dropout", dropout)
        attention = registry.check_name(attention, kinds=("tokens",))
        if pooling not in POOLINGS:
            raise base.invalid("pooling", f"one of {POOLINGS}", pooling)

        inputs = keras.Input(shape=(sequence_length,), dtype="int32", name="token_ids")
        embedding = TokenAndPositionEmbedding(
            vocabulary_size, sequence_length, hidden_dim,
            max_positions=max_positions, token_types=token_types,
            normalize=embedding_norm, layer_norm_epsilon=layer_norm_epsilon,
            name="embedding",
        )
        if token_types:
            type_ids = keras.Input(
                shape=(sequence_length,), dtype="int32", name="token_type_ids"
            )
            x = embedding(inputs, type_ids)
            inputs = {"token_ids": inputs, "token_type_ids": type_ids}
        else:
            x = embedding(inputs)
        if dropout:
            x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
        for index in range(depth):
            x = TransformerEncoderBlock(
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                dropout=dropout,
                attention_dropout=attention_dropout,
                attention=attention,
                attention_kwargs=attention_kwargs,
                layer_norm_epsilon=layer_norm_epsilon,
                norm_first=norm_first,
                name=f"block_{index}",
            )(x)
        if final_norm:
            x = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_norm"
            )(x)
        weights = None
        if pooling == "cls":
            outputs = ClassTokenPooler(name="pooler")(x)
        else:
            outputs, weights = AttentionPooling(pooling_units, name="pooling")(
                x, return_attention_scores=True
            )
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._weights_output = weights
        self._weights_model = None
        self._tokens_output = x
        self._tokens_model = None

        self.keep_config(locals())

    def check_inputs(self, inputs):
        if isinstance(inputs, dict) != bool(self.token_types):
            expected = (
                'a dict {"token_ids", "token_type_ids"}' if self.token_types
                else "token ids"
            )
            raise base.invalid("token_ids", expected, type(inputs).__name__)
        items = inputs.items() if self.token_types else [("token_ids", inputs)]
        expected = (None, self.sequence_length)
        for name, value in items:
            shape = tuple(value.shape)
            if _holds_text(value):
                raise ValueError(
                    f"Received an invalid value for argument `{name}`, "
                    f"expected integer ids of shape {expected}, not text. "
                    "Texts go to `predict_texts` / `explain`, or through "
                    "the preprocessor first (`model.preprocessor(texts)`). "
                    f"Received: {name}.shape={shape} of strings"
                )
            rows = self.get_layer("embedding").position_embedding.shape[0]
            if len(shape) != 2 or (shape[1] is not None and shape[1] > rows):
                raise ValueError(
                    f"Received an invalid value for argument `{name}`, "
                    f"expected integer ids of shape {expected} (shorter, "
                    f"padded rows too: at most {rows}, the position table's "
                    f"rows). Received: {name}.shape={shape}"
                )
            if shape[1] is None:  # a dataset's batch: no longer than the table
                base.check_batch_length(
                    name, value, 1, rows, f"a position table of {rows} rows"
                )
            # Values known before `fit`, `evaluate` or `predict` trace the
            # model, or a dataset's batches (`InputChecks`).
            stop, size = (
                (self.token_types, f"token_types={self.token_types}")
                if name == "token_type_ids"
                else (self.vocabulary_size,
                      f"vocabulary_size={self.vocabulary_size}")
            )
            base.check_known_ids(name, value, stop, "ids", size)

    @property
    def tokens_model(self):
        """A model sharing these layers: inputs -> tokens `(B, T, C)`."""
        if self._tokens_model is None:
            self._tokens_model = keras.Model(
                self.input, self._tokens_output, name=f"{self.name}_tokens"
            )
            # keras's functional constructor takes no `dtype`.
            self._tokens_model.dtype_policy = self.dtype_policy
        return self._tokens_model

    def token_features(self, inputs):
        """The encoded tokens `(B, T, hidden_dim)`, before pooling."""
        inputs = _as_arrays(inputs)
        self.check_inputs(inputs)
        return ops.convert_to_numpy(self.tokens_model(inputs, training=False))

    def token_weights(self, token_ids):
        """The pooling weights `(B, T)`: how much each token decided.

        Rows sum to 1 over the real tokens; padding gets 0.
        """
        if self._weights_output is None:
            raise ValueError(
                "token_weights needs attention pooling. Received: "
                f"pooling={self.pooling!r}"
            )
        token_ids = _as_arrays(token_ids)
        self.check_inputs(token_ids)
        if self._weights_model is None:
            self._weights_model = keras.Model(self.input, self._weights_output)
        weights = self._weights_model(token_ids, training=False)
        return ops.convert_to_numpy(widened(weights))  # float32 when mixed

    @classmethod
    def from_transformers(cls, source, sequence_length=None, **kwargs):
        """The encoder of a Hugging Face BERT, with its weights.

        See `TextClassifier.from_transformers`; the backbone leaves out the
        checkpoint's classifier.
        """
        from keras_attention.applications.converters import bert

        return bert.backbone_from_transformers(
            cls, source, sequence_length=sequence_length, **kwargs
        )


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TextClassifier(app_base.Classifier):
    """Text classifier: `TextClassifierBackbone` and a dense head.

    Takes token ids `(B, T)`; with a `preprocessor`, `predict_texts` and
    `explain` take strings, and the `.keras` file keeps the vocabulary.

    Args:
        vocabulary_size, sequence_length: see `TextClassifierBackbone`;
            needed unless `backbone` is given, with a `preprocessor` they
            default to its own.
        num_classes: number of classes.
        preprocessor: an optional `TextClassifierPreprocessor`.
        backbone: an existing `TextClassifierBackbone` (fine-tuning).
        **kwargs: the head's `activation` (`None` gives logits) and
            `head_dropout` (see `Classifier`), and the other arguments of
            `TextClassifierBackbone` (`hidden_dim`, `depth`, ...; see it),
            ignored when `backbone` is given.

    Call arguments:
        token_ids: int `(B, T)`, 0 for padding.

    Returns:
        Logits `(B, num_classes)`.

    Raises:
        ValueError: naming the argument: `num_classes` not a positive
            integer, `head_dropout` outside `[0, 1)`, `backbone` not a
            `TextClassifierBackbone`, or, without one, the backbone's
            arguments as `TextClassifierBackbone` checks them (required ones
            missing too); inputs of another shape than the backbone's; in
            `fit` and `evaluate`, labels that are not one class id in `[0,
            num_classes)` per example (checked before anything is traced); a
            `preprocessor` of another `sequence_length` or a larger
            vocabulary than the backbone's.

    Example:

    ```python
    texts, labels = make_sentiment_task(512, seed=0)
    preprocessor = TextClassifierPreprocessor.from_texts(texts, 200, 24)
    model = TextClassifier(num_classes=2, preprocessor=preprocessor)
    model.compile(optimizer="adam")
    model.fit(preprocessor(texts), labels, epochs=3)
    tokens, weights = model.explain(["the film was not good"])
    ```

    References:
        - Vaswani et al., Attention Is All You Need, 2017.
          https://arxiv.org/abs/1706.03762
        - Bahdanau et al., Neural Machine Translation by Jointly Learning to
          Align and Translate, 2015. https://arxiv.org/abs/1409.0473
    """

    backbone_class = TextClassifierBackbone
    backbone_hint = "a `preprocessor`, or "

    def __init__(
        self,
        vocabulary_size=None,
        sequence_length=None,
        num_classes=None,
        preprocessor=None,
        backbone=None,
        **kwargs,
    ):
        preprocessor = app_base.deserialize_preprocessor(preprocessor)
        if backbone is None and preprocessor is not None:
            vocabulary_size = vocabulary_size or preprocessor.vocabulary_size
            sequence_length = sequence_length or preprocessor.sequence_length
        super().__init__(
            backbone,
            num_classes,
            vocabulary_size=vocabulary_size,
            sequence_length=sequence_length,
            **kwargs,
        )
        backbone = self.backbone
        if preprocessor is not None and (
            preprocessor.sequence_length != backbone.sequence_length
            or preprocessor.vocabulary_size > backbone.vocabulary_size
        ):
            raise ValueError(
                "Received an invalid value for argument `preprocessor`, "
                f"expected sequence_length={backbone.sequence_length} and at "
                f"most {backbone.vocabulary_size} tokens (the backbone's). "
                f"Received: sequence_length={preprocessor.sequence_length}, "
                f"vocabulary_size={preprocessor.vocabulary_size}"
            )
        self._preprocessor = preprocessor

    @property
    def preprocessor(self):
        return self._preprocessor

    def token_weights(self, token_ids):
        """The pooling weights `(B, T)`; see the backbone's method."""
        return self.backbone.token_weights(token_ids)

    def _require_preprocessor(self):
        if self._preprocessor is None:
            raise ValueError(
                "This TextClassifier has no `preprocessor`; pass token ids "
                "or build it with `preprocessor=`."
            )
        return self._preprocessor

    def predict_texts(self, texts, batch_size=256):
        """Class probabilities (or activations) `(B, num_classes)` of texts."""
        ids = self._require_preprocessor()(texts)
        # Eager batches: no compilation for the few texts this is meant for.
        outputs = [
            ops.convert_to_numpy(self(batch, training=False))
            for batch in _batches(ids, batch_size)
        ]
        if not outputs:  # no texts: no rows
            return np.zeros((0, self.num_classes), "float32")
        outputs = np.concatenate(outputs)
        if self.activation is keras.activations.linear:
            outputs = ops.convert_to_numpy(ops.softmax(outputs, axis=-1))
        return outputs

    def explain(self, texts):
        """`(tokens, weights)`: each text's word pieces and their weights."""
        preprocessor = self._require_preprocessor()
        ids = preprocessor(texts)
        weights = self.token_weights(ids)
        tokens = [[preprocessor.vocabulary[i] for i in row if i != 0] for row in ids]
        return tokens, [w[: len(t)] for w, t in zip(weights, tokens)]

    @classmethod
    def from_transformers(cls, source, num_classes=None, sequence_length=None, **kwargs):
        """A Hugging Face BERT (`BertModel`, `BertForSequenceClassification`).

        Builds the BERT layout of `TextClassifierBackbone` (learned
        positions, token types, embedding LayerNorm, post-norm blocks with
        exact GELU, the [CLS] pooler) and loads every tensor; the outputs
        match Hugging Face's within float32 rounding. Every tensor is
        checked first: another architecture, a missing, extra or misshapen
        tensor, or a config that disagrees with the tensors is a
        `ValueError` naming it, and no weight is assigned.

        Args:
            source: a `transformers` BERT model, or a local folder of
                `save_pretrained` / a hub snapshot (`config.json` and
                `model.safetensors`, read without torch, or
                `pytorch_model.bin`). A `vocab.txt` there gives the model a
                `BertPreprocessor` (keras-hub's WordPiece tokenizer).
            num_classes: classes of the head; `None` keeps the checkpoint's
                classifier (a checkpoint without one needs it: a new head).
            sequence_length: the input length `T` (default: the config's
                `max_position_embeddings`).
            **kwargs: other `TextClassifierBackbone` arguments (e.g.
                `attention="local_window"` keeps the projections).

        Returns:
            A `TextClassifier` taking `{"token_ids", "token_type_ids"}`.

        Example:

        ```python
        from transformers import BertConfig, BertForSequenceClassification

        reference = BertForSequenceClassification(BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64))
        model = TextClassifier.from_transformers(reference, sequence_length=16)
        ```
        """
        from keras_attention.applications.converters import bert

        return bert.classifier_from_transformers(
            cls, source, num_classes=num_classes,
            sequence_length=sequence_length, **kwargs,
        )


presets.register_preset(
    "text_sentiment_small",
    "TextClassifier",
    dict(
        vocabulary_size=512,
        sequence_length=32,
        num_classes=2,
        hidden_dim=64,
        depth=2,
        num_heads=4,
        mlp_dim=128,
        dropout=0.1,
    ),
    description="Two-block Transformer with additive-attention pooling for "
    "short sentences (configuration only).",
)
