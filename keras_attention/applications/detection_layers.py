"""DETR's building blocks: backbone, position encoding, transformer layers.

Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
`DETR` (in `detection.py`) composes them: `DETRBackbone` (residual blocks,
optionally with any registered attention module in each) turns an image
into a feature grid, `sine_position_encoding` gives every grid cell its
2-D position, and `DETREncoderLayer` / `DETRDecoderLayer` are post-norm
transformer layers whose attention is built by registry name
(`MultiHeadAttention` by default).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention import _validation as base
from keras_attention import registry

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
class ResidualBlock(keras.layers.Layer):
    """A ResNet basic block, with an optional attention module (e.g. CBAM).

    `relu(shortcut(x) + A(bn(conv(relu(bn(conv(x)))))))`, `A` the attention
    module built by name from the registry (identity when `None`), placed on
    the residual branch before the addition as in CBAM-ResNet.
    """

    def __init__(
        self,
        filters,
        strides=1,
        attention_module=None,
        attention_kwargs=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.filters = base.check_positive_int("filters", filters)
        self.strides = base.check_positive_int("strides", strides)
        self.attention_module = attention_module
        self.attention_kwargs = dict(attention_kwargs or {})

    def build(self, input_shape):
        common = {"dtype": self.dtype_policy, "use_bias": False}
        self.conv1 = keras.layers.Conv2D(
            self.filters, 3, self.strides, padding="same", name="conv1",
            **common,
        )
        self.bn1 = keras.layers.BatchNormalization(
            name="bn1", dtype=self.dtype_policy
        )
        self.conv2 = keras.layers.Conv2D(
            self.filters, 3, padding="same", name="conv2", **common
        )
        self.bn2 = keras.layers.BatchNormalization(
            name="bn2", dtype=self.dtype_policy
        )
        self.conv1.build(input_shape)
        out_shape = self.conv1.compute_output_shape(input_shape)
        self.bn1.build(out_shape)
        self.conv2.build(out_shape)
        self.bn2.build(out_shape)
        self.attention = None
        if self.attention_module is not None:
            self.attention = registry.build(
                self.attention_module,
                overrides=self.attention_kwargs,
                name="attention",
                dtype=self.dtype_policy,
            )
            self.attention.build(out_shape)
        self.shortcut = self.shortcut_bn = None
        if self.strides != 1 or input_shape[-1] != self.filters:
            self.shortcut = keras.layers.Conv2D(
                self.filters, 1, self.strides, name="shortcut", **common
            )
            self.shortcut_bn = keras.layers.BatchNormalization(
                name="shortcut_bn", dtype=self.dtype_policy
            )
            self.shortcut.build(input_shape)
            self.shortcut_bn.build(out_shape)

    def call(self, inputs, training=None):
        x = ops.relu(self.bn1(self.conv1(inputs), training=training))
        x = self.bn2(self.conv2(x), training=training)
        if self.attention is not None:
            x = self.attention(x)
        shortcut = inputs
        if self.shortcut is not None:
            shortcut = self.shortcut_bn(
                self.shortcut(inputs), training=training
            )
        return ops.relu(x + shortcut)

    def compute_output_shape(self, input_shape):
        return self.conv1.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "strides": self.strides,
                "attention_module": self.attention_module,
                "attention_kwargs": self.attention_kwargs,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=PACKAGE)
class DETRBackbone(keras.layers.Layer):
    """A small residual CNN: a stem, then one stride-2 stage per filter count.

    `(B, height, width, C) -> (B, height / r, width / r, filters[-1])`,
    `r = stem_strides * 2^s` for `s = len(filters)` stages of
    `blocks_per_stage` `ResidualBlock`s.
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
                block = ResidualBlock(
                    filters,
                    strides=2 if index == 0 else 1,
                    attention_module=self.attention_module,
                    attention_kwargs=self.attention_kwargs,
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


class _TransformerSublayers(keras.layers.Layer):
    """What encoder and decoder layers share: attention, FFN, norms."""

    def __init__(
        self,
        hidden_dim,
        num_heads,
        feedforward_dim,
        dropout=0.0,
        norm_first=False,
        attention="multi_head",
        attention_kwargs=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.feedforward_dim = feedforward_dim
        self.dropout = dropout
        self.norm_first = norm_first
        self.attention = attention
        self.attention_kwargs = dict(attention_kwargs or {})

    def _attention(self, name):
        return registry.build(
            self.attention,
            {
                "num_heads": self.num_heads,
                "key_dim": self.hidden_dim // self.num_heads,
                "dropout": self.dropout,
            },
            self.attention_kwargs,
            name=name,
            dtype=self.dtype_policy,
        )

    def _norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=1e-5, name=name, dtype=self.dtype_policy
        )

    def _build_ffn(self, shape):
        self.ffn_in = keras.layers.Dense(
            self.feedforward_dim, activation="relu", name="ffn_in",
            dtype=self.dtype_policy,
        )
        self.ffn_out = keras.layers.Dense(
            self.hidden_dim, name="ffn_out", dtype=self.dtype_policy
        )
        self.ffn_in.build(shape)
        self.ffn_out.build(tuple(shape[:-1]) + (self.feedforward_dim,))
        self.drop = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _residual(self, x, branch, norm, training):
        """Post-norm `norm(x + f(x))` or pre-norm `x + f(norm(x))`."""
        if self.norm_first:
            return x + self.drop(branch(norm(x)), training=training)
        return norm(x + self.drop(branch(x), training=training))

    def _ffn(self, x, training):
        return self.ffn_out(self.drop(self.ffn_in(x), training=training))

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "feedforward_dim": self.feedforward_dim,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "attention": self.attention,
                "attention_kwargs": self.attention_kwargs,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=PACKAGE)
