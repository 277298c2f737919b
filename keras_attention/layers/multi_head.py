import math

import keras
from keras import ops

from keras_attention import ops as attention_ops
from keras_attention.layers import base
from keras_attention.registry import register


@register("multi_head", input_kind="tokens")
class MultiHeadAttention(base.SequenceAttention):
    """Multi-head attention (Vaswani et al., 2017), with grouped-query heads.

    The query, key and value are projected to `num_heads` heads of size
    `key_dim` (values: `value_dim`), each head computes
    `softmax(Q K^T / sqrt(key_dim)) V`, and the heads are concatenated and
    projected back to the query's feature size (or `output_shape`). With
    `num_key_value_heads < num_heads`, groups of query heads share key and
    value heads (Ainslie et al., 2023).

    Called on **one** tensor it is self-attention, so it stacks in a
    `keras.Sequential`; called on `[query, value]` or `[query, value, key]`
    (or with `query`, `value`, `key` arguments) it is cross-attention.
    Its weights have the shapes and order of `keras.layers.MultiHeadAttention`
    (`ours.set_weights(theirs.get_weights())` works), and long sequences use
    the memory-efficient core when the scores are not requested.

    Args:
        num_heads: number of query heads `H`.
        key_dim: size `D` of each query and key head.
        value_dim: size of each value head; defaults to `key_dim`.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_shape: feature size (int or tuple) of the output; defaults to
            the query's last dimension.
        num_key_value_heads: number of key/value heads `K`, dividing
            `num_heads`; defaults to `num_heads` (plain multi-head).
        use_causal_mask: always apply a causal mask (for `Sequential` use);
            can also be asked for per call.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, kernel_constraint, bias_constraint: as for
            `keras.layers.Dense`.
        seed: seed of the dropout.
        implementation: `"auto"`, `"dense"`, `"blocked"` or `"fused"` (see
            `keras_attention.ops.dot_product_attention`).

    Call arguments:
        query: `(B, T, dim)`, or a list `[query, value]` /
            `[query, value, key]`.
        value: optional `(B, S, dim)`; defaults to `query` (self-attention).
        key: optional `(B, S, dim)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional boolean `(B, T)` /
            `(B, S)` padding masks; Keras masks are used when not given.
        attention_mask: optional boolean `(B, T, S)` or `(B, H, T, S)`,
            `True` where a query may attend to a key.
        use_causal_mask: apply a causal mask in this call.
        return_attention_scores: also return the weights `(B, H, T, S)`.
        training: whether dropout is active.

    Returns:
        `(B, T, output_shape)`, and the attention weights if
        `return_attention_scores=True`. Queries whose keys are all masked
        attend to nothing: their heads are zero (keras's layer averages the
        values there instead).

    Example:

    ```python
    model = keras.Sequential([
        keras.Input((10, 32)),
        MultiHeadAttention(num_heads=4, key_dim=8),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(2),
    ])
    model(np.zeros((3, 10, 32))).shape  # (3, 2)
    ```

    References:
        - Vaswani et al., Attention Is All You Need, 2017.
          https://arxiv.org/abs/1706.03762
        - Ainslie et al., GQA, 2023. https://arxiv.org/abs/2305.13245
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        num_key_value_heads=None,
        use_causal_mask=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        implementation="auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = base.check_positive_int("num_heads", num_heads)
        self.key_dim = base.check_positive_int("key_dim", key_dim)
        self.value_dim = base.check_positive_int(
            "value_dim", value_dim, allow_none=True
        )
        self.dropout = base.check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        if output_shape is not None:
            dims = (
                (output_shape,)
                if isinstance(output_shape, int)
                else tuple(output_shape)
            )
            for d in dims:
                base.check_positive_int("output_shape", d)
        self._output_shape = output_shape
        self.num_key_value_heads = base.check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if self.num_key_value_heads and num_heads % self.num_key_value_heads:
            raise base.invalid(
                "num_key_value_heads",
                f"a divisor of num_heads={num_heads}",
                num_key_value_heads,
            )
        self.use_causal_mask = bool(use_causal_mask)
        if implementation not in ("auto", "dense", "blocked", "fused"):
            raise base.invalid(
                "implementation", "one of 'auto', 'dense', 'blocked', 'fused'",
                implementation,
            )
        self.implementation = implementation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        self.seed_generator = (
            keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        )

    @property
    def output_shape(self):
        return self._output_shape

    @property
    def kv_heads(self):
        return self.num_key_value_heads or self.num_heads

    @property
    def head_value_dim(self):
        return self.value_dim or self.key_dim

    def _add_kernel(self, name, shape):
        return self.add_weight(
            name=name,
            shape=shape,
            # Each kernel gets its own initializer so seeded ones differ.
            initializer=self.kernel_initializer.__class__.from_config(
                self.kernel_initializer.get_config()
            ),
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )

    def _add_bias(self, name, shape):
        if not self.use_bias:
            return None
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=self.bias_initializer.__class__.from_config(
                self.bias_initializer.get_config()
            ),
            regularizer=self.bias_regularizer,
            constraint=self.bias_constraint,
        )

    def _output_dims(self, query_shape):
        if self._output_shape is None:
            return (query_shape[-1],)
        if isinstance(self._output_shape, int):
            return (self._output_shape,)
        return tuple(self._output_shape)

    def build(self, query_shape, value_shape=None, key_shape=None):
        query_shape, value_shape, key_shape = base.split_shapes(
            query_shape, value_shape, key_shape
        )
        for name, shape in (
            ("query", query_shape),
            ("value", value_shape),
            ("key", key_shape),
        ):
            base.check_rank(name, shape)
            if shape[-1] is None:
                raise ValueError(
                    f"The last dimension of `{name}` must be known. "
                    f"Received: {name}.shape={shape}"
                )
        h, k, d, dv = self.num_heads, self.kv_heads, self.key_dim, self.head_value_dim
        # Same names, shapes and creation order as keras.layers.MultiHeadAttention.
        self.query_kernel = self._add_kernel("query_kernel", (query_shape[-1], h, d))
        self.query_bias = self._add_bias("query_bias", (h, d))
        self.key_kernel = self._add_kernel("key_kernel", (key_shape[-1], k, d))
        self.key_bias = self._add_bias("key_bias", (k, d))
        self.value_kernel = self._add_kernel("value_kernel", (value_shape[-1], k, dv))
        self.value_bias = self._add_bias("value_bias", (k, dv))
        out_dims = self._output_dims(query_shape)
        self.output_kernel = self._add_kernel("output_kernel", (h, dv) + out_dims)
        self.output_bias = self._add_bias("output_bias", out_dims)
        self.built = True

    def project(self, x, kernel, bias):
        """`(B, T, dim) -> (B, T, heads, size)` as one matmul."""
        dim, heads, size = kernel.shape
        y = ops.matmul(x, ops.reshape(kernel, (dim, heads * size)))
        y = ops.reshape(y, (-1, ops.shape(x)[1], heads, size))
        if bias is not None:
            y = y + bias
        return y

    def project_output(self, x):
        """`(B, T, H, Dv) -> (B, T, *output_shape)`."""
        h, dv = self.output_kernel.shape[:2]
        out_dims = tuple(self.output_kernel.shape[2:])
        y = ops.reshape(x, (-1, ops.shape(x)[1], h * dv))
        y = ops.matmul(y, ops.reshape(self.output_kernel, (h * dv, -1)))
        if len(out_dims) > 1:
            y = ops.reshape(y, (-1, ops.shape(x)[1]) + out_dims)
        if self.output_bias is not None:
            y = y + self.output_bias
        return y

    def attend(self, query, key, value, mask, return_weights, training):
        """Hook: the attention of projected heads `(B, T, H, D)`."""
        return attention_ops.dot_product_attention(
            query,
            key,
            value,
            attention_mask=mask,
            scale=1.0 / math.sqrt(self.key_dim),
            dropout_rate=self.dropout,
            seed=self.seed_generator,
            training=training,
            return_weights=return_weights,
            implementation=self.implementation,
        )

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        return_attention_scores=False,
        training=None,
        mask=None,
    ):
        causal = self.use_causal_mask if use_causal_mask is None else use_causal_mask
        query, value, key, combined = self.unpack_inputs(
            query,
            value,
            key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=causal,
            mask=mask,
        )
        q = self.project(query, self.query_kernel, self.query_bias)
        k = self.project(key, self.key_kernel, self.key_bias)
        v = self.project(value, self.value_kernel, self.value_bias)
        result = self.attend(q, k, v, combined, return_attention_scores, training)
        if return_attention_scores:
            heads, weights = result
            return self.project_output(heads), weights
        return self.project_output(result)

    def compute_output_shape(
        self, query_shape, value_shape=None, key_shape=None
    ):
        query_shape, value_shape, _ = base.split_shapes(
            query_shape, value_shape, key_shape
        )
        base.check_rank("query", query_shape)
        return tuple(query_shape[:-1]) + self._output_dims(query_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_shape": self._output_shape,
                "num_key_value_heads": self.num_key_value_heads,
                "use_causal_mask": self.use_causal_mask,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
                "bias_regularizer": keras.regularizers.serialize(
                    self.bias_regularizer
                ),
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(
                    self.bias_constraint
                ),
                "seed": self.seed,
                "implementation": self.implementation,
            }
        )
        return config
