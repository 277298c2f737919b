"""`MultiHeadAttention`: keras's layer, a superset of it, on the shared core.

This file holds the constructor, `build`, `call` and the attention core;
the rest is in mixins beside it:

- `_multi_head_masks.py` (`KerasMasks`): keras's mask broadcasting and checks;
- `_multi_head_cache.py` (`KVCache`): the public key/value cache for decoding;
- `_multi_head_positions.py` (`PositionEncodings`): RoPE and ALiBi;
- `_multi_head_long.py` (`LongContext`): windowed self-attention in chunks;
- `_multi_head_shapes.py` (`ShapeInference`): the shape checks,
  `compute_output_shape` and `compute_output_spec`;
- `_projections.py` (`ProjectionMixin`, via `base`): the sublayers' weight
  arguments, LoRA and quantization.
"""

import numbers
import string
from operator import attrgetter

import keras
from keras import ops
import numpy as np
# No public API sets a tensor's Keras mask; keras's own layer uses this.

from keras_attention._validation import check_bool
from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention._validation import invalid
from keras_attention import ops as attention_ops
from keras_attention.layers import base
from keras_attention.layers._multi_head_cache import KVCache
from keras_attention.layers._multi_head_long import LongContext
from keras_attention.layers._multi_head_masks import KerasMasks
from keras_attention.layers._multi_head_positions import PositionEncodings
from keras_attention.layers._multi_head_positions import check_position_arguments
from keras_attention.layers._multi_head_shapes import ShapeInference
from keras_attention.ops.dispatch import IMPLEMENTATIONS
from keras_attention.ops.masks import check_sliding_window
from keras_attention.ops.xla_cpu import projection
from keras_attention.registry import register



def _projection_equation(free_dims, bound_dims, output_dims):
    """`EinsumDense`'s equation and bias axes for a projection.

    The same letters as `keras.layers.MultiHeadAttention`'s, so kernels have
    its shapes (e.g. `"abc,cde->abde"`, bias `"de"`, for `(B, T, dim)` to
    `(B, T, heads, size)`).
    """
    letters = string.ascii_lowercase
    free = letters[:free_dims]
    bound = letters[free_dims : free_dims + bound_dims]
    out = letters[free_dims + bound_dims : free_dims + bound_dims + output_dims]
    return f"{free}{bound},{bound}{out}->{free}{out}", out


