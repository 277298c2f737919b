"""A small residual CNN with an attention module in every block (CBAM).

Woo et al., CBAM: Convolutional Block Attention Module, ECCV 2018: the
module refines the residual branch of each ResNet block before the
addition. Here the module is chosen by registry name, so the same network
runs with `"cbam"`, `"channel"` (squeeze-and-excitation-like), `"spatial"`,
`"non_local"` (Wang et al., 2018), any plugin that maps `(B, H, W, C)` to
the same shape, or `None` (the plain ResNet, for ablations).
"""

import keras

from keras_attention import _validation as base
from keras_attention import registry
from keras_attention.applications import base as app_base
from keras_attention.applications import presets
from keras_attention.applications.blocks import ResidualAttentionBlock


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class CBAMResNetBackbone(app_base.ImageBackbone):
    """A small ResNet with attention in every block (Woo et al., 2018).

    A 3x3 stem convolution (batch norm, ReLU), then one stage per entry of
    `filters`, each of `blocks_per_stage` `ResidualAttentionBlock`s (the
    first block of every stage but the first halves the resolution), then
    global average pooling: features `(B, filters[-1])`.

    Args:
        image_size: image side (int) or `(height, width)`.
        num_channels: channels of the images.
        filters: channels of each stage.
        blocks_per_stage: residual blocks per stage (an int or one per
            stage).
        stem_filters: channels of the stem convolution; defaults to
            `filters[0]`.
        stem_strides: stride of the stem convolution (2 halves large
            images before the first stage).
        attention: registry name of the module in every block (`"cbam"`,
            `"channel"`, `"spatial"`, `"non_local"`, a plugin's name), or
            `None` for the plain ResNet.
        attention_kwargs: extra constructor arguments of the module.
        weight_decay: L2 factor on the convolution kernels.

    Call arguments:
        images: `(B, H, W, num_channels)`.

    Returns:
        Features `(B, filters[-1])`.

    Raises:
        ValueError: naming the argument: `image_size`, `num_channels`,
            `stem_strides`, `stem_filters`, `filters` or
            `blocks_per_stage` not positive integers (`filters` empty, or
            `blocks_per_stage` a list of another length); an `attention`
            the registry lacks or that does not refine a feature map;
            `weight_decay` negative; images of another shape than
            `(B, *image_size, num_channels)`.

    Example:

    ```python
    backbone = CBAMResNetBackbone(image_size=8, num_channels=1, filters=(16, 32))
    backbone(np.zeros((2, 8, 8, 1))).shape  # (2, 32)
    maps = backbone.attention_scores(np.zeros((2, 8, 8, 1)))
    maps[0][1].shape  # (2, 8, 8, 1): the spatial map of the first block
    ```

    References:
        - Woo et al., CBAM: Convolutional Block Attention Module, 2018.
          https://arxiv.org/abs/1807.06521
        - He et al., Deep Residual Learning for Image Recognition, 2016.
          https://arxiv.org/abs/1512.03385
    """

    scored_blocks = (ResidualAttentionBlock,)

    def __init__(
        self,
        image_size,
        num_channels=3,
        filters=(32, 64, 128),
        blocks_per_stage=1,
        stem_filters=None,
        stem_strides=1,
        attention="cbam",
        attention_kwargs=None,
        weight_decay=0.0,
        **kwargs,
    ):
        image_size = base.check_pair("image_size", image_size)
        base.check_positive_int("stem_strides", stem_strides)
        base.check_positive_int("num_channels", num_channels)
        filters = list(filters) if isinstance(filters, (list, tuple)) else [filters]
        if not filters:
            raise base.invalid("filters", "a non-empty list of integers", filters)
        for f in filters:
            base.check_positive_int("filters", f)
        if isinstance(blocks_per_stage, (list, tuple)):
            blocks = list(blocks_per_stage)
            if len(blocks) != len(filters):
                raise base.invalid(
                    "blocks_per_stage",
                    f"an integer or {len(filters)} integers (one per stage)",
                    blocks_per_stage,
                )
        else:
            blocks = [blocks_per_stage] * len(filters)
        for b in blocks:
            base.check_positive_int("blocks_per_stage", b)
        stem_filters = base.check_positive_int(
            "stem_filters", stem_filters or filters[0]
        )
        attention = registry.check_name(attention, allow_none=True, kinds=("grid",))
        if isinstance(weight_decay, bool) or not (
            isinstance(weight_decay, (int, float)) and weight_decay >= 0
        ):
            raise base.invalid("weight_decay", "a non-negative float", weight_decay)
        regularizer = keras.regularizers.L2(weight_decay) if weight_decay else None

        inputs = keras.Input(shape=image_size + (num_channels,), name="images")
        x = keras.layers.Conv2D(
            stem_filters,
            3,
            strides=stem_strides,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
            kernel_regularizer=regularizer,
            data_format="channels_last",
            name="stem_conv",
        )(inputs)
        x = keras.layers.BatchNormalization(name="stem_norm")(x)
        x = keras.layers.Activation("relu", name="stem_relu")(x)
        chain = ["stem_conv", "stem_norm", "stem_relu"]
        for stage, (stage_filters, stage_blocks) in enumerate(zip(filters, blocks)):
            for index in range(stage_blocks):
                name = f"block_{stage}_{index}"
                x = ResidualAttentionBlock(
                    stage_filters,
                    strides=2 if stage and not index else 1,
                    attention=attention,
                    attention_kwargs=attention_kwargs,
                    kernel_regularizer=regularizer,
                    name=name,
                )(x)
                chain.append(name)
        outputs = keras.layers.GlobalAveragePooling2D(
            data_format="channels_last", name="pooling"
        )(x)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        self.keep_config(locals())
        self._chain = chain


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class CBAMResNet(app_base.Classifier):
    """Image classifier: a `CBAMResNetBackbone` and a dense head.

    Args:
        image_size: the image side (see `CBAMResNetBackbone`); needed
            unless `backbone` is given.
        num_classes: number of classes.
        backbone: an existing `CBAMResNetBackbone` (fine-tuning).
        **kwargs: the head's `activation` (`None` gives logits) and
            `head_dropout` (see `Classifier`), and the other arguments of
            `CBAMResNetBackbone` (`num_channels`, `filters`, `attention`,
            ...; see it), ignored when `backbone` is given.

    Call arguments:
        images: `(B, H, W, num_channels)`, floats as the model was trained
            on: the digit presets take pixel values in `[0, 1]`
            (`datasets.load_digits_images`); the model does not
            rescale them (divide `uint8` images by 255).

    Returns:
        Logits `(B, num_classes)`.

    Raises:
        ValueError: naming the argument: `num_classes` not a positive
            integer, `head_dropout` outside `[0, 1)`, `backbone` not a
            `CBAMResNetBackbone`, or, without one, the backbone's arguments
            as `CBAMResNetBackbone` checks them (required ones missing too);
            inputs of another shape than the backbone's; in `fit` and
            `evaluate`, labels that are not one class id in `[0,
            num_classes)` per example (checked before anything is traced).

    Example:

    ```python
    model = CBAMResNet(image_size=8, num_channels=1, num_classes=10,
                       filters=(16, 32), attention="cbam")
    model.compile(optimizer="adam")
    model.fit(np.random.rand(16, 8, 8, 1), np.arange(16) % 10, epochs=1)
    plain = CBAMResNet(image_size=8, num_channels=1, num_classes=10,
                       filters=(16, 32), attention=None)  # the ablation
    ```

    References:
        - Woo et al., CBAM: Convolutional Block Attention Module, 2018.
          https://arxiv.org/abs/1807.06521
    """

    backbone_class = CBAMResNetBackbone

    def __init__(self, image_size=None, num_classes=None, backbone=None, **kwargs):
        super().__init__(backbone, num_classes, image_size=image_size, **kwargs)


# The network of the digit presets (CBAM in each of 3 blocks), for one
# image size or another.
_DIGITS_RESNET = dict(
    num_channels=1,
    num_classes=10,
    filters=(32, 64, 128),
    attention="cbam",
)
presets.register_preset(
    "cbam_resnet_digits",
    "CBAMResNet",
    dict(image_size=8, **_DIGITS_RESNET),
    weights="cbam_resnet_digits.weights.h5",
    description="ResNet with CBAM in each of 3 blocks (32, 64, 128 "
    "channels), trained on scikit-learn's 8x8 digits.",
)
presets.register_preset(
    "cbam_resnet_mnist",
    "CBAMResNet",
    dict(image_size=28, stem_strides=2, **_DIGITS_RESNET),
    description="ResNet with CBAM in each of 3 blocks and a strided stem "
    "for 28x28 MNIST digits (configuration only).",
)
