"""The text encoder's embedding and pooling layers.

`TokenAndPositionEmbedding` sums token, learned position and (BERT's)
token-type embeddings, optionally layer-normalised; `AttentionPooling`
pools tokens with a learned query (the text classifier's default);
`ClassTokenPooler` is BERT's pooler, `tanh(Dense(x[:, 0]))`.
"""

import keras
from keras import ops

from keras_attention._validation import check_bool
from keras_attention import _validation as base
from keras_attention.applications import base as app_base
from keras_attention.layers.additive import AdditiveAttention
from keras_attention._config import ArgumentConfig


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class TokenAndPositionEmbedding(ArgumentConfig, keras.layers.Layer):
    """Token embedding plus a learned position embedding; id 0 is masked.

    `x = E_token[ids] + E_position[:T] (+ E_type[token_type_ids])`, then
    optionally a LayerNorm (BERT's embedding, Devlin et al., 2019).

    Args:
        vocabulary_size: number of token ids.
        sequence_length: the (maximum) length `T`.
        hidden_dim: embedding size `C`.
        max_positions: rows of the position table (BERT's
            `max_position_embeddings`); `None` means `sequence_length`.
            Position `t` uses row `t`, so a longer table changes nothing
            but the weight's shape.
        token_types: number of token types (BERT's `type_vocab_size`);
            0 (the default) has no token-type embedding and no second input.
        normalize: apply a LayerNorm to the sum.
        layer_norm_epsilon: its epsilon.

    Call arguments:
        token_ids: int `(B, T)`.
        token_type_ids: int `(B, T)`, when `token_types > 0`.

    Returns:
        `(B, T, C)`, with the Keras mask `token_ids != 0`.

    Example:

    ```python
    layer = TokenAndPositionEmbedding(100, 8, 16, token_types=2, normalize=True)
    ids = np.array([[2, 5, 6, 3, 7, 3, 0, 0]])
    layer(ids, np.array([[0, 0, 0, 0, 1, 1, 0, 0]])).shape  # (1, 8, 16)
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        hidden_dim,
        max_positions=None,
        token_types=0,
        normalize=False,
        layer_norm_epsilon=1e-12,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = base.check_positive_int(
            "vocabulary_size", vocabulary_size
        )
        self.sequence_length = base.check_positive_int(
            "sequence_length", sequence_length
        )
        self.hidden_dim = base.check_positive_int("hidden_dim", hidden_dim)
        self.max_positions = check_max_positions(max_positions, sequence_length)
        self.token_types = check_token_types(token_types)
        self.normalize = check_bool("normalize", normalize)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    def build(self, token_ids_shape, token_type_ids_shape=None):
        import keras_hub

        input_shape = tuple(token_ids_shape)
        initializer = keras.initializers.RandomNormal(stddev=0.02)

        def embedding(layer_class, rows, name):
            layer = layer_class(
                rows,
                self.hidden_dim,
                embeddings_initializer=initializer,
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build(input_shape)
            return layer

        # Reversible: a masked-LM head reuses it as its output projection.
        self.token_embedding = embedding(
            keras_hub.layers.ReversibleEmbedding,
            self.vocabulary_size,
            "token_embedding",
        )
        self.position_embedding = self.add_weight(
            name="position_embedding",
            shape=(self.max_positions or self.sequence_length, self.hidden_dim),
            initializer=initializer,
        )
        if self.token_types:
            self.token_type_embedding = embedding(
                keras.layers.Embedding, self.token_types, "token_type_embedding"
            )
        if self.normalize:
            self.norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, name="norm", dtype=self.dtype_policy
            )
            self.norm.build(tuple(input_shape) + (self.hidden_dim,))
        self.built = True

    def call(self, token_ids, token_type_ids=None):
        x = self.token_embedding(token_ids)
        positions = ops.cast(self.position_embedding, x.dtype)
        x = x + positions[None, : ops.shape(token_ids)[1]]
        if self.token_types:
            if token_type_ids is None:
                token_type_ids = ops.zeros_like(token_ids)
            x = x + self.token_type_embedding(token_type_ids)
        if self.normalize:
            x = self.norm(x)
        return x

    def compute_mask(self, token_ids, token_type_ids=None, mask=None):
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, token_ids_shape, token_type_ids_shape=None):
        return tuple(token_ids_shape) + (self.hidden_dim,)


def check_max_positions(value, sequence_length):
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < sequence_length:
        raise base.invalid(
            "max_positions",
            f"None or an integer >= sequence_length={sequence_length}",
            value,
        )
    return value


def check_token_types(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise base.invalid("token_types", "a non-negative integer", value)
    return value


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class AttentionPooling(ArgumentConfig, keras.layers.Layer):
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
            return pooled, keras.KerasTensor(tokens.shape[:2], tokens.dtype)
        return pooled

    def compute_mask(self, inputs, mask=None):
        return None


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class ClassTokenPooler(keras.layers.Layer):
    """BERT's pooler: `tanh(W x_0 + b)` on the first ([CLS]) token.

    Call arguments:
        tokens: `(B, T, C)`.

    Returns:
        `(B, C)`.

    Example:

    ```python
    ClassTokenPooler()(np.zeros((2, 5, 8))).shape  # (2, 8)
    ```

    References:
        - Devlin et al., BERT: Pre-training of Deep Bidirectional
          Transformers for Language Understanding, 2019.
          https://arxiv.org/abs/1810.04805
    """

    def build(self, input_shape):
        self.dense = keras.layers.Dense(
            input_shape[-1], activation="tanh", name="dense", dtype=self.dtype_policy
        )
        self.dense.build((input_shape[0], input_shape[-1]))
        self.built = True

    def call(self, tokens, mask=None):
        return self.dense(tokens[:, 0])

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def compute_mask(self, inputs, mask=None):
        return None
