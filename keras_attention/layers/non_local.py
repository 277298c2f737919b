"""The non-local block of Wang et al. (2018), for 1D, 2D and 3D feature maps."""

import math

import keras
from keras import ops

from keras_attention._validation import check_bool
from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention import ops as attention_ops
from keras_attention.layers import base
from keras_attention.layers._feature_maps import NEG_INF
from keras_attention.layers._feature_maps import FeatureMapAttention
from keras_attention.layers._feature_maps import check_position_mask
from keras_attention.layers.base import float_inputs
from keras_attention.ops.masks import matmul
from keras_attention.ops.masks import wide_dtype
from keras_attention.registry import register

MODES = ("gaussian", "embedded_gaussian", "dot", "concatenation")


def _check_sub_sample(sub_sample):
    """`bool`, a positive int or a tuple of positive ints, as given."""
    if isinstance(sub_sample, bool):
        return sub_sample
    if isinstance(sub_sample, int) and sub_sample > 0:
        return sub_sample
    if (
        isinstance(sub_sample, (tuple, list))
        and sub_sample
        and all(
            isinstance(p, int) and not isinstance(p, bool) and p > 0
            for p in sub_sample
        )
    ):
        return tuple(sub_sample)
    raise invalid(
        "sub_sample",
        "a bool, a positive integer or a tuple of positive integers",
        sub_sample,
    )


def _max_pool(x, pool_size):
    """Max-pool `(B, ..., C)` by `pool_size`, "same" padding. A float64
    3D map `(B, D, H, W, C)` is pooled over `(H, W)`, then over `D` (the
    same maximum: each axis is padded on its own), as TensorFlow has no
    float64 `MaxPool3D`."""
    float64 = keras.backend.standardize_dtype(x.dtype) == "float64"
    if len(pool_size) < 3 or not float64:
        return ops.max_pool(x, pool_size, pool_size, padding="same")
    depth_pool, height_pool, width_pool = pool_size
    batch, depth, height, width = ops.shape(x)[:4]
    channels = x.shape[-1]
    x = ops.reshape(x, (-1, height, width, channels))  # (B * D, H, W, C)
    spatial_pool = (height_pool, width_pool)
    x = ops.max_pool(x, spatial_pool, spatial_pool, padding="same")
    height, width = ops.shape(x)[1:3]
    x = ops.reshape(x, (batch, depth, -1, channels))  # (B, D, H' * W', C)
    x = ops.max_pool(x, (depth_pool, 1), (depth_pool, 1), padding="same")
    return ops.reshape(x, (batch, -1, height, width, channels))


def _weight(sublayer, name):
    return None if sublayer is None else getattr(sublayer, name)


