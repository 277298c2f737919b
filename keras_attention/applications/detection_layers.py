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


@keras.saving.register_keras_serializable(package=PACKAGE)
class DETRBackbone(keras.layers.Layer):
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
            use_bias=False, name="stem", dtype=self.dtype_policy,
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

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "blocks_per_stage": self.blocks_per_stage,
                "stem_strides": self.stem_strides,
                "attention_module": self.attention_module,
                "attention_kwargs": self.attention_kwargs,
            }
        )
        return config
