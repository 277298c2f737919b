"""Transformer translation (Vaswani et al.) with a key/value cache."""

import keras
from keras import ops

from keras_attention import registry
from keras_attention.applications import presets
from keras_attention.applications.translation import Translator
from keras_attention.layers.dropout import HashDropout
from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention._validation import invalid


class _Block(keras.layers.Layer):
    """Shared parts of the pre-norm blocks: attention factory and the MLP."""

    def __init__(
        self,
        hidden_dim,
        num_heads,
        intermediate_dim,
        dropout,
        attention="multi_head",
        attention_kwargs=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention = attention
        self.attention_kwargs = dict(attention_kwargs or {})
        self.dense_in = keras.layers.Dense(
            intermediate_dim, activation="relu", name="dense_in"
        )
        self.dense_out = keras.layers.Dense(hidden_dim, name="dense_out")
        # Counter-based dropout: under XLA on CPU the backend's random
        # generator took a quarter of a Multi30k training step.
        self.dropout_layer = HashDropout(dropout)

    def _attention(self, name):
        return registry.build(
            self.attention,
            {
                "num_heads": self.num_heads,
                "key_dim": self.hidden_dim // self.num_heads,
                "dropout": self.dropout,
            },
            self.attention_kwargs,
            name=name,
        )

    def _norm(self, name):
        return keras.layers.LayerNormalization(epsilon=1e-5, name=name)

    def feed_forward(self, x, training=False):
        h = self.dropout_layer(self.dense_in(x), training=training)
        return self.dense_out(h)

    def _build_feed_forward(self, shape):
        self.dense_in.build(shape)
        self.dense_out.build(shape[:-1] + (self.intermediate_dim,))


class _EncoderBlock(_Block):
    """`x + SelfAttention(LN(x))`, then `x + MLP(LN(x))`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm_attention = self._norm("norm_attention")
        self.self_attention = self._attention("self_attention")
        self.norm_feed_forward = self._norm("norm_feed_forward")

    def build(self, shape):
        self.norm_attention.build(shape)
        self.self_attention.build(shape)
        self.norm_feed_forward.build(shape)
        self._build_feed_forward(shape)
        self.built = True

    def call(self, x, mask, training=False):
        h = self.self_attention(
            self.norm_attention(x), query_mask=mask, training=training
        )
        x = x + self.dropout_layer(h, training=training)
        h = self.feed_forward(self.norm_feed_forward(x), training=training)
        return x + self.dropout_layer(h, training=training)


class _DecoderBlock(_Block):
    """Causal self-attention, cross-attention and MLP, each pre-norm."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm_self = self._norm("norm_self")
        self.self_attention = self._attention("self_attention")
        self.norm_cross = self._norm("norm_cross")
        self.cross_attention = self._attention("cross_attention")
        self.norm_feed_forward = self._norm("norm_feed_forward")

    def build(self, shape):
        self.norm_self.build(shape)
        self.self_attention.build(shape)
        self.norm_cross.build(shape)
        self.cross_attention.build(shape, shape)
        self.norm_feed_forward.build(shape)
        self._build_feed_forward(shape)
        self.built = True

    def call(self, x, encoded, target_mask, source_mask, training=False):
        h = self.self_attention(
            self.norm_self(x),
            query_mask=target_mask,
            use_causal_mask=True,
            training=training,
        )
        x = x + self.dropout_layer(h, training=training)
        h, weights = self.cross_attention(
            self.norm_cross(x),
            value=encoded,
            query_mask=target_mask,
            value_mask=source_mask,
            return_attention_scores=True,
            training=training,
        )
        x = x + self.dropout_layer(h, training=training)
        h = self.feed_forward(self.norm_feed_forward(x), training=training)
        return x + self.dropout_layer(h, training=training), weights

    @property
    def supports_cache(self):
        """Whether both attention layers have the hooks `step` uses."""
        return all(
            all(hasattr(a, hook) for hook in ("project", "attend", "project_output"))
            for a in (self.self_attention, self.cross_attention)
        )

    def cross_keys_values(self, encoded):
        """The cross-attention keys and values `(B, S, K, D)`, made once."""
        a = self.cross_attention
        return (
            a.project(encoded, a.key_kernel, a.key_bias),
            a.project(encoded, a.value_kernel, a.value_bias),
        )

    def step(self, x, index, key_cache, value_cache, cross_key, cross_value, source_mask):
        """One new position `x` (B, 1, dim) against the cached positions.

        The self-attention's key and value of position `index` are written
        into `key_cache` / `value_cache` `(B, L, K, D)`; the query attends to
        positions `0..index` only. The same projections, core and output
        projection as `call` (the registry layer's hooks), so the result
        equals the full causal pass at that position.
        """
        a = self.self_attention
        h = self.norm_self(x)
        query = a.project(h, a.query_kernel, a.query_bias)  # (B, 1, H, D)
        key = a.project(h, a.key_kernel, a.key_bias)  # (B, 1, K, D)
        value = a.project(h, a.value_kernel, a.value_bias)
        length = key_cache.shape[1]
        here = ops.reshape(ops.equal(ops.arange(length), index), (1, length, 1, 1))
        key_cache = ops.where(here, key, key_cache)
        value_cache = ops.where(here, value, value_cache)
        visible = ops.less_equal(ops.arange(length), index)[None, None, :]
        heads = a.attend(query, key_cache, value_cache, visible, False, False)
        x = x + a.project_output(heads)
        c = self.cross_attention
        query = c.project(self.norm_cross(x), c.query_kernel, c.query_bias)
        heads, weights = c.attend(
            query, cross_key, cross_value, source_mask, True, False
        )
        x = x + c.project_output(heads)
        x = x + self.feed_forward(self.norm_feed_forward(x))
        return x, key_cache, value_cache, weights  # weights (B, H, 1, S)


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

    Decoding keeps a key/value cache per decoder layer `(B, L, K, D)`:
    generating token `t` projects only that token and attends to the cached
    keys and values of tokens `0..t`, and the cross-attention keys and
    values of the source are computed once per sentence.

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
            `key_dim` and `dropout`. Layers without the key/value-cache
            hooks of `MultiHeadAttention` decode without the cache.
        attention_kwargs: extra constructor arguments of that layer.

    Call arguments:
        inputs: `{"source_ids": (B, S), "target_ids": (B, T)}`.
        training: whether dropout is active.

    Returns:
        Next-token logits `(B, T, V)`.

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
        p = self.preprocessor
        self.source_embedding = keras.layers.Embedding(
            p.source_vocabulary_size, hidden_dim,
            name="source_embedding",
        )
        self.source_positions = keras_hub.layers.PositionEmbedding(
            p.source_length, name="source_positions"
        )
        self.target_embedding = keras.layers.Embedding(
            p.target_vocabulary_size, hidden_dim,
            name="target_embedding",
        )
        self.target_positions = keras_hub.layers.PositionEmbedding(
            p.target_length, name="target_positions"
        )
        block_args = (
            hidden_dim,
            num_heads,
            intermediate_dim,
            self.dropout,
            self.attention,
            self.attention_kwargs,
        )
        self.encoder_blocks = [
            _EncoderBlock(*block_args, name=f"encoder_block_{i}")
            for i in range(num_layers)
        ]
        self.decoder_blocks = [
            _DecoderBlock(*block_args, name=f"decoder_block_{i}")
            for i in range(num_layers)
        ]
        self.encoder_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, name="encoder_norm"
        )
        self.decoder_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, name="decoder_norm"
        )
        self.embedding_dropout = HashDropout(self.dropout)
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
            block.build((None, None, d))
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

    def encode(self, source_ids, training=False):
        self._check_length(source_ids, self.preprocessor.source_length, "source_ids")
        mask = ops.not_equal(source_ids, 0)
        x = self.source_embedding(source_ids)
        x = x + self.source_positions(x)
        x = self.embedding_dropout(x, training=training)
        for block in self.encoder_blocks:
            x = block(x, mask, training=training)
        return {"states": self.encoder_norm(x), "source_mask": mask}

    def decode_sequence(self, target_ids, encoded, training=False):
        self._check_length(target_ids, self.preprocessor.target_length, "target_ids")
        mask = ops.not_equal(target_ids, 0)
        x = self.target_embedding(target_ids)
        x = x + self.target_positions(x)
        x = self.embedding_dropout(x, training=training)
        for block in self.decoder_blocks:
            x, weights = block(
                x,
                encoded["states"],
                mask,
                encoded["source_mask"],
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
        batch = ops.shape(encoded["states"])[0]
        caches = []
        for block in self.decoder_blocks:
            a = block.self_attention
            shape = (batch, max_length, a.kv_heads, a.key_dim)
            dtype = encoded["states"].dtype
            caches.append(
                [ops.zeros(shape, dtype), ops.zeros(shape[:3] + (a.head_value_dim,), dtype)]
            )
        return caches

    def decode_step(self, tokens, index, cache, encoded):
        x = self.target_embedding(tokens[:, None])  # (B, 1, dim)
        x = x + self.target_positions(x, start_index=index)
        new_cache = []
        for i, block in enumerate(self.decoder_blocks):
            x, key_cache, value_cache, weights = block.step(
                x,
                index,
                cache[i][0],
                cache[i][1],
                encoded["cross_keys"][i],
                encoded["cross_values"][i],
                encoded["source_mask"],
            )
            new_cache.append([key_cache, value_cache])
        logits = self.output_projection(self.decoder_norm(x))[:, 0]
        return logits, new_cache, ops.mean(weights, axis=1)[:, 0]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention": self.attention,
                "attention_kwargs": self.attention_kwargs,
            }
        )
        return config


presets.register_preset(
    "transformer_tiny",
    "TransformerTranslator",
    {
        "num_layers": 2,
        "hidden_dim": 64,
        "num_heads": 4,
        "intermediate_dim": 128,
        "dropout": 0.0,
    },
    description="Pre-norm Transformer, 2 + 2 blocks of width 64, for the "
    "date task (configuration only).",
    alias="tiny",
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
