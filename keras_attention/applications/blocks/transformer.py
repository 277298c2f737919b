"""Transformer encoder and decoder blocks with attention chosen by name."""

import keras
from keras import ops
from keras.src.backend import get_keras_mask

from keras_attention._validation import check_bool
from keras_attention import _validation as base
from keras_attention import registry
from keras_attention._config import ArgumentConfig
from keras_attention.applications.blocks.attention_call import accepted_call_arguments
from keras_attention.applications.blocks.attention_call import build_attention
from keras_attention.applications.blocks.attention_call import call_attention
from keras_attention.applications.blocks.attention_call import call_self_attention
from keras_attention.layers.dropout import HashDropout

PACKAGE = "keras_attention"
DROPOUT_KINDS = ("keras", "hash")


@keras.saving.register_keras_serializable(package="keras_attention")
def gelu(x):
    """Exact GELU, `x * Phi(x)`: on TensorFlow written with `erf`, on the
    other backends keras's `gelu(x, approximate=False)`.

    The two are equal within float32 rounding. TensorFlow's own GELU uses
    `erfc`, which ONNX lacks, so there the `erf` form keeps
    `model.export(format="onnx")` working; JAX lowers `erf` to a StableHLO
    composite that TensorFlow cannot load, so there keras's (`erfc`) keeps
    `model.export(format="tf_saved_model")` servable. The blocks use it
    for `activation="gelu"`.
    """
    if keras.backend.backend() != "tensorflow":
        return keras.activations.gelu(x, approximate=False)
    return 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))


def check_dropout_kind(value):
    if value not in DROPOUT_KINDS:
        raise base.invalid("dropout_kind", f"one of {DROPOUT_KINDS}", value)
    return value


class _TransformerBlock(ArgumentConfig, keras.layers.Layer):
    """What both Transformer blocks share: arguments, norms, MLP, dropout."""

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout=0.0,
        attention_dropout=0.0,
        attention="multi_head",
        attention_kwargs=None,
        layer_norm_epsilon=1e-6,
        norm_first=True,
        activation="gelu",
        dropout_kind="keras",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = base.check_positive_int("num_heads", num_heads)
        self.mlp_dim = base.check_positive_int("mlp_dim", mlp_dim)
        self.dropout = base.check_rate("dropout", dropout)
        self.attention_dropout = base.check_rate(
            "attention_dropout", attention_dropout
        )
        self.attention = registry.check_name(
            attention, kinds=self._attention_kinds
        )
        self.attention_kwargs = dict(attention_kwargs or {})
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm_first = check_bool("norm_first", norm_first)
        self.activation = activation
        self.dropout_kind = check_dropout_kind(dropout_kind)
        self.supports_masking = True

    _attention_kinds = ("tokens",)

    def _check_heads(self, channels):
        if channels % self.num_heads and "key_dim" not in self.attention_kwargs:
            raise ValueError(
                "Received an invalid value for argument `num_heads`, expected "
                f"a divisor of the token size {channels}. Received: "
                f"num_heads={self.num_heads}"
            )

    def _make_attention(self, name, channels, **offered):
        layer = registry.build(
            self.attention,
            {
                "num_heads": self.num_heads,
                "key_dim": channels // self.num_heads,
                "units": channels,  # the additive score's hidden size
                "dropout": self.attention_dropout,
                **offered,
            },
            self.attention_kwargs,
            name=name,
            dtype=self.dtype_policy,
        )
        return layer, accepted_call_arguments(layer)

    def _norm(self, name, shape):
        norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name=name, dtype=self.dtype_policy
        )
        norm.build(shape)
        return norm

    def _build_mlp(self, input_shape):
        channels = input_shape[-1]
        self.mlp_norm = self._norm("mlp_norm", input_shape)
        self.mlp_hidden = keras.layers.Dense(
            self.mlp_dim,
            activation=gelu if self.activation == "gelu" else self.activation,
            name="mlp_hidden",
            dtype=self.dtype_policy,
        )
        self.mlp_hidden.build(input_shape)
        self.mlp_output = keras.layers.Dense(
            channels, name="mlp_output", dtype=self.dtype_policy
        )
        self.mlp_output.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        if self.dropout_kind == "hash":
            self.dropout_layer = HashDropout(self.dropout, dtype=self.dtype_policy)
        else:
            self.dropout_layer = keras.layers.Dropout(
                self.dropout, dtype=self.dtype_policy
            )

    def _residual(self, x, norm, training, branch, *args):
        """Pre-norm `x + f(norm(x))` or post-norm `norm(x + f(x))`, with
        `f(y) = branch(y, *args, training=training)`.

        `branch` returns `(output, scores)`; so does this.
        """
        y = norm(x) if self.norm_first else x
        h, scores = branch(y, *args, training=training)
        x = x + self.dropout_layer(h, training=training)
        return (x if self.norm_first else norm(x)), scores

    def _mlp(self, x, training):
        h = self.dropout_layer(self.mlp_hidden(x), training=training)
        return self.mlp_output(h), None

    def _mlp_residual(self, x, training):
        x, _ = self._residual(x, self.mlp_norm, training, self._mlp)
        return x

    def _outputs(self, x, scores, return_scores, training):
        """The MLP branch on `x`; `(x, scores)` when the scores are asked."""
        x = self._mlp_residual(x, training)
        return (x, scores) if return_scores else x

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(input_shape)

    def compute_mask(self, inputs, mask=None):
        # The tokens keep the Keras mask they came with (a text model's
        # padding); a mask only passed as an argument (the translator's)
        # stays off the outputs, which would carry it into layers that
        # cannot take one (the projections of a cross-attention's values).
        # keras's getter: a JAX tracer takes no attribute, keras keeps its
        # mask aside (`inputs._keras_mask` was None under `jit`, so
        # `predict` lost the padding mask after the first block).
        if get_keras_mask(inputs) is None:
            return None
        return mask



