"""The ResNet backbone of the published DETR models, with frozen batch norm.

He et al., Deep Residual Learning for Image Recognition, CVPR 2016, in the
layout torchvision and timm give it (stride in the 3x3 convolution of a
bottleneck, "ResNet v1.5") and with DETR's frozen batch norm: the statistics
and affine parameters never change, and every convolution pads as PyTorch
does (symmetrically), so checkpoints of `DetrForObjectDetection` load
exactly (`DETR.from_transformers`).
"""

import keras
from keras import ops

from keras_attention import _validation as base
from keras_attention.applications.detection_layers import DETRBackbone
from keras_attention._config import ArgumentConfig
from keras_attention.ops.shapes import pad

PACKAGE = "keras_attention"

BLOCK_KINDS = ("basic", "bottleneck")


def _pad(x, amount):
    # PyTorch's symmetric zero padding, (B, H, W, C).
    if not amount:
        return x
    return pad(x, ((0, 0), (amount, amount), (amount, amount), (0, 0)))


def check_resnet_depths(depths, argument="resnet_depths"):
    """`depths` as a tuple of positive ints, or a `ValueError` naming it."""
    try:
        values = tuple(depths)
    except TypeError:
        values = ()
    if not values or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in values
    ):
        raise base.invalid(
            argument, "a non-empty tuple of positive integers", depths
        )
    return values


