"""CBAM: channel attention, spatial attention and their composition.

Woo et al., CBAM: Convolutional Block Attention Module, ECCV 2018.
Channels-last feature maps `(B, ..., C)`: 1D `(B, L, C)`, 2D `(B, H, W, C)`
or 3D `(B, D, H, W, C)`.
"""

import keras
from keras import ops

from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention.layers import base
from keras_attention.layers._feature_maps import NEG_INF
from keras_attention.layers._feature_maps import FeatureMapAttention
from keras_attention.layers._feature_maps import check_position_mask
from keras_attention.layers.base import float_inputs
from keras_attention.ops.masks import wide_dtype
from keras_attention.registry import register

def _check_kernel_size(kernel_size):
    if (
        isinstance(kernel_size, bool)
        or not isinstance(kernel_size, int)
        or kernel_size <= 0
        or kernel_size % 2 == 0
    ):
        raise invalid(
            "kernel_size", "an odd positive integer", kernel_size
        )
    return kernel_size


class _ImageAttention(FeatureMapAttention):
    """What the CBAM layers share: their convolutions."""

    def _conv(self, name, input_shape, filters, kernel_size):
        """A built same-padded `keras.layers.Conv{1,2,3}D` (LoRA)."""
        conv_class = {
            1: keras.layers.Conv1D,
            2: keras.layers.Conv2D,
            3: keras.layers.Conv3D,
        }[len(input_shape) - 2]
        conv = conv_class(
            filters,
            kernel_size,
            padding="same",
            data_format="channels_last",
            **base.sublayer_kwargs(self, name),
        )
        conv.build(tuple(input_shape))
        return conv

    def _weights_config(self):
        return base.arguments_config(self, base.WEIGHT_ARGUMENTS)


@register("channel", input_kind="grid")
class ChannelAttention(_ImageAttention):
    """Channel attention of CBAM (Woo et al., 2018).

    Each channel is re-weighted by how informative it is. The feature map is
    squeezed over its positions by average- and max-pooling into two
    descriptors `(B, C)`, both go through one shared MLP
    `C -> C / reduction -> C` (ReLU in between), and
    `M_c = sigmoid(MLP(AvgPool(F)) + MLP(MaxPool(F)))`; the output is
    `F * M_c`, broadcast over the positions.

    Any channels-last input of rank 3 or more works: `(B, L, C)`,
    `(B, H, W, C)`, `(B, D, H, W, C)`. A Keras mask over the positions
    (e.g. padding of a sequence) keeps masked positions out of both pools.

    The MLP is two keras `Dense` sublayers (`hidden_dense`, `output_dense`):
    `enable_lora(rank)` and `model.quantize("int8")` work on them.

    Args:
        reduction: the MLP's reduction ratio `r`; must divide the number of
            channels `C`. The paper uses 16.
        use_bias: whether the MLP's two layers have biases.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer: as for `keras.layers.Dense`.

    Call arguments:
        inputs: the feature map `(B, ..., C)`.
        return_attention_scores: also return the channel weights `(B, C)`.
        mask: optional boolean `(B, ...)`, `True` at valid positions.

    Returns:
        The refined feature map, of the input's shape, and the channel
        weights `M_c` `(B, C)` in `(0, 1)` if `return_attention_scores=True`.

    Raises:
        ValueError: naming the argument: `reduction` not a positive
            integer or not dividing the channels; inputs that are not
            channels-last feature maps, or once built of other channels.

    Example:

    ```python
    x = np.random.rand(2, 8, 8, 32).astype("float32")
    layer = ChannelAttention(reduction=8)
    y, weights = layer(x, return_attention_scores=True)
    y.shape, weights.shape  # (2, 8, 8, 32), (2, 32)
    ```

    References:
        - Woo et al., CBAM: Convolutional Block Attention Module, 2018.
          https://arxiv.org/abs/1807.06521
    """

    _max_rank = None  # pooled over all positions: any rank
    lora_targets = ("hidden", "output")  # the shared MLP

    def __init__(self, reduction=16, **kwargs):
        super().__init__(**kwargs)
        self.reduction = check_positive_int("reduction", reduction)

    def build(self, input_shape):
        self.check_build_shape(input_shape)
        channels = self.last_shape(input_shape)[-1]
        if channels % self.reduction:
            raise invalid(
                "reduction",
                f"a divisor of the number of input channels ({channels})",
                self.reduction,
            )
        hidden = channels // self.reduction
        # The shared MLP: W0 (C -> C/r), ReLU, W1 (C/r -> C), as keras
        # Dense layers (LoRA, quantization, keras weight files).
        self.hidden_dense = self._dense("hidden", hidden, channels)
        self.output_dense = self._dense("output", channels, hidden)
        self.built = True

    # The MLP's weights under their former names (NumPy references).
    hidden_kernel = property(lambda self: self.hidden_dense.kernel)
    hidden_bias = property(lambda self: self.hidden_dense.bias)
    output_kernel = property(lambda self: self.output_dense.kernel)
    output_bias = property(lambda self: self.output_dense.bias)

    def mlp(self, descriptor):
        """The shared MLP on a `(B, C)` descriptor."""
        return self.output_dense(ops.relu(self.hidden_dense(descriptor)))

    def call(self, inputs, return_attention_scores=False, mask=None,
             training=None):  # keras's `stateless_call` passes `training`
        inputs = self.to_last(float_inputs(self, inputs))
        mask = check_position_mask(mask, inputs)
        axes = tuple(range(1, len(inputs.shape) - 1))
        if mask is None:
            avg = ops.mean(inputs, axis=axes)  # (B, C)
            # `amax`, not `max`: Keras's torch `max` checks its result in a
            # way `torch.compile` cannot trace (a break in the graph).
            peak = ops.amax(inputs, axis=axes)
        else:
            # Pool over the valid positions only, in float32 (float64 for
            # float64 maps).
            wide = wide_dtype(inputs.dtype)
            x = ops.cast(inputs, wide)
            m = mask[..., None]
            count = ops.sum(ops.cast(m, wide), axis=axes)  # (B, 1)
            avg = ops.sum(ops.where(m, x, 0.0), axis=axes)
            avg = avg / ops.maximum(count, 1.0)
            peak = ops.amax(ops.where(m, x, NEG_INF), axis=axes)
            # A sample with no valid position pools to zeros.
            peak = ops.where(count > 0, peak, 0.0)
            avg = ops.cast(avg, inputs.dtype)
            peak = ops.cast(peak, inputs.dtype)
        weights = ops.sigmoid(self.mlp(avg) + self.mlp(peak))  # (B, C)
        broadcast = ops.reshape(
            weights, (-1,) + (1,) * len(axes) + (inputs.shape[-1],)
        )
        outputs = self.from_last(inputs * ops.cast(broadcast, inputs.dtype))
        if return_attention_scores:
            return outputs, weights
        return outputs

    def legacy_variables(self):
        return self.hidden_dense.weights + self.output_dense.weights