@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerEncoderBlock(_TransformerBlock):
    """Transformer encoder block with attention chosen by name.

    Pre-norm (`norm_first=True`, ViT):
    `x = x + Dropout(Attention(LayerNorm(x)))`, then
    `x = x + Dropout(MLP(LayerNorm(x)))` with `MLP = Dense(mlp_dim,
    activation), Dropout, Dense(C)` (Vaswani et al., 2017; Dosovitskiy et
    al., 2021). Post-norm (DETR) puts each LayerNorm after its addition.

    The attention layer gets the tokens `(B, N, C)`, or the grid
    `(B, h, w, C)` for a layer of input kind `"grid"` (then `grid_shape`
    must be given and `N = h * w`). It is offered `num_heads`, `key_dim`
    (`C // num_heads`), `dropout` (`attention_dropout`), `window_size` and
    `shift_size`, updated with `attention_kwargs`.

    Args:
        num_heads: attention heads `H` (passed if the layer takes it).
        mlp_dim: hidden size of the MLP.
        dropout: dropout rate after the attention and in the MLP.
        attention_dropout: dropout rate on the attention weights.
        attention: a registered `"tokens"` or `"grid"` attention name.
        attention_kwargs: extra constructor arguments of the attention layer.
        grid_shape: `(h, w)` of the patch grid, for grid layers.
        window_size, shift_size: offered to layers that take them.
        layer_norm_epsilon: epsilon of both layer normalizations.
        norm_first: pre-norm (`True`) or post-norm (`False`).
        activation: activation of the MLP's hidden layer.
        dropout_kind: `"keras"` or `"hash"` (see the module).
        attention_name: the name of the attention sublayer (`"attention"`;
            the translator and DETR keep their `"self_attention"`).

    Call arguments:
        tokens: `(B, N, C)`.
        mask: optional boolean `(B, N)` padding mask (Keras masks too).
        position: optional `(B or 1, N, C)` added to the queries and keys
            (DETR's positions), not to the values.
        return_attention_scores: also return the layer's scores (`None` for
            a layer that cannot return them).
        training: whether dropout is active.
        cache, cache_update_index: decode against the attention layer's
            key/value cache (`MultiHeadAttention`'s `cache=` convention,
            `(B, 2, S_max, K, D)`; the causal language model's decoder).

    Returns:
        `(B, N, C)`, and the scores if `return_attention_scores=True`;
        `(output, cache)` for a cached call.
    """

    _attention_kinds = ("tokens", "grid")

    def __init__(
        self,
        num_heads,
        mlp_dim,
        grid_shape=None,
        window_size=None,
        shift_size=0,
        attention_name="attention",
        **kwargs,
    ):
        super().__init__(num_heads, mlp_dim, **kwargs)
        self.grid_shape = (
            None if grid_shape is None else base.check_pair("grid_shape", grid_shape)
        )
        self.window_size = base.check_positive_int(
            "window_size", window_size, allow_none=True
        )
        self.shift_size = shift_size
        self.attention_name = attention_name
        self.uses_grid = registry.input_kind(self.attention) == "grid"
        if self.uses_grid and self.grid_shape is None:
            raise ValueError(
                f"The attention layer {self.attention!r} takes a grid "
                "(B, h, w, C); pass `grid_shape=(h, w)`. Received: "
                "grid_shape=None"
            )

    def build(self, input_shape):
        channels = input_shape[-1]
        if self.uses_grid:
            h, w = self.grid_shape
            if input_shape[1] is not None and input_shape[1] != h * w:
                raise ValueError(
                    "Received an invalid value for argument `tokens`, "
                    f"expected {h * w} tokens (the grid_shape={self.grid_shape}"
                    f" of the {self.attention!r} layer; no class token). "
                    f"Received: tokens.shape={tuple(input_shape)}"
                )
            attention_shape = (input_shape[0], h, w, channels)
        else:
            attention_shape = tuple(input_shape)
        self._check_heads(channels)
        offered = {"shift_size": self.shift_size}
        if self.uses_grid:
            # The token grid is channels-last, whatever
            # `keras.config.image_data_format()` says (as the residual
            # blocks' maps): a channels-first default read (w, C) as the map.
            offered["data_format"] = "channels_last"
        if self.window_size is not None:
            offered["window_size"] = self.window_size
        self.attention_layer, self._accepted = self._make_attention(
            self.attention_name, channels, **offered
        )
        build_attention(self.attention_layer, attention_shape)
        self.attention_norm = self._norm("attention_norm", input_shape)
        self._build_mlp(input_shape)
        self.built = True

    def _attend(self, x, mask, position, return_scores, training):
        layer, accepted = self.attention_layer, self._accepted
        options = dict(return_attention_scores=return_scores, training=training)
        if self.uses_grid:
            channels = x.shape[-1]
            grid = ops.reshape(x, (-1,) + self.grid_shape + (channels,))
            h, scores = call_attention(layer, accepted, grid, **options)
            return ops.reshape(h, (-1, ops.shape(x)[1], channels)), scores
        return call_self_attention(layer, accepted, x, mask, position, **options)

    def call(
        self,
        tokens,
        mask=None,
        position=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
    ):
        if cache is not None:
            return self._call_cached(tokens, cache, cache_update_index, training)
        x, scores = self._residual(
            tokens, self.attention_norm, training,
            self._attend, mask, position, return_attention_scores,
        )
        return self._outputs(x, scores, return_attention_scores, training)

    def _call_cached(self, tokens, cache, cache_update_index, training):
        """Decoding against the attention layer's public key/value cache."""
        if not registry.call_accepts(self.attention_layer, "cache"):
            raise ValueError(
                f"The attention layer {self.attention!r} takes no key/value "
                "`cache`; use `multi_head`. Received: cache.shape="
                f"{tuple(cache.shape)}"
            )
        x, cache = self._residual(
            tokens, self.attention_norm, training,
            lambda y, training: self.attention_layer(
                y, cache=cache, cache_update_index=cache_update_index,
                training=training,
            ),
        )
        return self._mlp_residual(x, training), cache