@register("non_local", input_kind="grid")
class NonLocalBlock(FeatureMapAttention):
    """Non-local block (Wang et al., 2018), for 1D, 2D and 3D feature maps.

    Every position `i` of the map aggregates the features of all positions
    `j`, weighted by a pairwise function `f`:
    `y_i = 1 / C(x) * sum_j f(x_i, x_j) g(x_j)`, with `g(x) = W_g x` a 1x1
    projection to `inter_channels`. The block returns `z = W_z y + x`, where
    `W_z` projects back to `C` channels (followed by batch normalization if
    `use_batch_norm`) and starts at zero, so a freshly inserted block is the
    identity and a pre-trained network keeps its behaviour.

    The pairwise functions of the paper (`mode`), with `theta(x) = W_theta x`
    and `phi(x) = W_phi x`:

    - `"gaussian"`: `softmax_j(x_i . x_j)` on the raw inputs.
    - `"embedded_gaussian"`: `softmax_j(theta(x_i) . phi(x_j))`, the
      self-attention of Vaswani et al. without scaling.
    - `"dot"`: `theta(x_i) . phi(x_j) / N`, `N` the number of key positions.
    - `"concatenation"`: `ReLU(w_f . [theta(x_i), phi(x_j)]) / N`, computed
      as `ReLU(w_theta . theta(x_i) + w_phi . phi(x_j))` so no
      `(N, N, 2 * inter_channels)` tensor is formed.

    The two softmax modes run on the shared attention core, memory-efficient
    for large maps; `"dot"` computes `theta (phi^T g) / N`, linear in `N`,
    unless its weights are requested. With `sub_sample`, `phi` and `g` (the
    keys and values) are max-pooled as in the paper, which divides the cost
    by the pooling factor.

    A Keras mask over the positions (padding of a sequence) removes masked
    positions from the keys (`N` then counts the valid keys), and a masked
    position attends to nothing: its weights and attended features are 0.

    The 1x1 convolutions `theta`, `phi`, `g` and the output projection are
    keras `Dense` sublayers on the channel axis: `enable_lora(rank)` and
    `model.quantize("int8")` work on them.

    Args:
        mode: the pairwise function: `"gaussian"`, `"embedded_gaussian"`,
            `"dot"` or `"concatenation"`.
        inter_channels: the bottleneck size of `theta`, `phi` and `g`;
            defaults to `C // 2` (at least 1).
        sub_sample: max-pool `phi` and `g`. `True` pools by 2 along every
            axis of 1D and 2D maps and by `(1, 2, 2)` on 3D maps (space, not
            time, as in the paper's video models); an int or a tuple (one
            size per spatial axis) gives the pool size. `False` keeps all.
            Pooling uses "same" padding: no position is dropped.
        use_batch_norm: batch normalization after `W_z`, as in the paper.
        zero_init_residual: start the residual branch at zero (the kernel
            of `W_z`, or the scale of the batch normalization when
            `use_batch_norm`) so the block starts as the identity. `False`
            initializes `W_z` like the other kernels.
        use_bias: whether the projections have biases.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer: as for `keras.layers.Dense`, for the projections.

    Call arguments:
        inputs: `(B, L, C)`, `(B, H, W, C)` or `(B, D, H, W, C)`.
        return_attention_scores: also return the pairwise weights
            `f / C(x)`, `(B, 1, T, S)` with `T` the number of positions and
            `S` the number of (sub-sampled) key positions.
        training: whether batch normalization uses batch statistics.
        mask: optional boolean `(B, ...)`, `True` at valid positions.

    Returns:
        `z`, of the input's shape, and the weights `(B, 1, T, S)` if
        `return_attention_scores=True`.

    Raises:
        ValueError: naming the argument: `mode` not one of `MODES`,
            `inter_channels` not a positive integer, `sub_sample` not a
            pool size (or one per spatial axis of the inputs); inputs that
            are not maps of 1 to 3 spatial axes (channels-last, or first
            with `data_format="channels_first"`), a `mask` of another
            shape, or once built a map of other channels (or, with
            `use_batch_norm`, of another rank: without it, a block built on
            images refines sequences too, its projections being 1x1).

    Example:

    ```python
    inputs = keras.Input((8, 8, 16))
    x = keras.layers.Conv2D(32, 3, padding="same")(inputs)
    x = NonLocalBlock(mode="embedded_gaussian", sub_sample=True)(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    model(np.zeros((2, 8, 8, 16))).shape  # (2, 32)
    ```

    References:
        - Wang et al., Non-local Neural Networks, CVPR 2018.
          https://arxiv.org/abs/1711.07971
    """

    # The query and value embeddings and the output `W` (zero at first:
    # LoRA on theta and g alone would have no gradient through it).
    lora_targets = ("theta", "g", "output")

    def __init__(
        self,
        mode="embedded_gaussian",
        inter_channels=None,
        sub_sample=False,
        use_batch_norm=False,
        zero_init_residual=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if mode not in MODES:
            raise invalid(
                "mode", "one of " + ", ".join(repr(m) for m in MODES), mode
            )
        self.mode = mode
        self.inter_channels = check_positive_int(
            "inter_channels", inter_channels, allow_none=True
        )
        self.sub_sample = _check_sub_sample(sub_sample)
        self.use_batch_norm = check_bool("use_batch_norm", use_batch_norm)
        self.zero_init_residual = check_bool("zero_init_residual", zero_init_residual)

    def pool_size(self, spatial_rank):
        """The max-pool size of `phi` and `g`, or `None` for no pooling."""
        if self.sub_sample is False:
            return None
        if self.sub_sample is True:
            size = (1, 2, 2) if spatial_rank == 3 else (2,) * spatial_rank
        elif isinstance(self.sub_sample, int):
            size = (self.sub_sample,) * spatial_rank
        else:
            size = tuple(self.sub_sample)
            if len(size) != spatial_rank:
                raise invalid(
                    "sub_sample",
                    f"one pool size per spatial axis ({spatial_rank}) of "
                    "the inputs",
                    self.sub_sample,
                )
        return None if all(p == 1 for p in size) else size

    def _add_kernel(self, name, shape, initializer=None):
        initializer = initializer or self.kernel_initializer
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=base.clone_initializer(initializer),
            regularizer=self.kernel_regularizer,
        )

    def build(self, input_shape):
        # 1x1 projections take maps of any rank; a batch normalization
        # built on one rank takes that rank only (its own error otherwise).
        self._rank_fixed_at_build = bool(self.use_batch_norm)
        self.check_build_shape(input_shape)
        input_shape = self.last_shape(input_shape)
        self.pool_size(len(input_shape) - 2)  # validates `sub_sample`
        channels = input_shape[-1]
        inter = self.inter_channels or max(1, channels // 2)
        self.theta = self.phi = None
        self.concat_kernel = None
        # Made in the order the former raw kernels drew their values.
        if self.mode != "gaussian":  # gaussian compares raw inputs
            self.theta = self._dense("theta", inter, channels)
            self.phi = self._dense("phi", inter, channels)
        if self.mode == "concatenation":
            # w_f of the paper: [w_theta; w_phi], one score per pair.
            self.concat_kernel = self._add_kernel("concat_kernel", (2 * inter,))
        self.g = self._dense("g", inter, channels)
        zero_kernel = self.zero_init_residual and not self.use_batch_norm
        self.output_dense = self._dense(
            "output",
            channels,
            inter,
            keras.initializers.Zeros() if zero_kernel else None,
        )
        self.batch_norm = None
        if self.use_batch_norm:
            self.batch_norm = keras.layers.BatchNormalization(
                gamma_initializer="zeros" if self.zero_init_residual else "ones",
                name="batch_norm",
                dtype=self.dtype_policy,
            )
            self.batch_norm.build(tuple(input_shape))
        self.built = True

    # The projections' weights under their former names (NumPy references).
    theta_kernel = property(lambda self: _weight(self.theta, "kernel"))
    theta_bias = property(lambda self: _weight(self.theta, "bias"))
    phi_kernel = property(lambda self: _weight(self.phi, "kernel"))
    phi_bias = property(lambda self: _weight(self.phi, "bias"))
    g_kernel = property(lambda self: self.g.kernel)
    g_bias = property(lambda self: self.g.bias)
    output_kernel = property(lambda self: self.output_dense.kernel)
    output_bias = property(lambda self: self.output_dense.bias)

    def _pool(self, x, mask, pool_size):
        """Max-pool the keys or values (and their mask) `(B, ..., C)`."""
        if pool_size is None:
            return x, mask
        if mask is None:
            return _max_pool(x, pool_size), None
        # Masked positions must not win the max: pool in float32 (float64
        # for float64 maps), where NEG_INF is finite.
        valid = ops.cast(mask[..., None], "float32")
        pooled_mask = _max_pool(valid, pool_size)
        pooled_mask = pooled_mask[..., 0] > 0.5
        wide = ops.cast(x, wide_dtype(x.dtype))
        wide = ops.where(mask[..., None], wide, NEG_INF)
        pooled = _max_pool(wide, pool_size)
        pooled = ops.where(pooled_mask[..., None], pooled, 0.0)
        return ops.cast(pooled, x.dtype), pooled_mask

    def call(
        self,
        inputs,
        return_attention_scores=False,
        training=None,
        mask=None,
    ):
        x = self.to_last(float_inputs(self, inputs))
        spatial = tuple(x.shape[1:-1])
        mask = check_position_mask(mask, x)
        pool_size = self.pool_size(len(spatial))
        batch = ops.shape(x)[0]

        def flatten(t):  # (B, ..., c) -> (B, N, c), N static when known
            dims = tuple(t.shape[1:-1])
            known = all(isinstance(d, int) for d in dims)
            return ops.reshape(t, (batch, math.prod(dims) if known else -1,
                                   t.shape[-1]))

        g, key_mask = self._pool(
            self.g(x), mask, pool_size
        )
        if self.mode == "gaussian":
            query = x
            key, _ = self._pool(x, mask, pool_size)
        else:
            query = self.theta(x)
            key, _ = self._pool(self.phi(x), mask, pool_size)
        query, key, value = flatten(query), flatten(key), flatten(g)
        if key_mask is not None:
            key_mask = ops.reshape(key_mask, (batch, key.shape[1] or -1))  # (B, S)
            # Zero, not just unweighted: 0 * inf would still give NaN.
            value = ops.where(key_mask[:, :, None], value, ops.zeros_like(value))

        if self.mode in ("gaussian", "embedded_gaussian"):
            y, weights = self._softmax_attention(
                query, key, value, key_mask, return_attention_scores
            )
        else:
            y, weights = self._normalized_attention(
                query, key, value, key_mask, return_attention_scores
            )
        if mask is not None:
            # A masked position attends to nothing (the score contract): its
            # weights and attended features are 0, as in the sequence layers.
            valid = ops.reshape(mask, (batch, -1))  # (B, T)
            y = ops.where(valid[:, :, None], y, ops.cast(0.0, y.dtype))
            if weights is not None:
                weights = ops.where(
                    valid[:, None, :, None], weights, ops.cast(0.0, weights.dtype)
                )
        y = ops.reshape(y, tuple(ops.shape(x)[:-1]) + (y.shape[-1],))
        z = self.output_dense(y)
        if self.batch_norm is not None:
            z = self.batch_norm(z, training=training, mask=mask)
        outputs = self.from_last(x + ops.cast(z, x.dtype))
        if return_attention_scores:
            return outputs, weights
        return outputs

    def _softmax_attention(self, query, key, value, key_mask, return_weights):
        """`softmax_j(q_i . k_j) v_j` on the shared core, no scaling."""
        # Scores in float32 (float64 for float64): the raw inputs of
        # "gaussian" can be large.
        wide = wide_dtype(query.dtype)
        result = attention_ops.dot_product_attention(
            # expand_dims rather than `[:, :, None]`: LiteRT has no builtin
            # strided slice that adds axes.
            ops.expand_dims(ops.cast(query, wide), 2),  # (B, T, 1, D)
            ops.expand_dims(ops.cast(key, wide), 2),  # (B, S, 1, D)
            ops.expand_dims(value, 2),  # (B, S, 1, Dv)
            attention_mask=key_mask,
            scale=1.0,
            return_weights=return_weights,
        )
        if return_weights:
            y, weights = result
            return y[:, :, 0, :], weights
        return result[:, :, 0, :], None

    def _normalized_attention(self, query, key, value, key_mask, return_weights):
        """`sum_j f(x_i, x_j) v_j / N` of the "dot" and "concatenation" modes."""
        out_dtype = value.dtype
        wide = wide_dtype(query.dtype)
        q = ops.cast(query, wide)  # (B, T, D)
        k = ops.cast(key, wide)  # (B, S, D)
        v = ops.cast(value, wide)  # (B, S, Dv)
        if key_mask is None:
            count = ops.cast(ops.shape(k)[1], wide)
        else:
            valid = key_mask[:, :, None]  # (B, S, 1)
            # N counts the valid keys (B, 1, 1); at least 1 so rows without
            # keys give zeros.
            count = ops.sum(ops.cast(valid, wide), axis=1, keepdims=True)
            count = ops.maximum(count, 1.0)
            k = ops.where(valid, k, 0.0)
        if self.mode == "dot" and not return_weights:
            # theta (phi^T g) / N: O(N D Dv) instead of O(N^2).
            context = matmul(ops.transpose(k, (0, 2, 1)), v)  # (B, D, Dv)
            y = matmul(q, context) / count
            return ops.cast(y, out_dtype), None
        if self.mode == "dot":
            f = matmul(q, ops.transpose(k, (0, 2, 1)))  # (B, T, S)
        else:
            inter = self.concat_kernel.shape[0] // 2
            w = ops.cast(self.concat_kernel, wide)
            a = matmul(q, w[:inter])  # (B, T)
            b = matmul(k, w[inter:])  # (B, S)
            f = ops.relu(a[:, :, None] + b[:, None, :])  # (B, T, S)
            if key_mask is not None:
                f = ops.where(key_mask[:, None, :], f, 0.0)
        weights = f / count
        y = matmul(weights, v)  # (B, T, Dv)
        weights = weights[:, None, :, :] if return_weights else None
        return ops.cast(y, out_dtype), weights

    def legacy_variables(self):
        variables = []
        for dense in (self.theta, self.phi):
            variables += [] if dense is None else dense.weights
        if self.concat_kernel is not None:
            variables.append(self.concat_kernel)
        return variables + self.g.weights + self.output_dense.weights