@register("spatial", input_kind="grid")
class SpatialAttention(_ImageAttention):
    """Spatial attention of CBAM (Woo et al., 2018).

    Each position is re-weighted by how informative it is. The feature map is
    squeezed over its channels by average- and max-pooling into two maps,
    concatenated `(B, ..., 2)` and convolved (`kernel_size`, same padding) to
    one channel: `M_s = sigmoid(conv([AvgPool_c(F); MaxPool_c(F)]))`; the
    output is `F * M_s`, broadcast over the channels.

    Works on 1D `(B, L, C)`, 2D `(B, H, W, C)` and 3D `(B, D, H, W, C)` maps
    (a 1D, 2D or 3D convolution). With a Keras mask over the positions, the
    pooled maps are zero at masked positions (as at the borders), so masked
    values never reach valid positions through the convolution.

    The convolution is a keras `Conv1D`/`Conv2D`/`Conv3D` sublayer (`conv`):
    `enable_lora(rank)` works on it (keras quantizes no convolution).

    Args:
        kernel_size: the odd size of the convolution along every spatial
            axis. The paper uses 7.
        use_bias: whether the convolution has a bias.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer: as for `keras.layers.Conv2D`.

    Call arguments:
        inputs: the feature map `(B, ..., C)`.
        return_attention_scores: also return the spatial map `(B, ..., 1)`.
        mask: optional boolean `(B, ...)`, `True` at valid positions.

    Returns:
        The refined feature map, of the input's shape, and the spatial map
        `M_s` `(B, ..., 1)` (e.g. `(B, H, W, 1)`) in `(0, 1)` if
        `return_attention_scores=True`.

    Raises:
        ValueError: naming the argument: `kernel_size` not a positive odd
            integer; inputs that are not channels-last feature maps, or
            once built of another rank.

    Example:

    ```python
    x = np.random.rand(2, 8, 8, 32).astype("float32")
    layer = SpatialAttention(kernel_size=7)
    y, attention_map = layer(x, return_attention_scores=True)
    y.shape, attention_map.shape  # (2, 8, 8, 32), (2, 8, 8, 1)
    ```

    References:
        - Woo et al., CBAM: Convolutional Block Attention Module, 2018.
          https://arxiv.org/abs/1807.06521
    """

    _rank_fixed_at_build = True  # the convolution's kernel
    lora_targets = ("conv",)

    def __init__(self, kernel_size=7, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size = _check_kernel_size(kernel_size)

    def build(self, input_shape):
        self.check_build_shape(input_shape)
        # Kernel (k, ..., k, 2 pooled maps, 1 output channel).
        pooled_shape = self.last_shape(input_shape)[:-1] + (2,)
        self.conv = self._conv("conv", pooled_shape, 1, self.kernel_size)
        self.built = True

    kernel = property(lambda self: self.conv.kernel)
    bias = property(lambda self: self.conv.bias)

    def call(self, inputs, return_attention_scores=False, mask=None,
             training=None):  # keras's `stateless_call` passes `training`
        inputs = self.to_last(float_inputs(self, inputs))
        mask = check_position_mask(mask, inputs)
        avg = ops.mean(inputs, axis=-1, keepdims=True)  # (B, ..., 1)
        peak = ops.amax(inputs, axis=-1, keepdims=True)  # as above
        pooled = ops.concatenate([avg, peak], axis=-1)  # (B, ..., 2)
        if mask is not None:
            pooled = ops.where(mask[..., None], pooled, ops.zeros_like(pooled))
        logits = self.conv(pooled)
        attention_map = ops.sigmoid(logits)  # (B, ..., 1)
        outputs = self.from_last(inputs * attention_map)
        if return_attention_scores:
            return outputs, self.from_last(attention_map)
        return outputs

    def legacy_variables(self):
        return self.conv.weights


@register("cbam", input_kind="grid")
class CBAM(_ImageAttention):
    """Convolutional Block Attention Module (Woo et al., 2018).

    Channel attention, then spatial attention, applied in sequence as in the
    paper: `F' = M_c(F) * F`, `F'' = M_s(F') * F'` (see `ChannelAttention`
    and `SpatialAttention`). Inserted in a ResNet block, it refines the
    residual branch before the addition.

    `enable_lora(rank)` adapts the MLP and the convolution of both parts;
    `model.quantize("int8")` quantizes the MLP.

    Args:
        reduction: the channel MLP's reduction ratio; must divide the number
            of channels. The paper uses 16.
        kernel_size: the odd size of the spatial convolution. The paper uses 7.
        use_bias: whether the MLP and the convolution have biases.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer: for the weights of both parts.

    Call arguments:
        inputs: the feature map `(B, ..., C)`, 1D, 2D or 3D.
        return_attention_scores: also return both attention maps.
        mask: optional boolean `(B, ...)`, `True` at valid positions.

    Returns:
        The refined feature map `F''`, of the input's shape. With
        `return_attention_scores=True`, the tuple
        `(F'', (channel_weights, spatial_map))`: the channel weights `M_c`
        `(B, C)` and the spatial map `M_s` `(B, ..., 1)`, in the order they
        are applied.

    Raises:
        ValueError: naming the argument: `reduction` not a positive
            integer or not dividing the channels, `kernel_size` not a
            positive odd integer; inputs that are not channels-last feature
            maps or, once built, a map of other channels or rank.

    Example:

    ```python
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(32, 3, padding="same")(inputs)
    x = CBAM(reduction=8)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    model(np.zeros((2, 16, 16, 3))).shape  # (2, 10)
    ```

    References:
        - Woo et al., CBAM: Convolutional Block Attention Module, 2018.
          https://arxiv.org/abs/1807.06521
    """

    _rank_fixed_at_build = True  # the convolution's kernel
    lora_targets = ("hidden", "output", "conv")  # both parts'

    def __init__(self, reduction=16, kernel_size=7, **kwargs):
        super().__init__(**kwargs)
        self.reduction = check_positive_int("reduction", reduction)
        self.kernel_size = _check_kernel_size(kernel_size)

    def build(self, input_shape):
        self.check_build_shape(input_shape)
        weights_config = self._weights_config()
        self.channel_attention = ChannelAttention(
            reduction=self.reduction,
            name="channel_attention",
            dtype=self.dtype_policy,
            data_format=self.data_format,
            **weights_config,
        )
        self.spatial_attention = SpatialAttention(
            kernel_size=self.kernel_size,
            name="spatial_attention",
            dtype=self.dtype_policy,
            data_format=self.data_format,
            **weights_config,
        )
        self.channel_attention.build(input_shape)
        self.spatial_attention.build(input_shape)
        self.built = True

    def call(self, inputs, return_attention_scores=False, mask=None,
             training=None):  # keras's `stateless_call` passes `training`
        refined, channel_weights = self.channel_attention(
            inputs, return_attention_scores=True, mask=mask
        )
        outputs, spatial_map = self.spatial_attention(
            refined, return_attention_scores=True, mask=mask
        )
        if return_attention_scores:
            return outputs, (channel_weights, spatial_map)
        return outputs
