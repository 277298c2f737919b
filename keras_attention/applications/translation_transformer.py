"""Transformer translation (Vaswani et al.) with a key/value cache."""

import functools

import keras
from keras import ops

from keras_attention import registry
from keras_attention.applications import presets
from keras_attention.applications.translation import DATE_TASK_INPUT_SHAPE
from keras_attention.applications.translation import Translator
from keras_attention.applications.blocks import TransformerDecoderBlock
from keras_attention.applications.blocks import TransformerEncoderBlock
from keras_attention.layers.dropout import HashDropout
from keras_attention.ops.shapes import index_dtype
from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention._validation import invalid


@functools.cache
def _position_embedding_class():
    """keras-hub's `PositionEmbedding`, with a `compute_output_shape` that
    takes the argument name its `build` records (`inputs_shape`): keras's
    `summary` of a subclassed model passes the recorded build shapes by
    name, and keras-hub's (`input_shape`) made it a TypeError. The same
    weights and paths."""
    import keras_hub

    class PositionEmbedding(keras_hub.layers.PositionEmbedding):
        def compute_output_shape(self, inputs_shape):
            return super().compute_output_shape(inputs_shape)

    return PositionEmbedding


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerTranslator(Translator):
    """Transformer encoder-decoder translation (Vaswani et al., 2017).

    Token plus learned position embeddings feed `num_layers` encoder blocks
    (self-attention, MLP) and `num_layers` decoder blocks (causal
    self-attention, cross-attention to the encoder output, MLP), all with
    the attention layer registered as `attention` (`MultiHeadAttention` by
    default). Padding masks (id 0) go to every
    attention call as query and key masks.

    The blocks are **pre-norm**, `x + f(LayerNorm(x))`, with a final
    LayerNorm after each stack: the residual path from the embeddings to the
    output is an identity, so gradients reach the lower layers unscaled and
    training is stable without a learning-rate warm-up and at the larger
    learning rates that a short CPU training budget needs (Xiong et al.,
    2020; Nguyen & Salazar, 2019). Post-norm (the original) puts a
    LayerNorm on that path and needs a warm-up to train at all.

    Decoding keeps a key/value cache per decoder layer, the
    self-attention's own `(B, 2, L, K, D)` (`MultiHeadAttention(...,
    cache=, cache_update_index=)`, keras-hub's convention): generating token
    `t` projects only that token and attends to the cached keys and values
    of tokens `0..t`, and the cross-attention keys and values of the source
    are computed once per sentence.

    Args:
        preprocessor: a `TranslationPreprocessor`; the date task's by
            default. Its lengths are the numbers of positions.
        num_layers: blocks in the encoder and in the decoder.
        hidden_dim: model width; a multiple of `num_heads`.
        num_heads: attention heads.
        intermediate_dim: hidden size of the MLPs.
        dropout: dropout on the attention weights, residual branches and
            embeddings.
        attention: registry name of the attention layer of every block (a
            `"tokens"` layer taking `query`, `value`, `query_mask`,
            `value_mask`, `use_causal_mask`); it is offered `num_heads`,
            `key_dim` and `dropout`. Layers without `MultiHeadAttention`'s
            `cache=` argument and hooks decode without the cache.
        attention_kwargs: extra constructor arguments of that layer.

    Call arguments:
        inputs: `{"source_ids": (B, S), "target_ids": (B, T)}`.
        training: whether dropout is active.

    Returns:
        Next-token logits `(B, T, V)`.

    Raises:
        ValueError: naming the argument: `preprocessor` not a
            `TranslationPreprocessor`; `num_layers`, `hidden_dim`,
            `num_heads` or `intermediate_dim` not positive integers
            (`num_heads` a divisor of
            `hidden_dim`); `dropout` outside `[0, 1)`; an `attention` the
            registry lacks or that does not take tokens; inputs that are
            not `(B, S)` source and `(B, T)` target ids in the
            preprocessor's vocabularies, or longer than its lengths; in
            `fit` and `evaluate`, labels outside the target vocabulary.

    Example:

    ```python
    model = TransformerTranslator.from_preset("tiny")
    model.compile()
    x, y = model.prepare(["3 March 1998"], ["1998-03-03"])
    model.fit(x, y, epochs=1, verbose=0)
    text, attention = model.translate("3 March 1998", return_attention=True)
    attention["weights"].shape  # (generated tokens, source tokens)
    ```

    References:
        - Vaswani et al., Attention Is All You Need, 2017.
          https://arxiv.org/abs/1706.03762
        - Xiong et al., On Layer Normalization in the Transformer
          Architecture, 2020. https://arxiv.org/abs/2002.04745
    """

    default_learning_rate = 5e-4

    def __init__(
        self,
        preprocessor=None,
        num_layers=2,
        hidden_dim=128,
        num_heads=4,
        intermediate_dim=512,
        dropout=0.1,
        attention="multi_head",
        attention_kwargs=None,
        **kwargs,
    ):
        super().__init__(preprocessor=preprocessor, **kwargs)
        import keras_hub

        self.num_layers = check_positive_int("num_layers", num_layers)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        if hidden_dim % num_heads:
            raise invalid(
                "num_heads", f"a divisor of hidden_dim={hidden_dim}", num_heads
            )
        self.intermediate_dim = check_positive_int(
            "intermediate_dim", intermediate_dim
        )
        self.dropout = check_rate("dropout", dropout)
        self.attention = registry.check_name(attention, kinds=("tokens",))
        self.attention_kwargs = dict(attention_kwargs or {})
        if self.attention_kwargs.get("implementation") in ("blocked", "chunked", "fused"):
            # `fit` failed at its first step: decoding and the pictures read
            # the cross-attention weights, which these paths do not return.
            raise invalid(
                "attention_kwargs",
                "no implementation that returns no weights (the decoder's "
                "cross-attention weights are read: 'auto' or 'dense')",
                self.attention_kwargs,
            )
        p = self.preprocessor
        self.source_embedding = keras.layers.Embedding(
            p.source_vocabulary_size, hidden_dim,
            name="source_embedding",
        )
        self.source_positions = _position_embedding_class()(
            p.source_length, name="source_positions"
        )
        self.target_embedding = keras.layers.Embedding(
            p.target_vocabulary_size, hidden_dim,
            name="target_embedding",
        )
        self.target_positions = _position_embedding_class()(
            p.target_length, name="target_positions"
        )
        block_args = dict(
            num_heads=num_heads,
            mlp_dim=intermediate_dim,
            dropout=self.dropout,
            attention_dropout=self.dropout,
            attention=self.attention,
            attention_kwargs=self.attention_kwargs,
            layer_norm_epsilon=1e-5,
            activation="relu",
            dropout_kind="hash",
        )
        self.encoder_blocks = [
            TransformerEncoderBlock(
                name=f"encoder_block_{i}", attention_name="self_attention",
                **block_args,
            )
            for i in range(num_layers)
        ]
        self.decoder_blocks = [
            TransformerDecoderBlock(name=f"decoder_block_{i}", **block_args)
            for i in range(num_layers)
        ]
        self.encoder_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, name="encoder_norm"
        )
        self.decoder_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, name="decoder_norm"
        )
        # Named: `frozen_layers` of a `.keras` file finds layers by name.
        self.embedding_dropout = HashDropout(
            self.dropout, name="embedding_dropout"
        )
        self.output_projection = keras.layers.Dense(
            p.target_vocabulary_size, name="output_projection"
        )
        self._build_layers()

    def _build_layers(self):
        p, d = self.preprocessor, self.hidden_dim
        self.source_embedding.build((None, p.source_length))
        self.source_positions.build((None, p.source_length, d))
        self.target_embedding.build((None, p.target_length))
        self.target_positions.build((None, p.target_length, d))
        for block in self.encoder_blocks + self.decoder_blocks:
            block.build((None, None, d))  # decoder: memory of the same width
        self.encoder_norm.build((None, None, d))
        self.decoder_norm.build((None, None, d))
        self.output_projection.build((None, None, d))
        self.built = True

    @property
    def max_decode_length(self):
        return self.preprocessor.target_length

    def _check_length(self, ids, limit, argument):
        length = ids.shape[1]
        if length is not None and length > limit:
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, "
                f"expected at most {limit} positions (the preprocessor's "
                f"length). Received: {argument}.shape={tuple(ids.shape)}"
            )

    # Hooks -------------------------------------------------------------------

    def _embed(self, ids, side, training):
        """Token plus position embeddings of `ids` and their padding mask."""
        limit = getattr(self.preprocessor, f"{side}_length")
        self._check_length(ids, limit, f"{side}_ids")
        x = getattr(self, f"{side}_embedding")(ids)
        x = x + getattr(self, f"{side}_positions")(x)
        return self.embedding_dropout(x, training=training), ops.not_equal(ids, 0)

    def encode(self, source_ids, training=False):
        x, mask = self._embed(source_ids, "source", training)
        for block in self.encoder_blocks:
            x = block(x, mask=mask, training=training)
        return {"states": self.encoder_norm(x), "source_mask": mask}

    def decode_sequence(self, target_ids, encoded, training=False):
        x, mask = self._embed(target_ids, "target", training)
        for block in self.decoder_blocks:
            x, weights = block(
                x,
                encoded["states"],
                mask=mask,
                memory_mask=encoded["source_mask"],
                use_causal_mask=True,
                return_attention_scores=True,
                training=training,
            )
        logits = self.output_projection(self.decoder_norm(x))
        # The last layer's cross-attention, mean of its heads: (B, T, S).
        return logits, ops.mean(weights, axis=1)

    @property
    def supports_cache(self):
        return all(block.supports_cache for block in self.decoder_blocks)

    def prepare_decoding(self, encoded):
        if not self.supports_cache:
            return encoded
        keys, values = [], []
        for block in self.decoder_blocks:
            k, v = block.cross_keys_values(encoded["states"])
            keys.append(k)
            values.append(v)
        return dict(encoded, cross_keys=keys, cross_values=values)

    def initial_cache(self, encoded, max_length):
        states = encoded["states"]
        return [
            block.empty_cache(ops.shape(states)[0], max_length, states.dtype)
            for block in self.decoder_blocks
        ]

    def decode_step(self, tokens, index, cache, encoded):
        x = self.target_embedding(tokens[:, None])  # (B, 1, dim)
        x = x + self.target_positions(
            x, start_index=ops.cast(index, index_dtype())  # JAX's x64 too
        )
        new_cache = []
        for i, block in enumerate(self.decoder_blocks):
            x, block_cache, weights = block.step(
                x,
                index,
                cache[i],
                encoded["cross_keys"][i],
                encoded["cross_values"][i],
                encoded["source_mask"],
            )
            new_cache.append(block_cache)
        logits = self.output_projection(self.decoder_norm(x))[:, 0]
        return logits, new_cache, ops.mean(weights, axis=1)[:, 0]


_TINY = {
    "num_layers": 2,
    "hidden_dim": 64,
    "num_heads": 4,
    "intermediate_dim": 128,
    "dropout": 0.0,
}
presets.register_preset(
    "transformer_tiny",
    "TransformerTranslator",
    _TINY,
    description="Pre-norm Transformer, 2 + 2 blocks of width 64, for the "
    "date task (configuration only).",
    alias="tiny",
)
presets.register_preset(
    "transformer_dates",
    "TransformerTranslator",
    _TINY,
    weights="transformer_dates.weights.h5",
    input_shape=DATE_TASK_INPUT_SHAPE,
    description="transformer_tiny trained on 50,000 generated dates "
    "(`training.TRANSLATION_RECIPES`): writes the ISO date of a date in "
    "words; the date task's preprocessor.",
)
presets.register_preset(
    "transformer_small",
    "TransformerTranslator",
    {
        "num_layers": 3,
        "hidden_dim": 256,
        "num_heads": 8,
        "intermediate_dim": 1024,
        "dropout": 0.1,
    },
    description="Pre-norm Transformer, 3 + 3 blocks of width 256, for "
    "Multi30k with word pieces (configuration only).",
    alias="small",
)