class DETREncoderLayer(_TransformerSublayers):
    """Self-attention over the grid (positions added to q and k), FFN."""

    def build(self, input_shape):
        self.self_attention = self._attention("self_attention")
        self.self_attention.build(input_shape, input_shape, input_shape)
        self.norm1 = self._norm("norm1")
        self.norm2 = self._norm("norm2")
        self.norm1.build(input_shape)
        self.norm2.build(input_shape)
        self._build_ffn(input_shape)

    def call(self, inputs, position, training=None):
        def attend(x):
            q = x + position
            return self.self_attention(q, value=x, key=q, training=training)

        x = self._residual(inputs, attend, self.norm1, training)
        return self._residual(
            x, lambda y: self._ffn(y, training), self.norm2, training
        )


@keras.saving.register_keras_serializable(package=PACKAGE)
class DETRDecoderLayer(_TransformerSublayers):
    """Self-attention of the queries, cross-attention to the image, FFN."""

    def build(self, input_shape, memory_shape=None):
        memory_shape = memory_shape or input_shape
        self.self_attention = self._attention("self_attention")
        self.self_attention.build(input_shape, input_shape, input_shape)
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention.build(input_shape, memory_shape, memory_shape)
        self.norm1 = self._norm("norm1")
        self.norm2 = self._norm("norm2")
        self.norm3 = self._norm("norm3")
        for norm in (self.norm1, self.norm2, self.norm3):
            norm.build(input_shape)
        self._build_ffn(input_shape)

    def call(
        self,
        inputs,
        memory,
        position,
        query_position,
        training=None,
        return_attention_scores=False,
    ):
        def self_attend(x):
            q = x + query_position
            return self.self_attention(q, value=x, key=q, training=training)

        weights = []

        def cross_attend(x):
            result = self.cross_attention(
                x + query_position,
                value=memory,
                key=memory + position,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                weights.append(result[1])  # B, H, N, S
                return result[0]
            return result

        x = self._residual(inputs, self_attend, self.norm1, training)
        x = self._residual(x, cross_attend, self.norm2, training)
        x = self._residual(
            x, lambda y: self._ffn(y, training), self.norm3, training
        )
        if return_attention_scores:
            return x, weights[0]
        return x
