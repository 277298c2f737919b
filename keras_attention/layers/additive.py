import keras
from keras import ops

from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention._validation import shape_fits
from keras_attention.layers import base
from keras_attention.registry import register


@register("additive", input_kind="tokens")
class AdditiveAttention(base.ProjectionMixin, base.SequenceAttention):
    """Additive attention (Bahdanau et al., 2015).

    Each query `q_t` scores every key `k_s` with a small perceptron,
    `e_ts = v^T tanh(W1 q_t + W2 k_s + b)`, the scores are normalised with a
    softmax over `s`, and the output is the weighted sum of the values,
    `c_t = sum_s a_ts v_s` (the decoder's context vector in the paper).
    `W1`, `W2`, `v` (and `b`) are learned; unlike
    `keras.layers.AdditiveAttention`, the inputs need no prior projection.
    `W1` and `W2` (+ `b`) are keras `Dense` sublayers (`query_dense`,
    `key_dense`): `enable_lora(rank)` and `model.quantize("int8")` work on
    them. The weights are returned before dropout (see docs/design.md).

    Args:
        units: size of the perceptron's hidden layer.
        dropout: dropout rate on the attention weights.
        use_bias: whether the perceptron has the bias `b`.
        kernel_initializer: initializer of `W1`, `W2` and `v`.
        seed: seed of the dropout.

    Call arguments:
        query: `(B, T, Dq)` or one decoder step `(B, Dq)`; or a list
            `[query, value]` / `[query, value, key]`.
        value: `(B, S, Dv)`; defaults to `query` (self-attention).
        key: `(B, S, Dk)`; defaults to `value`.
        query_mask, value_mask, key_mask, attention_mask: as for
            `MultiHeadAttention` (`(B, T)`, `(B, S)`, `(B, S)`, `(B, T, S)`);
            Keras masks are used when not given.
        use_causal_mask: apply a causal mask (decoder self-attention).
        return_attention_scores: also return the weights `(B, T, S)`
            (`(B, S)` for a `(B, Dq)` query).
        projected_key: `project_key(key)`, computed once by a decoder that
            attends to the same keys at every step (`W2 k + b` does not
            depend on the step); `key` then still gives the key mask.
        training: whether dropout is active.

    Returns:
        The context vectors `(B, T, Dv)` (`(B, Dv)` for a `(B, Dq)` query).

    Raises:
        ValueError: naming the argument: `units` not a positive integer,
            `dropout` outside `[0, 1)`; inputs that are not `[query,
            value(, key)]` sequences, or masks of other shapes;
            `projected_key` of another shape than `project_key(key)`, or
            `project_key` before the layer is built.

    Example:

    ```python
    decoder_states = np.random.rand(2, 4, 16).astype("float32")
    encoder_states = np.random.rand(2, 9, 32).astype("float32")
    context, weights = AdditiveAttention(units=8)(
        [decoder_states, encoder_states], return_attention_scores=True
    )
    context.shape, weights.shape  # (2, 4, 32), (2, 4, 9)

    # A decoder loop: project the keys once, not at every step.
    layer = AdditiveAttention(units=8)
    layer.build((None, 16), (None, 9, 32))  # one step (B, Dq), values (B, S, Dv)
    keys = layer.project_key(encoder_states)
    step = layer(decoder_states[:, 0], encoder_states, projected_key=keys)
    step.shape  # (2, 32)
    ```

    References:
        - Bahdanau, Cho & Bengio, Neural Machine Translation by Jointly
          Learning to Align and Translate, 2015.
          https://arxiv.org/abs/1409.0473
    """

    # Both its projections, `W1 q` and `W2 k` (it has no value projection,
    # so keras-hub's query and value adapted `W1` only).
    lora_targets = ("query", "key")

    def __init__(
        self,
        units,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self.dropout = check_rate("dropout", dropout)
        base.keep_weight_arguments(self, locals())

    def _initializer(self):
        return base.clone_initializer(self.kernel_initializer)

    def build(self, query_shape, value_shape=None, key_shape=None):
        query_shape, value_shape, key_shape = base.split_shapes(
            query_shape, value_shape, key_shape
        )
        self.check_query_shapes(query_shape, value_shape, key_shape)
        # W1 and W2 (+ b) as keras Dense layers (LoRA, quantization), then
        # v: the order in which the former raw kernels drew their values.
        self.query_dense = keras.layers.Dense(
            self.units,
            use_bias=False,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="query",
        )
        self.query_dense.build((None, query_shape[-1]))
        self.key_dense = keras.layers.Dense(
            self.units,
            use_bias=self.use_bias,
            kernel_initializer=self._initializer(),
            bias_initializer="zeros",
            dtype=self.dtype_policy,
            name="key",
        )
        self.key_dense.build((None, key_shape[-1]))
        self.score_kernel = self.add_weight(
            name="score_kernel", shape=(self.units,), initializer=self._initializer()
        )
        self.built = True

    # W1, W2 and b under their former names (NumPy references).
    query_kernel = property(lambda self: self.query_dense.kernel)
    key_kernel = property(lambda self: self.key_dense.kernel)
    bias = property(lambda self: self.key_dense.bias)

    def project_key(self, key):
        """`W2 k + b` `(B, S, units)`: the keys' half of the perceptron.

        A recurrent decoder attends to the same encoder states at every
        step; computing this once and passing it as `projected_key` saves a
        `(B, S, Dk) x (Dk, units)` matmul per step forward and two backward.
        The layer must be built: call it once, or `build(query_shape,
        value_shape)`. It computes on tensors (a layer's or a model's
        `call`, eager code), not on a functional model's symbolic inputs:
        there the keys' projection would be a second node of the sublayer
        `key`, and the model would not load from `.keras`.
        """
        if isinstance(key, keras.KerasTensor):
            raise ValueError(
                "`project_key` computes on tensors, not on a functional "
                "model's symbolic inputs (the model would not load back): in "
                "a functional model pass the keys as `value` (or `key`) and "
                "the layer projects them; use `project_key` inside a layer's "
                "or model's `call`. Received: key=" + repr(key)
            )
        if not self.built:
            raise ValueError(
                "`project_key` needs the layer's weights: call the layer once "
                "or build it with `build(query_shape, value_shape)` first. "
                f"Received: key.shape={tuple(key.shape)} for an unbuilt layer"
            )
        return self.key_dense(key)

    call_options = ("projected_key",)

    def attend(
        self, query, value, key, mask, training, return_weights,
        projected_key=None,
    ):
        q = self.query_dense(query)  # (B, T, U)
        if projected_key is None:
            k = self.project_key(key)  # (B, S, U), bias included
        else:
            expected = tuple(key.shape[:-1]) + (self.units,)
            if not shape_fits(projected_key.shape, expected):
                raise ValueError(
                    "Received an invalid value for argument `projected_key`, "
                    f"expected project_key(key) of shape {expected}. "
                    f"Received: projected_key.shape={projected_key.shape}"
                )
            k = ops.cast(projected_key, q.dtype)
        hidden = ops.expand_dims(q, 2) + ops.expand_dims(k, 1)  # (B, T, S, U)
        scores = ops.tensordot(ops.tanh(hidden), self.score_kernel, axes=1)
        # softmax(scores) V with masks and dropout on the shared core: the
        # additive scores enter as its bias (the dot-product term is zero,
        # one-dimensional heads); the weights come back before dropout.
        batch, t_len = ops.shape(scores)[0], ops.shape(scores)[1]
        s_len = ops.shape(scores)[2]
        output, weights = self.attend_one_head(
            ops.zeros((batch, t_len, 1), value.dtype),
            ops.zeros((batch, s_len, 1), value.dtype),
            value,
            mask,
            training,
            return_weights=True,
            bias=ops.expand_dims(scores, 1),
        )
        weights = ops.cast(weights, self.compute_dtype)  # (B, T, S)
        return (output, weights) if return_weights else output

    def legacy_variables(self):
        return (
            self.query_dense.weights + self.key_dense.weights + [self.score_kernel]
        )
