"""What the attention layers over channels-last feature maps `(B, ..., C)`
share (CBAM's layers, `NonLocalBlock`): input and mask checks, their
`Dense` projections, shapes and specs."""

import keras
from keras import ops

from keras_attention._validation import invalid
from keras_attention.layers import base

# Masked positions never win a max-pool (float32 or float64 pooling only).
NEG_INF = -1e30


def standardize_data_format(data_format):
    """`data_format` as Keras reads it: `None` is
    `keras.config.image_data_format()`; else `"channels_last"` or
    `"channels_first"` (a `ValueError` naming the argument otherwise)."""
    if data_format is None:
        return keras.config.image_data_format()
    if data_format not in ("channels_last", "channels_first"):
        raise invalid(
            "data_format", '"channels_last", "channels_first" or None', data_format
        )
    return data_format


def check_feature_map(shape, min_rank=3, max_rank=None,
                      data_format="channels_last"):
    """Raise the keras-worded error for a feature map of the wrong rank, or
    of unknown channels; `shape` as given, in `data_format`."""
    rank = len(shape)
    first = data_format == "channels_first"
    if rank < min_rank or (max_rank is not None and rank > max_rank):
        expected = (
            f"a tensor of rank {min_rank} or more "
            + ("(B, C, ...)" if first else "(B, ..., C)")
            if max_rank is None
            else "a rank-3, 4 or 5 tensor "
            + ("(B, C, L), (B, C, H, W) or (B, C, D, H, W)" if first
               else "(B, L, C), (B, H, W, C) or (B, D, H, W, C)")
        )
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected "
            f"{expected}. Received: inputs.shape={tuple(shape)}"
        )
    if shape[1 if first else -1] is None:
        raise ValueError(
            f"The channel ({'first' if first else 'last'}) dimension of "
            f"`inputs` must be known (data_format={data_format!r}). "
            f"Received: inputs.shape={tuple(shape)}"
        )


def check_position_mask(mask, inputs):
    """A Keras mask of the positions, `(B, ...)` = `inputs.shape[:-1]`."""
    if mask is None:
        return None
    base.check_mask_shape(
        "mask", mask, tuple(inputs.shape[:-1]), " (the positions of `inputs`)"
    )
    return ops.cast(mask, "bool")


class FeatureMapAttention(
    base.ProjectionMixin, base.TracedOutputSpec, keras.layers.Layer
):
    """Base of a layer that refines a feature map `(B, ..., C)`: its output
    has the input's shape and positions (so its Keras mask).

    Every such layer (CBAM's, the non-local block) takes these arguments of
    its projections' and convolutions' weights, as keras's `Conv2D` does:
    `use_bias`, `kernel_initializer`, `bias_initializer`,
    `kernel_regularizer`, `bias_regularizer`; a subclass passes them on
    with `**kwargs` and its config holds them (`ArgumentConfig`).

    Integer inputs (a `uint8` image) are refined in the compute dtype
    (`float_inputs`): the output is a float map."""

    # The largest rank of the inputs (`None`: any): 1-, 2- or 3-D maps.
    _max_rank = 5
    # Whether the weights fix the rank (a convolution's kernel) or any
    # rank of map with the same channels goes (1x1 projections only).
    _rank_fixed_at_build = False

    def __init__(
        self,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.supports_masking = True
        base.keep_weight_arguments(self, locals())
        self.data_format = standardize_data_format(data_format)

    # `data_format="channels_first"` (or Keras's global setting, as for its
    # own `Conv2D`): the map is `(B, C, ...)`; the layers compute on the
    # channels-last map, moved there and back (`to_last`, `from_last`).

    def last_shape(self, shape):
        """`shape` of a map with its channels last."""
        shape = tuple(shape)
        if self.data_format == "channels_first" and len(shape) > 2:
            return shape[:1] + shape[2:] + shape[1:2]
        return shape

    def to_last(self, x):
        """The map `x` with its channels last."""
        if self.data_format == "channels_first":
            return ops.moveaxis(x, 1, -1)
        return x

    def from_last(self, x):
        """A channels-last map (the output, a spatial map) in this layer's
        data format."""
        if self.data_format == "channels_first":
            return ops.moveaxis(x, -1, 1)
        return x

    def _dense(self, name, units, input_dim, kernel_initializer=None):
        """A built `keras.layers.Dense` projection on the channels (a 1x1
        convolution; LoRA, quantization, keras weight files)."""
        dense = keras.layers.Dense(
            units, **base.sublayer_kwargs(self, name, kernel_initializer)
        )
        dense.build((None, input_dim))
        return dense

    def check_build_shape(self, input_shape):
        """`build`'s check of the map's rank and channels, kept for every
        later call as keras's `input_spec` (as keras's `Conv2D` does): a
        built layer given a map of another rank or channel count raises
        keras's error naming the layer, not a wrong-shaped result."""
        check_feature_map(
            input_shape, max_rank=self._max_rank, data_format=self.data_format
        )
        channel_axis = 1 if self.data_format == "channels_first" else -1
        channels = {channel_axis: int(self.last_shape(input_shape)[-1])}
        if self._rank_fixed_at_build:
            self.input_spec = keras.InputSpec(ndim=len(input_shape), axes=channels)
        else:
            self.input_spec = keras.InputSpec(
                min_ndim=3, max_ndim=self._max_rank, axes=channels
            )

    def compute_mask(self, inputs, mask=None):
        # The refined map is aligned with the input: same positions.
        return mask

    def compute_output_shape(self, input_shape):
        check_feature_map(
            input_shape, max_rank=self._max_rank, data_format=self.data_format
        )
        return tuple(input_shape)
