"""The residual attention block of CBAM-ResNet and DETR's backbone."""

import keras
from keras import ops

from keras_attention import _validation as base
from keras_attention._config import ArgumentConfig
from keras_attention import registry
from keras_attention.applications.blocks.attention_call import accepted_call_arguments
from keras_attention.applications.blocks.attention_call import build_attention
from keras_attention.applications.blocks.attention_call import call_attention

PACKAGE = "keras_attention"


def default_reduction(channels):
    """The channel MLP's reduction: the paper's 16, smaller for thin layers.

    The largest of 16, 8, 4, 2 dividing `channels` that keeps at least 8
    hidden units (1 if none does).
    """
    for reduction in (16, 8, 4, 2):
        if channels % reduction == 0 and channels // reduction >= 8:
            return reduction
    return 1


@keras.saving.register_keras_serializable(package=PACKAGE)
class ResidualAttentionBlock(ArgumentConfig, keras.layers.Layer):
    """A ResNet basic block whose residual branch goes through attention.

    `y = ReLU(shortcut(x) + A(BN(Conv3x3(ReLU(BN(Conv3x3(x)))))))`, where
    `A` is the attention layer registered as `attention` (the identity for
    `None`) and `shortcut` is the identity, or a strided 1x1 convolution
    with batch normalization when the shape changes (He et al., 2016; CBAM
    placement of Woo et al., 2018). The attention layer is offered
    `reduction` (`default_reduction(filters)`) and `kernel_size` (7),
    updated with `attention_kwargs`.

    Args:
        filters: output channels.
        strides: stride of the first convolution (and of the shortcut).
        attention: a registered `"grid"` attention name, or `None`.
        attention_kwargs: extra constructor arguments of the attention layer.
        kernel_regularizer: regularizer of the convolutions.
        kernel_initializer: initializer of the convolutions.

    Call arguments:
        inputs: `(B, H, W, C)`.
        return_attention_scores: also return the attention layer's scores
            (`None` without attention or for a layer without scores).
        training: whether batch normalization uses batch statistics.

    Returns:
        `(B, H / strides, W / strides, filters)`.
    """

    def __init__(
        self,
        filters,
        strides=1,
        attention="cbam",
        attention_kwargs=None,
        kernel_regularizer=None,
        kernel_initializer="he_normal",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.filters = base.check_positive_int("filters", filters)
        self.strides = base.check_positive_int("strides", strides)
        self.attention = registry.check_name(
            attention, allow_none=True, kinds=("grid",)
        )
        self.attention_kwargs = dict(attention_kwargs or {})
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        # Kept as given: a name makes a fresh initializer per convolution, as
        # keras layers do (an instance made here would draw a seed early).
        if isinstance(kernel_initializer, keras.initializers.Initializer):
            kernel_initializer = keras.initializers.serialize(kernel_initializer)
        self.kernel_initializer = kernel_initializer

    def _conv(self, name, kernel_size, strides=1):
        return keras.layers.Conv2D(
            self.filters,
            kernel_size,
            strides=strides,
            padding="same",
            data_format="channels_last",
            use_bias=False,
            kernel_initializer=keras.initializers.get(self.kernel_initializer),
            kernel_regularizer=self.kernel_regularizer,
            name=name,
            dtype=self.dtype_policy,
        )

    def _norm(self, name, shape):
        norm = keras.layers.BatchNormalization(name=name, dtype=self.dtype_policy)
        norm.build(shape)
        return norm

    def build(self, input_shape):
        input_shape = base.check_channels_last("inputs", input_shape)
        self.conv1 = self._conv("conv1", 3, self.strides)
        self.conv1.build(input_shape)
        out_shape = self.compute_output_shape(input_shape)
        self.norm1 = self._norm("norm1", out_shape)
        self.conv2 = self._conv("conv2", 3)
        self.conv2.build(out_shape)
        self.norm2 = self._norm("norm2", out_shape)
        self.projection = None
        if self.strides != 1 or input_shape[-1] != self.filters:
            self.projection = self._conv("projection", 1, self.strides)
            self.projection.build(input_shape)
            self.projection_norm = self._norm("projection_norm", out_shape)
        self.attention_layer = None
        if self.attention is not None:
            self.attention_layer = registry.build(
                self.attention,
                # The blocks' maps are channels-last, whatever
                # `keras.config.image_data_format()` says.
                {"reduction": default_reduction(self.filters), "kernel_size": 7,
                 "data_format": "channels_last"},
                self.attention_kwargs,
                name="attention",
                dtype=self.dtype_policy,
            )
            build_attention(self.attention_layer, out_shape)
            self._accepted = accepted_call_arguments(self.attention_layer)
        self.built = True

    def call(self, inputs, return_attention_scores=False, training=None):
        x = self.conv1(inputs)
        x = ops.relu(self.norm1(x, training=training))
        x = self.norm2(self.conv2(x), training=training)
        scores = None
        if self.attention_layer is not None:
            x, scores = call_attention(
                self.attention_layer,
                self._accepted,
                x,
                return_attention_scores=return_attention_scores,
                training=training,
            )
        shortcut = inputs
        if self.projection is not None:
            shortcut = self.projection_norm(
                self.projection(inputs), training=training
            )
        outputs = ops.relu(x + shortcut)
        if return_attention_scores:
            return outputs, scores
        return outputs

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        s = self.strides
        return (
            b,
            None if h is None else -(-h // s),
            None if w is None else -(-w // s),
            self.filters,
        )