@keras.saving.register_keras_serializable(package=PACKAGE)
class ResNetBackbone(ArgumentConfig, keras.layers.Layer):
    """ResNet-18/34/50/101/152 (He, 2016) with frozen batch norm, DETR's backbone.

    A 7x7 stride-2 stem, a 3x3 stride-2 max pool, then one stage per entry
    of `depths` (the first block of every stage after the first has stride
    2); `(B, height, width, C) -> (B, ~height / 32, ~width / 32, filters)`,
    `filters = width * 2^(stages - 1) * (4 for bottleneck blocks)`. Batch
    norm always runs on its stored statistics (`training` does not change
    them) and its scale and shift are not trainable, as in DETR.

    Args:
        depths: blocks per stage: `(2, 2, 2, 2)` ResNet-18, `(3, 4, 6, 3)`
            ResNet-34 (basic) or ResNet-50 (bottleneck), `(3, 4, 23, 3)`
            ResNet-101, `(3, 8, 36, 3)` ResNet-152.
        block: `"bottleneck"` (1x1, 3x3, 1x1, four times wider out) or
            `"basic"` (two 3x3).
        width: channels of the stem and of the first stage's 3x3
            convolutions.
        batch_norm_epsilon: the batch norm epsilon (DETR: 1e-5).

    Example:

    ```python
    backbone = ResNetBackbone(depths=(2, 2, 2, 2), block="basic")
    backbone(np.zeros((1, 64, 64, 3))).shape  # (1, 2, 2, 512)
    ```

    References:
        - He et al., Deep Residual Learning for Image Recognition, 2016.
          https://arxiv.org/abs/1512.03385
    """

    def __init__(
        self,
        depths=(3, 4, 6, 3),
        block="bottleneck",
        width=64,
        batch_norm_epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.depths = check_resnet_depths(depths, "depths")
        if block not in BLOCK_KINDS:
            raise base.invalid("block", f"one of {BLOCK_KINDS}", block)
        self.block = block
        self.width = base.check_positive_int("width", width)
        if not isinstance(batch_norm_epsilon, (int, float)) or not (
            batch_norm_epsilon > 0
        ):
            raise base.invalid(
                "batch_norm_epsilon", "a positive number", batch_norm_epsilon
            )
        self.batch_norm_epsilon = float(batch_norm_epsilon)
        self.expansion = 4 if block == "bottleneck" else 1

    @property
    def output_channels(self):
        return self.width * 2 ** (len(self.depths) - 1) * self.expansion

    def _conv(self, key, filters, size, strides, shape):
        """Builds one convolution and its batch norm; the output shape."""
        name = "_".join(str(part) for part in key)
        conv = keras.layers.Conv2D(
            filters, size, strides, use_bias=False, name=name,
            data_format="channels_last", dtype=self.dtype_policy,
        )
        padded = list(shape)
        for axis in (1, 2):
            if padded[axis] is not None:
                padded[axis] += 2 * (size // 2)
        conv.build(tuple(padded))
        norm = keras.layers.BatchNormalization(
            epsilon=self.batch_norm_epsilon, name=name + "_bn",
            trainable=False, dtype=self.dtype_policy,
        )
        out = conv.compute_output_shape(tuple(padded))
        norm.build(out)
        self.convs.append(conv)
        self.norms.append(norm)
        self._keys.append(key)
        return out

    def build(self, input_shape):
        # Flat lists of layers (Keras tracks them), and per block the
        # indices of its convolutions and of its shortcut (-1: identity).
        self.convs, self.norms, self._keys, self._blocks = [], [], [], []
        shape = self._pool_shape(self._conv(("stem",), self.width, 7, 2, input_shape))
        channels = self.width
        for stage, depth in enumerate(self.depths):
            filters = self.width * 2**stage
            for index in range(depth):
                strides = 2 if stage and not index else 1
                if self.block == "bottleneck":
                    specs = [(filters, 1, 1), (filters, 3, strides),
                             (filters * 4, 1, 1)]
                else:
                    specs = [(filters, 3, strides), (filters, 3, 1)]
                first = len(self.convs)
                block_shape = shape
                for position, (out, size, step) in enumerate(specs):
                    block_shape = self._conv(
                        (f"stage{stage}", f"block{index}", f"conv{position + 1}"),
                        out, size, step, block_shape,
                    )
                convs = list(range(first, len(self.convs)))
                shortcut = -1
                if strides != 1 or channels != filters * self.expansion:
                    shortcut = len(self.convs)
                    self._conv(
                        (f"stage{stage}", f"block{index}", "downsample"),
                        filters * self.expansion, 1, strides, shape,
                    )
                self._blocks.append((convs, shortcut))
                shape = block_shape
                channels = filters * self.expansion
        self.built = True

    def named_units(self):
        """`[(key, conv, batch_norm)]` in order: key `("stem",)` or
        `("stage<s>", "block<i>", "conv<k>" | "downsample")`."""
        return list(zip(self._keys, self.convs, self.norms))

    @staticmethod
    def _pool_shape(shape):
        shape = list(shape)
        for axis in (1, 2):
            if shape[axis] is not None:
                shape[axis] = (shape[axis] + 2 - 3) // 2 + 1
        return tuple(shape)

    def _apply(self, unit, x):
        conv = self.convs[unit]
        padding = conv.kernel_size[0] // 2
        return self.norms[unit](conv(_pad(x, padding)), training=False)

    def call(self, inputs, training=None):
        # `training` is ignored: the batch norm is frozen.
        x = ops.relu(self._apply(0, inputs))
        # Zero padding equals PyTorch's -inf padding after a ReLU.
        x = ops.max_pool(
            _pad(x, 1), 3, 2, padding="valid", data_format="channels_last"
        )
        for convs, shortcut in self._blocks:
            h = x
            for position, unit in enumerate(convs):
                h = self._apply(unit, h)
                if position < len(convs) - 1:
                    h = ops.relu(h)
            skip = x if shortcut < 0 else self._apply(shortcut, x)
            x = ops.relu(h + skip)
        return x

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        for axis in (1, 2):
            size = shape[axis]
            if size is not None:
                size = (size + 6 - 7) // 2 + 1  # stem
                size = (size + 2 - 3) // 2 + 1  # max pool
                for _ in self.depths[1:]:
                    size = (size + 2 - 3) // 2 + 1
                shape[axis] = size
        shape[-1] = self.output_channels
        return tuple(shape)


BACKBONE_TYPES = ("small", "resnet")


def check_backbone_options(backbone_type, resnet_depths, resnet_block):
    """DETR's backbone arguments, checked: `(type, depths, block)`."""
    if backbone_type not in BACKBONE_TYPES:
        raise base.invalid(
            "backbone_type", f"one of {BACKBONE_TYPES}", backbone_type
        )
    if resnet_block not in BLOCK_KINDS:
        raise base.invalid("resnet_block", f"one of {BLOCK_KINDS}", resnet_block)
    return backbone_type, check_resnet_depths(resnet_depths), resnet_block


def make_backbone(model):
    """The backbone layer of a `DETR` from its arguments."""
    if model.backbone_type == "resnet":
        return ResNetBackbone(
            model.resnet_depths, model.resnet_block, name="backbone",
            dtype=model.dtype_policy,
        )
    return DETRBackbone(
        model.backbone_filters,
        blocks_per_stage=model.blocks_per_stage,
        stem_strides=model.stem_strides,
        attention_module=model.attention_module,
        attention_kwargs=model.attention_kwargs,
        name="backbone",
        dtype=model.dtype_policy,
    )
