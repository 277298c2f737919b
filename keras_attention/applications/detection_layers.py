"""DETR's own parts: the convolutional backbone and the position encoding.

Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
`DETR` (in `detection.py`) composes them with the shared blocks of
`blocks.py`: `DETRBackbone` (`ResidualAttentionBlock`s, optionally with any
registered grid attention in each) turns an image into a feature grid,
`sine_position_encoding` gives every grid cell its 2-D position, and
post-norm `TransformerEncoderBlock` / `TransformerDecoderBlock`s attend.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention import _validation as base
from keras_attention.applications.blocks import ResidualAttentionBlock
from keras_attention._config import ArgumentConfig

PACKAGE = "keras_attention"


def sine_position_encoding(height, width, dim, temperature=10000.0):
    """DETR's 2-D sine position encoding of an `height x width` grid.

    Half the channels encode the row, half the column: for position `p`
    normalised to `(0, 2 pi]` and channel pair `k`,
    `sin(p / t^(2k / (D/2)))`, `cos(p / t^(2k / (D/2)))`.

    Args:
        height, width: the grid size.
        dim: `D`, a multiple of 4.
        temperature: `t`.

    Returns:
        float32 NumPy array `(height * width, dim)`, rows in row-major order.
    """
    if dim % 4:
        raise base.invalid("hidden_dim", "a multiple of 4", dim)
    half = dim // 2
    rows = (np.arange(height, dtype="float64") + 1) / height * 2 * math.pi
    cols = (np.arange(width, dtype="float64") + 1) / width * 2 * math.pi
    freq = temperature ** (2 * (np.arange(half) // 2) / half)

    def encode(positions):
        angles = positions[:, None] / freq  # P, D/2
        out = np.empty_like(angles)
        out[:, 0::2] = np.sin(angles[:, 0::2])
        out[:, 1::2] = np.cos(angles[:, 1::2])
        return out

    pos_y = np.repeat(encode(rows), width, axis=0)  # S, D/2
    pos_x = np.tile(encode(cols), (height, 1))
    return np.concatenate([pos_y, pos_x], axis=1).astype("float32")


def _sine_channels(positions, dim, temperature):
    # positions (..., P) scaled to (0, 2 pi] -> (..., P, dim / 2): sin on
    # even channels, cos on odd ones, channel pairs sharing a frequency.
    half = dim // 2
    freq = temperature ** (2 * (np.arange(half) // 2) / half)
    angles = positions[..., None] / ops.cast(freq, positions.dtype)
    even = np.arange(half) % 2 == 0
    return ops.where(even, ops.sin(angles), ops.cos(angles))


def masked_sine_position_encoding(mask, dim, temperature=10000.0):
    """DETR's sine encoding of padded images: positions count valid cells.

    As Hugging Face's `DetrSinePositionEmbedding(normalize=True)`: the row
    (column) position of a cell is the number of valid cells above (left
    of) it, inclusive, over the valid cells of its column (row) plus 1e-6,
    times 2 pi; the channels are those of `sine_position_encoding`.

    Args:
        mask: `(B, h, w)`, true (or 1) on the image, false on padding.
        dim: `D`, a multiple of 4.
        temperature: `t`.

    Returns:
        float32 `(B, h * w, dim)`.
    """
    if dim % 4:
        raise base.invalid("hidden_dim", "a multiple of 4", dim)
    mask = ops.cast(mask, "float32")
    rows = ops.cumsum(mask, axis=1)
    cols = ops.cumsum(mask, axis=2)
    rows = rows / (rows[:, -1:, :] + 1e-6) * (2 * math.pi)
    cols = cols / (cols[:, :, -1:] + 1e-6) * (2 * math.pi)
    encoded = ops.concatenate(
        [_sine_channels(rows, dim, temperature),
         _sine_channels(cols, dim, temperature)],
        axis=-1,
    )  # B, h, w, D
    height, width = mask.shape[1], mask.shape[2]
    return ops.reshape(encoded, (-1, height * width, dim))


def resize_mask(pixel_mask, size):
    """`(B, H, W)` pixel mask -> boolean `(B, h, w)`, nearest pixel.

    PyTorch's `interpolate(mode="nearest")`: cell `i` reads pixel
    `floor(i * H / h)`.
    """
    indices = []
    for length, out in zip(pixel_mask.shape[1:3], size):
        if length is None:
            raise ValueError(
                "Received an invalid value for argument `pixel_mask`, "
                "expected a known height and width. Received: "
                f"pixel_mask.shape={tuple(pixel_mask.shape)}"
            )
        scale = np.float32(length / out)
        step = np.floor(np.arange(out, dtype="float32") * scale)
        indices.append(np.minimum(step, length - 1).astype("int32"))
    mask = ops.take(pixel_mask, indices[0], axis=1)
    return ops.cast(ops.take(mask, indices[1], axis=2), "bool")


def image_sizes(pixel_mask, images):
    """`(mask, sizes)` of a padded batch: its `pixel_mask` `(B, H, W)` as a
    NumPy array, and each image's `(height, width)` inside it `(B, 2)`
    (the rows and the columns that hold a 1); `(None, None)` without one.
    """
    if pixel_mask is None:
        return None, None
    mask = np.asarray(ops.convert_to_numpy(pixel_mask))
    if mask.shape != tuple(images.shape[:3]):
        raise ValueError(
            "Received an invalid value for argument `pixel_mask`, expected "
            f"shape {tuple(images.shape[:3])} (B, height, width) like the "
            f"images. Received: pixel_mask.shape={mask.shape}"
        )
    valid = mask != 0
    sizes = np.stack([valid.any(axis=2).sum(1), valid.any(axis=1).sum(1)], -1)
    empty = np.flatnonzero(sizes.min(axis=1) == 0)
    if len(empty):
        raise ValueError(
            "Received an invalid value for argument `pixel_mask`, expected "
            "1 on each image's pixels. Received: no pixel of image "
            f"{int(empty[0])}"
        )
    return valid.astype("float32"), sizes.astype("float32")


def feature_positions(pixel_mask, images, height, width, dim):
    """`(mask (B, h * w) or None, positions (B or 1, h * w, D))` of DETR.

    Without a `pixel_mask` every cell is valid (the positions are
    constants); with one, `(B, H, W)` true on the image, they count the
    valid cells only and padded cells are masked as keys.
    """
    if pixel_mask is None:
        return None, sine_position_encoding(height, width, dim)[None]
    if tuple(pixel_mask.shape[1:]) != tuple(images.shape[1:3]):
        raise ValueError(
            "Received an invalid value for argument `pixel_mask`, expected "
            f"shape (B, {images.shape[1]}, {images.shape[2]}) like the "
            f"images. Received: pixel_mask.shape={tuple(pixel_mask.shape)}"
        )
    mask = resize_mask(pixel_mask, (height, width))
    positions = masked_sine_position_encoding(mask, dim)
    return ops.reshape(mask, (-1, height * width)), positions


@keras.saving.register_keras_serializable(package=PACKAGE)
class DETRBackbone(ArgumentConfig, keras.layers.Layer):
    """A small residual CNN: a stem, then one stride-2 stage per filter count.

    `(B, height, width, C) -> (B, height / r, width / r, filters[-1])`,
    `r = stem_strides * 2^s` for `s = len(filters)` stages of
    `blocks_per_stage` `ResidualAttentionBlock`s.
    """

    def __init__(
        self,
        filters=(32, 64, 96),
        blocks_per_stage=1,
        stem_strides=1,
        attention_module=None,
        attention_kwargs=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        filters = tuple(filters)
        if not filters:
            raise base.invalid(
                "backbone_filters", "a non-empty tuple of positive integers",
                filters,
            )
        for f in filters:
            base.check_positive_int("backbone_filters", f)
        self.filters = filters
        self.blocks_per_stage = base.check_positive_int(
            "blocks_per_stage", blocks_per_stage
        )
        self.stem_strides = base.check_positive_int(
            "stem_strides", stem_strides
        )
        self.attention_module = attention_module
        self.attention_kwargs = dict(attention_kwargs or {})

    def build(self, input_shape):
        self.stem = keras.layers.Conv2D(
            self.filters[0], 3, self.stem_strides, padding="same",
            use_bias=False, name="stem", data_format="channels_last",
            dtype=self.dtype_policy,
        )
        self.stem_bn = keras.layers.BatchNormalization(
            name="stem_bn", dtype=self.dtype_policy
        )
        self.stem.build(input_shape)
        shape = self.stem.compute_output_shape(input_shape)
        self.stem_bn.build(shape)
        self.blocks = []
        for stage, filters in enumerate(self.filters):
            for index in range(self.blocks_per_stage):
                block = ResidualAttentionBlock(
                    filters,
                    strides=2 if index == 0 else 1,
                    attention=self.attention_module,
                    attention_kwargs=self.attention_kwargs,
                    kernel_initializer="glorot_uniform",
                    name=f"stage{stage}_block{index}",
                    dtype=self.dtype_policy,
                )
                block.build(shape)
                shape = block.compute_output_shape(shape)
                self.blocks.append(block)

    def call(self, inputs, training=None):
        x = ops.relu(self.stem_bn(self.stem(inputs), training=training))
        for block in self.blocks:
            x = block(x, training=training)
        return x

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        for strides in (self.stem_strides,) + (2,) * len(self.filters):
            for axis in (1, 2):
                if shape[axis] is not None:
                    shape[axis] = -(-shape[axis] // strides)
        shape[-1] = self.filters[-1]
        return tuple(shape)