@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerDecoderBlock(_TransformerBlock):
    """Transformer decoder block: self-attention, cross-attention, MLP.

    Each of the three is a residual branch, pre-norm or post-norm as in
    `TransformerEncoderBlock`. The self-attention is causal with
    `use_causal_mask=True` (text); DETR adds `position` to the queries and
    keys of both attentions and `memory_position` to the cross-attention's
    keys. Both attention layers are built by name (`"tokens"` layers taking
    `value`; `key` too when positions are given).

    For step-by-step decoding, `step` runs one new position against the
    self-attention's own key/value cache `(B, 2, L, K, D)` (its `cache=`
    argument, keras-hub's convention) and cross-attention keys and values
    made once (`supports_cache` says whether the layers allow it).

    Args:
        num_heads, mlp_dim, dropout, attention_dropout, attention,
        attention_kwargs, layer_norm_epsilon, norm_first, activation,
        dropout_kind: as for `TransformerEncoderBlock` (one attention name
            for both attentions).

    Call arguments:
        tokens: `(B, T, C)`.
        memory: the encoder's output `(B, S, C)`.
        mask: optional boolean `(B, T)` padding mask of `tokens`.
        memory_mask: optional boolean `(B, S)` padding mask of `memory`.
        position: optional `(B or 1, T, C)` added to the queries (and the
            self-attention's keys).
        memory_position: optional `(B or 1, S, C)` added to the
            cross-attention's keys.
        use_causal_mask: position `t` sees positions `<= t` only.
        return_attention_scores: also return the cross-attention's weights.
        training: whether dropout is active.

    Returns:
        `(B, T, C)`, and the cross-attention's weights if asked.
    """

    def compute_output_shape(self, tokens_shape, memory_shape=None, *args, **kwargs):
        # Named as `build` records its shapes: keras's `summary` of a
        # subclassed model (DETR) passes them by these names.
        return tuple(tokens_shape)

    def build(self, tokens_shape, memory_shape=None):
        tokens_shape = tuple(tokens_shape)
        memory_shape = tokens_shape if memory_shape is None else tuple(memory_shape)
        channels = tokens_shape[-1]
        self._check_heads(channels)
        self.self_attention_norm = self._norm("self_attention_norm", tokens_shape)
        self.self_attention, self._self_accepted = self._make_attention(
            "self_attention", channels
        )
        build_attention(self.self_attention, tokens_shape, tokens_shape, tokens_shape)
        self.cross_attention_norm = self._norm("cross_attention_norm", tokens_shape)
        self.cross_attention, self._cross_accepted = self._make_attention(
            "cross_attention", channels
        )
        build_attention(self.cross_attention, tokens_shape, memory_shape, memory_shape)
        self._build_mlp(tokens_shape)
        self.built = True

    def _self_attend(self, x, mask, position, use_causal_mask, training):
        layer, accepted = self.self_attention, self._self_accepted
        options = dict(use_causal_mask=use_causal_mask, training=training)
        return call_self_attention(layer, accepted, x, mask, position, **options)

    def _cross_attend(
        self, x, memory, mask, memory_mask, position, memory_position,
        return_scores, training,
    ):
        return call_attention(
            self.cross_attention,
            self._cross_accepted,
            x if position is None else x + position,
            value=memory,
            key=None if memory_position is None else memory + memory_position,
            query_mask=mask,
            value_mask=memory_mask,
            return_attention_scores=return_scores,
            training=training,
        )

    def call(
        self,
        tokens,
        memory,
        mask=None,
        memory_mask=None,
        position=None,
        memory_position=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
    ):
        x, _ = self._residual(
            tokens, self.self_attention_norm, training,
            self._self_attend, mask, position, use_causal_mask,
        )
        x, weights = self._residual(
            x, self.cross_attention_norm, training, self._cross_attend,
            memory, mask, memory_mask, position, memory_position,
            return_attention_scores,
        )
        return self._outputs(x, weights, return_attention_scores, training)

    def compute_mask(self, inputs, mask=None):
        # The outputs are the decoder's own positions; a caller that wants
        # the padding mask on them (a loss) passes it itself.
        return None

    # Key/value cache -------------------------------------------------------

    @property
    def supports_cache(self):
        """Whether `step` can run: pre-norm, a self-attention that takes
        keras-hub's `cache=` / `cache_update_index=` (keys and values of one
        size), and a cross-attention with `MultiHeadAttention`'s hooks."""
        a, c = self.self_attention, self.cross_attention
        return (
            self.norm_first
            and registry.call_accepts(a, "cache")
            and registry.call_accepts(a, "cache_update_index")
            and getattr(a, "head_value_dim", None) == getattr(a, "key_dim", 0)
            and all(hasattr(c, h) for h in ("project", "attend", "project_output"))
        )

    def empty_cache(self, batch, length, dtype):
        """A zero self-attention cache `(B, 2, L, K, D)`, keys then values
        (keras-hub's `CachedMultiHeadAttention` layout)."""
        a = self.self_attention
        return ops.zeros((batch, 2, length, a.kv_heads, a.key_dim), dtype)

    def cross_keys_values(self, memory):
        """The cross-attention keys and values `(B, S, K, D)`, made once."""
        c = self.cross_attention
        return (
            c.project(memory, c.key_kernel, c.key_bias),
            c.project(memory, c.value_kernel, c.value_bias),
        )

    def step(self, x, index, cache, cross_key, cross_value, memory_mask):
        """One new position `x` (B, 1, C) against the cached positions.

        The self-attention is the layer's own cached call
        (`cache=cache, cache_update_index=index, use_causal_mask=True`): it
        writes the key and value of position `index` into `cache`
        `(B, 2, L, K, D)` and attends to positions `0..index`, with the
        same projections, positions and core as `call`. The
        cross-attention attends to keys and values made once from the
        encoder output (`cross_keys_values`) through the layer's hooks,
        which also give its weights.

        Returns:
            `(x, cache, weights)`, the cross-attention's weights
            `(B, H, 1, S)`.
        """
        h, cache = self.self_attention(
            self.self_attention_norm(x),
            cache=cache,
            cache_update_index=index,
            use_causal_mask=True,
            training=False,
        )
        x = x + h
        c = self.cross_attention
        query = c.project(self.cross_attention_norm(x), c.query_kernel, c.query_bias)
        heads, weights = c.attend(
            query, cross_key, cross_value, memory_mask, True, False
        )
        x = x + c.project_output(heads)
        x = x + self._mlp(self.mlp_norm(x), training=False)[0]
        return x, cache, weights
