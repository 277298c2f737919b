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
from keras_attention import registry
from keras_attention.layers.additive import AdditiveAttention

PAD, UNK = "[PAD]", "[UNK]"


def _check_texts(texts):
    if isinstance(texts, str):
        raise base.invalid("texts", "a list of strings, not one string", texts)
    texts = list(texts.tolist() if isinstance(texts, np.ndarray) else texts)
    for i, text in enumerate(texts):
        if isinstance(text, bytes):
            texts[i] = text.decode("utf-8")
        elif not isinstance(text, str):
            raise ValueError(
                "Received an invalid value for argument `texts`, expected "
                f"strings. Received: texts[{i}]={text!r}"
            )
    return texts


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TextClassifierPreprocessor:
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
    preprocessor = TextClassifierPreprocessor.from_texts(
        ["a good film", "a bad film"], vocabulary_size=50, sequence_length=6
    )
    preprocessor(["a good film"])  # [[id(a), id(good), id(film), 0, 0, 0]]
    ```
    """

    def __init__(self, vocabulary, sequence_length=32, lowercase=True):
        import keras_hub

        vocabulary = list(vocabulary)
        if vocabulary[:2] != [PAD, UNK]:
            raise base.invalid(
                "vocabulary",
                f"a list starting with {PAD!r}, {UNK!r}",
                vocabulary[:2],
            )
        self.vocabulary = vocabulary
        self.sequence_length = base.check_positive_int(
            "sequence_length", sequence_length
        )
        self.lowercase = bool(lowercase)
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=vocabulary,
            sequence_length=sequence_length,
            lowercase=lowercase,
            oov_token=UNK,
            dtype="int32",
        )

    @classmethod
    def from_texts(cls, texts, vocabulary_size=1000, sequence_length=32, lowercase=True):
        """A preprocessor whose vocabulary is learned from `texts`."""
        import keras_hub
        import tensorflow as tf

        texts = _check_texts(texts)
        base.check_positive_int("vocabulary_size", vocabulary_size)
        data = tf.data.Dataset.from_tensor_slices(texts).batch(1024)
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            data,
            vocabulary_size,
            lowercase=lowercase,
            reserved_tokens=[PAD, UNK],
        )
        return cls(vocabulary, sequence_length=sequence_length, lowercase=lowercase)

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    def __call__(self, texts):
        if isinstance(texts, (list, tuple, np.ndarray, str)):
            return ops.convert_to_numpy(self.tokenizer(_check_texts(texts)))
        return self.tokenizer(texts)

    def tokens(self, texts):
        """The word pieces of each text (without padding), lists of strings."""
        ids = self(texts)
        return [[self.vocabulary[i] for i in row if i != 0] for row in ids]

    def get_config(self):
        return {
            "vocabulary": self.vocabulary,
            "sequence_length": self.sequence_length,
            "lowercase": self.lowercase,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned position embedding; id 0 is masked.

    Args:
        vocabulary_size: number of token ids.
        sequence_length: the (maximum) length `T`.
        hidden_dim: embedding size `C`.

    Call arguments:
        token_ids: int `(B, T)`.

    Returns:
        `(B, T, C)`, with the Keras mask `token_ids != 0`.
    """

    def __init__(self, vocabulary_size, sequence_length, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = base.check_positive_int(
            "vocabulary_size", vocabulary_size
        )
        self.sequence_length = base.check_positive_int(
            "sequence_length", sequence_length
        )
        self.hidden_dim = base.check_positive_int("hidden_dim", hidden_dim)

    def build(self, input_shape):
        self.token_embedding = keras.layers.Embedding(
            self.vocabulary_size,
            self.hidden_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="token_embedding",
            dtype=self.dtype_policy,
        )
        self.token_embedding.build(input_shape)
        self.position_embedding = self.add_weight(
            name="position_embedding",
            shape=(self.sequence_length, self.hidden_dim),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )
        self.built = True

    def call(self, token_ids):
        x = self.token_embedding(token_ids)
        positions = ops.cast(self.position_embedding, x.dtype)
        return x + positions[None, : ops.shape(token_ids)[1]]

    def compute_mask(self, token_ids, mask=None):
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "sequence_length": self.sequence_length,
                "hidden_dim": self.hidden_dim,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class AttentionPooling(keras.layers.Layer):
    """Pools tokens with a learned query and additive attention.

    `c = sum_t a_t x_t`, `a = softmax_t(v^T tanh(W1 q + W2 x_t))` where the
    query `q` is a learned vector (the "context vector" of Yang et al.,
    2016) and the scores are those of `AdditiveAttention`; padded tokens get
    weight 0.

    Args:
        units: hidden size of the additive scorer.

    Call arguments:
        tokens: `(B, T, C)`.
        mask: optional boolean `(B, T)`, `True` for real tokens (Keras masks
            are used).
        return_attention_scores: also return the weights `(B, T)`.

    Returns:
        `(B, C)`, and the weights `(B, T)` if `return_attention_scores`.
    """

    def __init__(self, units=64, **kwargs):
        super().__init__(**kwargs)
        self.units = base.check_positive_int("units", units)
        self.supports_masking = True

    def build(self, input_shape):
        channels = input_shape[-1]
        self.query = self.add_weight(
            name="query",
            shape=(1, 1, channels),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )
        self.attention = AdditiveAttention(
            self.units, name="additive_attention", dtype=self.dtype_policy
        )
        self.attention.build((None, 1, channels), tuple(input_shape))
        self.built = True

    def call(self, tokens, mask=None, return_attention_scores=False):
        query = ops.broadcast_to(
            ops.cast(self.query, tokens.dtype),
            (ops.shape(tokens)[0], 1, tokens.shape[-1]),
        )
        pooled, weights = self.attention(
            [query, tokens], value_mask=mask, return_attention_scores=True
        )
        pooled, weights = pooled[:, 0], weights[:, 0]
        if return_attention_scores:
            return pooled, weights
        return pooled

    def compute_output_spec(self, tokens, mask=None, return_attention_scores=False):
        pooled = keras.KerasTensor((tokens.shape[0], tokens.shape[-1]), tokens.dtype)
        if return_attention_scores:
            return pooled, keras.KerasTensor(tokens.shape[:2], "float32")
        return pooled

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update({"units": self.units})
        return config


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TextClassifierBackbone(app_base.Backbone):
    """Transformer encoder with attention pooling over token ids.

    `TokenAndPositionEmbedding` (id 0 is padding and masked),
    `depth` pre-norm `TransformerEncoderBlock`s, a final layer
    normalization and `AttentionPooling`: features `(B, hidden_dim)`.

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

    Call arguments:
        token_ids: int `(B, T)`, 0 for padding.

    Returns:
        Features `(B, hidden_dim)`.

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
    """

    config_keys = (
        "vocabulary_size", "sequence_length", "hidden_dim", "depth",
        "num_heads", "mlp_dim", "dropout", "attention", "attention_kwargs",
        "pooling_units",
    )

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
        **kwargs,
    ):
        base.check_positive_int("vocabulary_size", vocabulary_size)
        base.check_positive_int("sequence_length", sequence_length)
        base.check_positive_int("hidden_dim", hidden_dim)
        base.check_positive_int("depth", depth)
        base.check_rate("dropout", dropout)
        attention = registry.check_name(attention)

        inputs = keras.Input(shape=(sequence_length,), dtype="int32", name="token_ids")
        x = TokenAndPositionEmbedding(
            vocabulary_size, sequence_length, hidden_dim, name="embedding"
        )(inputs)
        if dropout:
            x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
        for index in range(depth):
            x = TransformerEncoderBlock(
                num_heads=num_heads,
                mlp_dim=mlp_dim,
                dropout=dropout,
                attention=attention,
                attention_kwargs=attention_kwargs,
                name=f"block_{index}",
            )(x)
        x = keras.layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
        outputs, weights = AttentionPooling(pooling_units, name="pooling")(
            x, return_attention_scores=True
        )
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._weights_output = weights
        self._weights_model = None

        self.keep_config(locals())

    def check_inputs(self, inputs):
        shape = tuple(inputs.shape)
        expected = (None, self.sequence_length)
        if len(shape) != 2 or shape[1] not in (None, self.sequence_length):
            raise ValueError(
                "Received an invalid value for argument `token_ids`, expected "
                f"integer ids of shape {expected}. Received: "
                f"token_ids.shape={shape}"
            )

    def token_weights(self, token_ids):
        """The pooling weights `(B, T)`: how much each token decided.

        Rows sum to 1 over the real tokens; padding gets 0.
        """
        token_ids = np.asarray(token_ids)
        self.check_inputs(token_ids)
        if self._weights_model is None:
            self._weights_model = keras.Model(self.input, self._weights_output)
        return ops.convert_to_numpy(self._weights_model(token_ids, training=False))


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TextClassifier(app_base.Classifier):
    """Text classifier: `TextClassifierBackbone` and a dense head.

    Takes token ids `(B, T)`; with a `preprocessor`, `predict_texts` and
    `explain` take strings, and the `.keras` file keeps the vocabulary.

    Args:
        vocabulary_size, sequence_length, hidden_dim, depth, num_heads,
        mlp_dim, dropout, attention, attention_kwargs, pooling_units: the
            backbone's arguments (see `TextClassifierBackbone`); ignored when
            `backbone` is given. With a `preprocessor`, `vocabulary_size`
            and `sequence_length` default to its own.
        num_classes: number of classes.
        preprocessor: an optional `TextClassifierPreprocessor`.
        backbone: an existing `TextClassifierBackbone` (fine-tuning).
        activation: output activation; `None` gives logits.
        head_dropout: dropout rate before the output layer.

    Call arguments:
        token_ids: int `(B, T)`, 0 for padding.

    Returns:
        Logits `(B, num_classes)`.

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

    def __init__(
        self,
        vocabulary_size=None,
        sequence_length=None,
        num_classes=None,
        hidden_dim=64,
        depth=2,
        num_heads=4,
        mlp_dim=128,
        dropout=0.1,
        attention="multi_head",
        attention_kwargs=None,
        pooling_units=64,
        preprocessor=None,
        backbone=None,
        activation=None,
        head_dropout=0.0,
        **kwargs,
    ):
        if isinstance(preprocessor, dict):
            preprocessor = keras.saving.deserialize_keras_object(preprocessor)
        if backbone is None and preprocessor is not None:
            vocabulary_size = vocabulary_size or preprocessor.vocabulary_size
            sequence_length = sequence_length or preprocessor.sequence_length
        backbone = self.backbone_from(
            backbone,
            locals(),
            ("vocabulary_size", "sequence_length"),
            hint="a `preprocessor`, or ",
        )
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
        super().__init__(
            backbone,
            num_classes,
            activation=activation,
            head_dropout=head_dropout,
            **kwargs,
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
        outputs = np.concatenate(
            [
                ops.convert_to_numpy(self(ids[i : i + batch_size], training=False))
                for i in range(0, len(ids), batch_size)
            ]
        )
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

    def get_config(self):
        config = super().get_config()
        if self._preprocessor is not None:
            config["preprocessor"] = keras.saving.serialize_keras_object(
                self._preprocessor
            )
        return config


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
