import math

import keras

from keras_attention._validation import check_bool
from keras_attention._validation import check_rate
from keras_attention._validation import invalid
from keras_attention.layers import base
from keras_attention.registry import register

SCORE_MODES = ("scaled_dot", "dot", "general")


@register("scaled_dot_product", input_kind="tokens")
class ScaledDotProductAttention(base.ProjectionMixin, base.SequenceAttention):
    """Single-head dot-product attention (Vaswani et al.; Luong et al.).

    `softmax(score(Q, K)) V` with one of three scores:

    - `"scaled_dot"` (default, Vaswani et al. 2017): `q . k / sqrt(D)`;
    - `"dot"` (Luong et al. 2015): `q . k`;
    - `"general"` (Luong et al. 2015): `q^T W k` with a learned `W`.

    The first two have no weights; `W` is a keras `Dense` sublayer
    (`general_dense`: `enable_lora(rank)`, quantization). Long sequences use
    the memory-efficient core when the scores are not requested.

    Args:
        score_mode: `"scaled_dot"`, `"dot"` or `"general"`.
        dropout: dropout rate on the attention weights.
        use_causal_mask: always apply a causal mask; also per call.
        kernel_initializer: initializer of `W` (`"general"` only).
        seed: seed of the dropout.

    Call arguments:
        query: `(B, T, D)` or one decoder step `(B, D)`; or a list
            `[query, value]` / `[query, value, key]`.
        value: `(B, S, Dv)`; defaults to `query` (self-attention).
        key: `(B, S, D)` (`(B, S, Dk)` for `"general"`); defaults to `value`.
        query_mask, value_mask, key_mask, attention_mask: as for
            `MultiHeadAttention`; Keras masks are used when not given.
        use_causal_mask: apply a causal mask in this call.
        return_attention_scores: also return the weights `(B, T, S)`
            (`(B, S)` for a `(B, D)` query).
        training: whether dropout is active.

    Returns:
        `(B, T, Dv)`, and the weights if `return_attention_scores=True`.

    Raises:
        ValueError: naming the argument: `score_mode` not one of
            `SCORE_MODES`, `dropout` outside `[0, 1)`; `"dot"` and
            `"scaled_dot"` scores of a query and a key of other sizes (use
            `"general"`); inputs that are not sequences, or masks of other
            shapes.

    Example:

    ```python
    x = np.random.rand(2, 6, 8).astype("float32")
    ScaledDotProductAttention(use_causal_mask=True)(x).shape  # (2, 6, 8)
    luong = ScaledDotProductAttention(score_mode="general")
    luong([np.random.rand(2, 3, 4), np.random.rand(2, 6, 8)]).shape  # (2, 3, 8)
    ```

    References:
        - Vaswani et al., Attention Is All You Need, 2017.
          https://arxiv.org/abs/1706.03762
        - Luong, Pham & Manning, Effective Approaches to Attention-based
          Neural Machine Translation, 2015. https://arxiv.org/abs/1508.04025
    """

    # Luong's `W` of the `"general"` score, its only projection (the other
    # score modes have no weights to adapt).
    lora_targets = ("general",)

    def __init__(
        self,
        score_mode="scaled_dot",
        dropout=0.0,
        use_causal_mask=False,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if score_mode not in SCORE_MODES:
            raise invalid("score_mode", f"one of {SCORE_MODES}", score_mode)
        self.score_mode = score_mode
        self.dropout = check_rate("dropout", dropout)
        self.use_causal_mask = check_bool("use_causal_mask", use_causal_mask)
        base.keep_weight_arguments(self, locals())

    def build(self, query_shape, value_shape=None, key_shape=None):
        query_shape, value_shape, key_shape = base.split_shapes(
            query_shape, value_shape, key_shape
        )
        self.check_query_shapes(query_shape, value_shape, key_shape)
        self.general_dense = None
        if self.score_mode == "general":
            # W of `q^T W k`, as a keras Dense layer (LoRA, quantization).
            self.general_dense = keras.layers.Dense(
                key_shape[-1],
                use_bias=False,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="general",
            )
            self.general_dense.build((None, query_shape[-1]))
        elif query_shape[-1] != key_shape[-1]:
            raise ValueError(
                f"score_mode={self.score_mode!r} needs `query` and `key` with "
                "the same last dimension (use score_mode='general' otherwise). "
                f"Received: query.shape={query_shape}, key.shape={key_shape}"
            )
        self.built = True

    @property
    def kernel(self):
        """`W` of the `"general"` score (`None` for the others)."""
        return None if self.general_dense is None else self.general_dense.kernel

    def attend(self, query, value, key, mask, training, return_weights):
        if self.score_mode == "general":
            # In the keys' dtype: Keras's torch `Dense` gives float32 for
            # float64 (its matmul's result type), which the scores' einsum
            # refused beside float64 keys.
            query = keras.ops.cast(self.general_dense(query), key.dtype)  # (B, T, Dk)
        scale = (
            1.0 / math.sqrt(query.shape[-1])
            if self.score_mode == "scaled_dot"
            else 1.0
        )
        return self.attend_one_head(
            query, key, value, mask, training, return_weights, scale=scale
        )

    def legacy_variables(self):
        return None if self.general_dense is None else self.general_dense.weights