@register("multi_head", input_kind="tokens")
class MultiHeadAttention(
    base.ProjectionMixin,
    KerasMasks,
    KVCache,
    LongContext,
    PositionEncodings,
    ShapeInference,
    keras.layers.MultiHeadAttention,
):
    """Multi-head attention (Vaswani et al., 2017): a superset of keras's.

    The query, key and value are projected to `num_heads` heads of size
    `key_dim` (values: `value_dim`), each head computes
    `softmax(Q K^T / sqrt(key_dim)) V`, and the heads are concatenated and
    projected back to the query's feature size (or `output_shape`).

    A drop-in replacement for `keras.layers.MultiHeadAttention`: the same
    constructor and call arguments with keras's meaning (`attention_axes`,
    `sliding_window`, `use_gate`, `flash_attention`, keras's mask
    broadcasting), the same `EinsumDense` sublayers (`_query_dense`,
    `_key_dense`, `_value_dense`, `_output_dense`, `_gate_dense`) with the
    same weight shapes, order and paths, so `.weights.h5` files and
    `get_weights()` interchange both ways, and LoRA (`enable_lora`),
    quantization (`model.quantize("int8")`) and dtype-policy maps work as
    they do on keras's layer. keras's own test file for its layer passes
    against this class (`tests/test_keras_mha_suite.py`).

    On top of keras's layer:

    - called on **one** tensor it is self-attention, so it stacks in a
      `keras.Sequential`; `[query, value(, key)]` lists work too;
    - `use_causal_mask` can be set once in the constructor;
    - the Keras masks of the tensors it is given stay on them (keras's layer
      clears them, and another layer reading the same tensor afterwards
      attends to its padding);
    - `num_key_value_heads < num_heads` shares key and value heads between
      groups of query heads (grouped-query attention, Ainslie et al., 2023);
      the key and value kernels are then `(dim, K, D)`;
    - the attention runs on keras_attention's core
      (`keras_attention.ops.dot_product_attention`): long sequences take a
      memory-efficient path that never holds the `T x S` scores, and
      `implementation` picks a path;
    - a query that sees no key (all its keys masked, or a padded query)
      attends to nothing: its heads and attention weights are zero. keras's
      layer (Keras 3.15) gives it zero weights when asked for its scores,
      and an output row from its fused path otherwise; the outputs of
      queries that see at least one key are the same in both.

    The attention weights are returned before dropout (they sum to one over
    the keys), as keras returns them.

    Args:
        num_heads: number of query heads `H`.
        key_dim: size `D` of each query and key head.
        value_dim: size of each value head; defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_shape: feature shape (int or tuple) of the output; defaults
            to the query's last dimension.
        attention_axes: the axes attention runs over, for inputs of rank
            above 3 (e.g. `(1, 2)` for 2-D attention over an image's
            `H x W`); `None` attends over every axis but the batch and the
            features.
        sliding_window: if set, query `t` sees only keys `s` with
            `|t - s| < sliding_window` (combine with `use_causal_mask` for a
            causal window).
        flash_attention: `True` runs the backend's fused kernel
            (`keras.ops.dot_product_attention`; no dropout, no scores) and
            tells it to take flash attention, raising where the backend or
            inputs have none, as keras's layer does; `None` follows
            `keras.config.is_flash_attention_enabled()`.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: as for `keras.layers.EinsumDense`.
        use_gate: gate the heads with `sigmoid(query W_g)` before the output
            projection (Qiu et al., 2025).
        seed: seed of the dropout.
        num_key_value_heads: number of key/value heads `K`, dividing
            `num_heads`; defaults to `num_heads` (plain multi-head).
        use_causal_mask: always apply a causal mask (for `Sequential` use);
            a call's `use_causal_mask` overrides it.
        implementation: `"auto"`, `"dense"`, `"blocked"`, `"chunked"` or
            `"fused"` (see `keras_attention.ops.dot_product_attention`). With `"auto"`,
            windowed self-attention from 8,192 tokens runs the whole layer
            in chunks on TensorFlow and JAX (`layers/_multi_head_long.py`:
            about half the memory; on torch the general path runs);
            `"blocked"` keeps its projections around the blocked core.
            `"blocked"` needs sequence lengths known when traced (on
            TensorFlow `"chunked"` and `"auto"` take unknown ones);
            `"blocked"`, `"chunked"` and `"fused"` return no attention
            scores.
        position_encoding: `None`, `"rope"` (rotary embeddings of the
            query and key heads, Su et al., 2021) or `"alibi"` (a linear
            distance penalty per head, Press et al., 2022, added block by
            block on the memory-efficient path). Inputs `(B, T, dim)` only.
        rope_max_wavelength: RoPE's longest wavelength ("theta").
        rope_scaling_factor: RoPE positions are divided by it (linear
            scaling of a trained context).
        alibi_bias_max: ALiBi's largest slope exponent (8 in the paper).

    Call arguments:
        query: `(B, T, dim)` (or `(B, ..., dim)` with `attention_axes`), or
            a list `[query, value]` / `[query, value, key]`.
        value: `(B, S, dim)`; defaults to `query` (self-attention).
        key: `(B, S, dim)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional boolean `(B, T)` /
            `(B, S)` padding masks; Keras masks are used when not given.
        attention_mask: optional boolean mask, `True` where a query may
            attend to a key: `(B, T, S)`, or anything keras's layer
            broadcasts: `(T, S)`, `(1, T, S)`, `(B, T, 1)`, `(B, 1, S)`,
            `(B, H, T, S)`, `(1, 1, T, S)`...
        return_attention_scores: also return the attention weights,
            `(B, H, T, S)` (with `attention_axes`, keras's layout
            `(B, <other axes>, H, <query axes>, <key axes>)`).
        training: whether dropout is active.
        use_causal_mask: apply a causal mask in this call; `None` (the
            default) uses the constructor's.
        cache: optional key/value cache `(B, 2, S_max, K, D)` (keras-hub's
            `CachedMultiHeadAttention` convention; value_dim == key_dim):
            the call then returns `(output, cache)`. A cache of exactly
            `sliding_window` entries is a ring (memory stays flat however
            long the decoding). Keras masks are not read in a cached call,
            and `query_mask`, `value_mask`, `key_mask` are refused;
            `attention_mask` `(B, T, S_max)` is read (a ring's
            `(B, T, W + T)`: its `W` slots, then the `T` new tokens).
        cache_update_index: where the new tokens' keys and values go (an int
            or a scalar tensor); the queries sit at positions
            `cache_update_index + arange(T)`. `None` reads the cache as it
            is. `index + T <= S_max` (a ring takes any index) is checked
            where the index's value is known (eager calls); inside
            `tf.function` or `jax.jit` it cannot be: a write past the end
            lands on the last slots, and the outputs of that call are NaN
            (no error can be raised there): size the cache for the whole
            decoding.

    Returns:
        `(B, T, *output_shape)`, and the attention weights if
        `return_attention_scores=True`.

    Raises:
        ValueError: naming the argument: `dropout` outside `[0, 1)`;
            `output_shape` not positive integers; `num_key_value_heads`
            not a divisor of `num_heads`; `implementation`,
            `position_encoding` (or its wavelength, scaling and ALiBi
            settings) or `sliding_window` not one of theirs; inputs of
            rank below 3, of another width than the layer was built for,
            or `value` and `key` of other shapes; padding masks of
            another shape than their inputs' positions;
            `return_attention_scores` with flash attention; in a cached
            call (`cache=`), a
            cache of another shape or dtype than the layer's, a
            `cache_update_index` out of range or without a `cache`, or
            `query_mask`/`value_mask`/`key_mask` given by hand.

    Example:

    ```python
    model = keras.Sequential([
        keras.Input((10, 32)),
        MultiHeadAttention(num_heads=4, key_dim=8),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(2),
    ])
    model(np.zeros((3, 10, 32))).shape  # (3, 2)

    # 2-D attention over an image's rows and columns.
    images = np.random.rand(2, 6, 6, 16).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=8, attention_axes=(1, 2))
    out, scores = layer(images, return_attention_scores=True)
    out.shape, scores.shape  # (2, 6, 6, 16), (2, 2, 6, 6, 6, 6)

    layer.enable_lora(4)  # frozen kernels, trainable low-rank updates
    ```

    References:
        - Vaswani et al., Attention Is All You Need, 2017.
          https://arxiv.org/abs/1706.03762
        - Ainslie et al., GQA, 2023. https://arxiv.org/abs/2305.13245
        - Hu et al., LoRA, 2021. https://arxiv.org/abs/2106.09685
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        num_key_value_heads=None,
        use_causal_mask=False,
        implementation="auto",
        position_encoding=None,
        rope_max_wavelength=10000.0,
        rope_scaling_factor=1.0,
        alibi_bias_max=8.0,
        **kwargs,
    ):
        dropout = check_rate("dropout", dropout)
        use_bias = check_bool("use_bias", use_bias)
        use_gate = check_bool("use_gate", use_gate)
        if flash_attention is not None:
            flash_attention = check_bool("flash_attention", flash_attention)
        num_heads = check_positive_int("num_heads", num_heads)
        key_dim = check_positive_int("key_dim", key_dim)
        value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        if attention_axes is not None:
            axes = (attention_axes,) if isinstance(attention_axes, numbers.Integral) else attention_axes
            if not isinstance(axes, (tuple, list)) or not axes or any(
                isinstance(a, (bool, np.bool_)) or not isinstance(a, numbers.Integral)
                for a in axes
            ):
                raise invalid(
                    "attention_axes", "an int, a tuple of ints or None",
                    attention_axes,
                )
        if position_encoding == "rope" and key_dim % 2:
            raise invalid(
                "key_dim", "an even head size for rotary embeddings", key_dim
            )
        check_position_arguments(
            position_encoding, rope_max_wavelength, rope_scaling_factor,
            alibi_bias_max,
        )
        if output_shape is not None:
            dims = (
                (output_shape,)
                if isinstance(output_shape, int)
                else output_shape
            )
            if not isinstance(dims, (tuple, list)) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0
                for d in dims
            ) or not dims:
                raise ValueError(
                    f"Invalid `output_shape`: received an invalid value for "
                    "argument `output_shape`, expected a positive integer or "
                    f"a tuple of them. Received: output_shape={output_shape!r}"
                )
        num_key_value_heads = check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if (
            num_key_value_heads
            and isinstance(num_heads, int)
            and num_heads % num_key_value_heads
        ):
            raise invalid(
                "num_key_value_heads",
                f"a divisor of num_heads={num_heads}",
                num_key_value_heads,
            )
        if implementation not in IMPLEMENTATIONS:
            raise invalid(
                "implementation", f"one of {IMPLEMENTATIONS}", implementation
            )
        sliding_window = check_sliding_window(sliding_window)
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            attention_axes=attention_axes,
            sliding_window=sliding_window,
            flash_attention=flash_attention,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            use_gate=use_gate,
            seed=seed,
            **kwargs,
        )
        self.flash_attention = flash_attention
        self.num_key_value_heads = num_key_value_heads
        self.use_causal_mask = check_bool("use_causal_mask", use_causal_mask)
        self.implementation = implementation
        self.position_encoding = position_encoding
        self.rope_max_wavelength = rope_max_wavelength
        self.rope_scaling_factor = rope_scaling_factor
        self.alibi_bias_max = alibi_bias_max

    # ----------------------------------------------------------- properties

    @property
    def kv_heads(self):
        """The number of key/value heads `K`."""
        return self.num_key_value_heads or self._num_heads

    head_value_dim = property(attrgetter("_value_dim"), doc="The value head size.")
    sliding_window = property(
        attrgetter("_sliding_window"), doc="The `sliding_window` argument."
    )
    use_gate = property(attrgetter("_use_gate"), doc="The `use_gate` argument.")

    # --------------------------------------------------------------- build

    def _projection(self, name, input_shape, heads, size, activation=None):
        free = len(input_shape) - 1
        equation, bias_axes = _projection_equation(free, 1, 2)
        dense = keras.layers.EinsumDense(
            equation,
            output_shape=[None] * (free - 1) + [heads, size],
            bias_axes=bias_axes if self._use_bias else None,
            activation=activation,
            name=name,
            **self._get_common_kwargs_for_sublayer(),
        )
        dense.build(input_shape)
        return dense

    def build(self, query_shape, value_shape=None, key_shape=None):
        query_shape, value_shape, key_shape = base.split_shapes(
            query_shape, value_shape, key_shape
        )
        self._check_shapes(query_shape, value_shape, key_shape)
        # What every later call's inputs must have (`_check_shapes`).
        self._built_feature_sizes = {
            "query": query_shape[-1], "value": value_shape[-1],
            "key": key_shape[-1],
        }
        # keras's creation order: query, key, gate, value, output.
        self._query_dense = self._projection(
            "query", query_shape, self._num_heads, self._key_dim
        )
        self._key_dense = self._projection(
            "key", key_shape, self.kv_heads, self._key_dim
        )
        if self._use_gate:
            self._gate_dense = self._projection(
                "gate", query_shape, self._num_heads, self._value_dim, "sigmoid"
            )
        self._value_dense = self._projection(
            "value", value_shape, self.kv_heads, self._value_dim
        )
        self._build_attention(len(value_shape) + 1)
        self._output_dense = self._make_output_dense(
            query_shape,
            self._get_common_kwargs_for_sublayer(),
            "attention_output",
        )
        heads_shape = list(self._query_dense.compute_output_shape(query_shape))
        heads_shape[-1] = self._value_dim
        self._output_dense.build(tuple(heads_shape))

    # ------------------------------------------------------------- the core

    def attend(
        self, query, key, value, mask, return_weights, training, is_causal=False,
        sliding_window=None, alibi_slopes=None,
    ):
        """Hook: the attention of projected heads `(B, T, H, D)`.

        `key`, `value`: `(B, S, K, D)`. `mask` has the core's meaning
        (`keras_attention.ops.dot_product_attention`): `(B, S)`,
        `(B, T, S)` or rank 4 `(B, H, T, S)`, any axis 1 to broadcast.
        `sliding_window` and `alibi_slopes` are the core's (the blocked path
        skips the key blocks outside the band). Returns `(B, T, H, Dv)`, and the weights
        `(B, H, T, S)` (before dropout) if `return_weights`.
        """
        implementation = self.implementation
        if self._flash_attention and not return_weights:
            implementation = "fused"
        seed = getattr(self._dropout_layer, "seed_generator", None)
        return attention_ops.dot_product_attention(
            query,
            key,
            value,
            attention_mask=mask,
            is_causal=is_causal,
            scale=self._inverse_sqrt_key_dim,
            dropout_rate=self._dropout,
            seed=seed,
            training=training,
            return_weights=return_weights,
            implementation=implementation,
            sliding_window=sliding_window,
            alibi_slopes=alibi_slopes,
            # keras's meaning: its layer passes `flash_attention or
            # keras.config.is_flash_attention_enabled()` to the kernel (and
            # ours an explicit `False` when that is `None`).
            flash_attention=self._flash_attention or self.flash_attention,
        )

    # ---------------------------------------------------------------- call

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=None,
        mask=None,
        cache=None,
        cache_update_index=None,
    ):
        if cache is not None or cache_update_index is not None:
            self._refuse_masks_in_cached_call(
                (query, value, key), (query_mask, value_mask, key_mask)
            )
        query, value, key, query_mask, value_mask, key_mask = (
            base.SequenceAttention.flatten_inputs(
                query, value, key, query_mask, value_mask, key_mask, mask
            )
        )
        attention_mask = base.as_mask(attention_mask)
        # The masks are in the mask arguments now; the projections take
        # none, and the caller's tensors keep theirs.
        with base.keras_masks_set_aside(query, value, key):
            return self._call_unmasked(
                query, value, key, query_mask, value_mask, key_mask,
                attention_mask, return_attention_scores, training,
                use_causal_mask, cache, cache_update_index,
            )

    def _call_unmasked(
        self, query, value, key, query_mask, value_mask, key_mask,
        attention_mask, return_attention_scores, training, use_causal_mask,
        cache, cache_update_index,
    ):
        if cache is not None or cache_update_index is not None:
            return self._call_cached(
                query,
                query if value is None else value,
                key,
                attention_mask,
                cache,
                cache_update_index,
                training,
                use_causal_mask,
                return_attention_scores,
            )
        causal = self.use_causal_mask if use_causal_mask is None else use_causal_mask
        causal = bool(causal)
        # A subclass overriding keras's `_compute_attention` (its older
        # signature) keeps the general path and gets the masks as tensors.
        own_core = (
            type(self)._compute_attention is MultiHeadAttention._compute_attention
        )
        if self._long_context_reason(
            query, value, key,
            (query_mask, value_mask, key_mask, attention_mask),
            training, return_attention_scores, own_core,
        ) is None:
            # Windowed self-attention on a long sequence: the whole layer in
            # chunks, projections included (`_multi_head_long.py`).
            return self._long_context_call(query, causal)
        value, key, value_mask, key_mask = base.self_attention_defaults(
            query, value, key, query_mask, value_mask, key_mask
        )
        # Every call: `build` checked only the first one's shapes.
        self._check_shapes(
            tuple(query.shape), tuple(value.shape), tuple(key.shape)
        )
        self._check_masks(
            query, value, query_mask, value_mask, key_mask, attention_mask
        )
        # The core applies the causal mask itself (no (T, S) tensor, and the
        # blocked path skips nothing it needs) when `own_core`.
        core_causal = causal and own_core and len(query.shape) == 3
        # Likewise the sliding window: the core's blocked path then skips
        # the key blocks outside the band.
        core_window = (
            self._sliding_window if own_core and len(query.shape) == 3 else None
        )
        attention_mask = self._compute_attention_mask(
            query,
            value,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=causal and not core_causal,
            use_sliding_window=core_window is None,
        )
        if self._use_gate:
            gate = self._gate_dense(query)
        q = projection(self._query_dense, query)
        k = projection(self._key_dense, key)
        v = projection(self._value_dense, value)
        extra = {"use_causal_mask": True} if core_causal else {}
        if core_window is not None:
            extra["sliding_window"] = core_window
        q, k, extra = self._encode_positions(q, k, extra, own_core)
        heads, scores = self._compute_attention(
            q, k, v, attention_mask, training, return_attention_scores, **extra
        )
        if self._use_gate:
            heads = ops.multiply(heads, gate)
        output = projection(self._output_dense, heads)
        if return_attention_scores:
            return output, scores
        return output

    # -------------------------------------------------------------- config

    def legacy_variables(self):
        if self._use_gate:
            return None
        return [
            w
            for dense in (
                self._query_dense,
                self._key_dense,
                self._value_dense,
                self._output_dense,
            )
            for w in dense.weights
        ]
