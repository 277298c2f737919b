"""DETR: object detection as set prediction with transformers.

Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.

A small residual CNN (optionally with a grid attention such as CBAM in every
block) turns an image into a grid of features; a transformer encoder (the
shared `TransformerEncoderBlock`, attention by registry name) refines them
with 2-D sine position encodings; a decoder turns `num_queries` learned
object queries into `num_queries` predictions, each a class (or "no
object") and a box. Training matches predictions to the ground-truth
objects one-to-one (exact Hungarian matching, inside the compiled train
step) and applies `detection_loss.set_prediction_loss` to the output of
every decoder layer. The backbone is in `detection_layers.py`, the loss,
`fit` and target checks in `detection_training.py`, the decoding of outputs
and the COCO evaluation in `detection_metrics.py`.

Shape letters: `B` images, `N` object queries, `M` ground-truth objects
(padded), `K` classes, `L` decoder layers, `h, w` the feature grid,
`S = h * w`, `H` attention heads, `D` model width.
"""

import keras
import numpy as np
from keras import ops

from keras_attention._validation import check_bool
from keras_attention import _validation as base
from keras_attention import registry
from keras_attention.layers.base import float_inputs
from keras_attention.applications import detection_loss
from keras_attention.applications import presets
from keras_attention.applications.base import PresetMixin
from keras_attention.applications.base import QuickQuantize
from keras_attention._config import ArgumentConfig
from keras_attention._config import FreezesSublayers
from keras_attention._config import QUANTIZED_LAYERS
from keras_attention._config import build_with_frozen_layers
from keras_attention._config import graph_state_config
from keras_attention._config import requantize
from keras_attention.applications.blocks import TransformerDecoderBlock
from keras_attention.applications.blocks import TransformerEncoderBlock
from keras_attention.applications.detection_training import DETRTraining
from keras_attention.applications.converters.detr import DETRConverters
from keras_attention.applications.detection_layers import feature_positions
from keras_attention.applications.detection_layers import image_sizes
from keras_attention.applications.detection_resnet import check_backbone_options
from keras_attention.applications.detection_resnet import make_backbone
from keras_attention.applications.detection_metrics import decode_detections

PACKAGE = "keras_attention"


def _check_widths(hidden_dim, num_heads, num_encoder_layers):
    if hidden_dim % 4:
        raise base.invalid("hidden_dim", "a multiple of 4", hidden_dim)
    if hidden_dim % num_heads:
        raise base.invalid(
            "hidden_dim", f"a multiple of num_heads={num_heads}", hidden_dim
        )
    if (
        isinstance(num_encoder_layers, bool)
        or not isinstance(num_encoder_layers, int)
        or num_encoder_layers < 0
    ):
        raise base.invalid(
            "num_encoder_layers", "a non-negative integer", num_encoder_layers
        )


@keras.saving.register_keras_serializable(package=PACKAGE)
class DETR(
    ArgumentConfig, PresetMixin, DETRConverters, DETRTraining, QuickQuantize,
    FreezesSublayers, keras.Model,
):
    """DETR: end-to-end object detection with transformers (Carion, 2020).

    `backbone -> 1x1 projection to D -> encoder (self-attention with 2-D
    sine positions) -> decoder (N learned object queries, cross-attention
    to the encoded grid) -> per query: class logits (K + 1, the last "no
    object") and a box (sigmoid, normalised cx, cy, w, h)`. The heads are
    applied to every decoder layer; the earlier layers' outputs feed the
    auxiliary losses.

    `fit` takes `y = {"boxes": (B, M, 4), "labels": (B, M)}`, normalised
    `(cx, cy, w, h)` boxes and class ids, padded with label -1 (the layout
    of `keras_attention.datasets.make_detection_set`); NumPy targets are
    checked by `validate_targets` first. `compute_loss` matches predictions
    to targets with an exact Hungarian assignment inside the compiled train
    step (it works with `jit_compile=True`) and returns DETR's loss
    (`detection_loss.set_prediction_loss`) summed over decoder layers.
    Targets that reach the loss unchecked (a `tf.data` pipeline) are
    sanitised there: invalid labels and non-finite boxes count as padding,
    boxes are clipped to the image (their corners).

    Under a `tf.distribute` strategy each replica's loss is divided by the
    number of replicas (their gradients are summed), as Keras's losses are.
    Boxes and "no object" weights are counted per replica, and batch norm
    uses each replica's share of the batch unless its layers are set to
    `synchronized=True`; with both, and replicas holding as many boxes as
    each other, training matches one device (`tests/test_distributed.py`).

    Args:
        num_classes: `K`, the number of object classes.
        num_queries: `N`, object queries = most objects per image.
        hidden_dim: `D`, the transformer width (a multiple of 4 and of
            `num_heads`).
        num_heads: attention heads `H`.
        num_encoder_layers: encoder depth (0 allowed).
        num_decoder_layers: decoder depth `L >= 1`.
        feedforward_dim: width of the transformer FFNs.
        dropout: dropout in the transformer.
        norm_first: pre-norm transformer layers (`False`: DETR's post-norm).
        backbone_type: `"small"` (a small residual CNN, the arguments
            below) or `"resnet"` (`ResNetBackbone`, the published DETRs'
            ResNet with frozen batch norm; grid: image size / 32).
        resnet_depths: blocks per ResNet stage (`(3, 4, 6, 3)`: ResNet-50).
        resnet_block: `"bottleneck"` (ResNet-50 and deeper) or `"basic"`.
        backbone_filters: filters of the backbone's stride-2 stages; the
            feature grid is the image size over
            `stem_strides * 2 ** len(backbone_filters)`.
        blocks_per_stage: residual blocks per backbone stage.
        stem_strides: strides of the backbone's first convolution.
        attention_module: registry name of an attention module for every
            backbone block (e.g. `"cbam"`), or `None`.
        attention_kwargs: its constructor arguments.
        transformer_attention: registry name of the attention layer of the
            encoder and decoder layers (a `"tokens"` layer taking `query`,
            `value` and `key`); offered `num_heads`, `key_dim`, `dropout`.
        transformer_attention_kwargs: its extra constructor arguments.
        aux_loss: add the losses of the earlier decoder layers.
        loss_settings: a dict of the loss's settings to change from DETR's
            (`detection_loss.LOSS_DEFAULTS`): `eos_coef` (weight of the "no
            object" class in the class loss, 0.1), `class_loss_weight`,
            `bbox_loss_weight`, `giou_loss_weight` (1, 5, 2), and the
            matching cost's `class_cost`, `bbox_cost`, `giou_cost` (1, 5, 2).
            The model keeps all seven in `loss_settings`.

    Call arguments:
        images: `(B, height, width, C)`.
        pixel_mask: optional `(B, height, width)`, 1 on the image and 0 on
            padding (Hugging Face's `pixel_mask`): padded feature cells are
            masked as keys and positions count the valid cells only.
        training: whether batch norm and dropout train.
        return_attention_scores: also return the last decoder layer's
            cross-attention.

    Returns:
        A dict: `"logits"` `(B, N, K + 1)`, `"boxes"` `(B, N, 4)`; with
        `aux_loss` and `L > 1` also `"aux_logits"` `(B, L - 1, N, K + 1)` and
        `"aux_boxes"` `(B, L - 1, N, 4)`; with `return_attention_scores`,
        `"cross_attention"` `(B, H, N, h, w)`.

    Raises:
        ValueError: naming the argument: sizes and layer counts not
            positive integers (`num_encoder_layers` may be 0),
            `hidden_dim` not a multiple of 4 and of `num_heads`;
            `dropout` outside `[0, 1)`; backbone options or loss weights
            not one of theirs; `attention_module` or
            `transformer_attention` not a registered layer of the right
            kind; images not `(B, height, width, channels)` with known
            sizes; in `fit` and `evaluate`, targets that are not
            `{"boxes": (B, M, 4), "labels": (B, M)}` with a known `M` of
            at most `num_queries`, or a `sample_weight`.

    Example:

    ```python
    from keras_attention.datasets import make_detection_set
    data = make_detection_set(64, image_size=32, max_objects=3)
    model = DETR(num_classes=10, num_queries=5, hidden_dim=32,
                 backbone_filters=(16, 32))
    model.compile(optimizer="adam")  # XLA on TensorFlow and JAX
    model.fit(data.images, {"boxes": data.boxes, "labels": data.labels},
              epochs=1, batch_size=16)
    detections = model.predict_boxes(data.images[:2], score_threshold=0.5)
    detections[0]["boxes"]  # (k, 4) pixels x1, y1, x2, y2
    ```

    References:
        - Carion et al., End-to-End Object Detection with Transformers, 2020.
          https://arxiv.org/abs/2005.12872
        - Rezatofighi et al., Generalized Intersection over Union, 2019.
          https://arxiv.org/abs/1902.09630
    """

    def __init__(
        self,
        num_classes,
        num_queries=10,
        hidden_dim=64,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        feedforward_dim=128,
        dropout=0.0,
        norm_first=False,
        backbone_type="small",
        resnet_depths=(3, 4, 6, 3),
        resnet_block="bottleneck",
        backbone_filters=(32, 64, 96),
        blocks_per_stage=1,
        stem_strides=1,
        attention_module=None,
        attention_kwargs=None,
        transformer_attention="multi_head",
        transformer_attention_kwargs=None,
        aux_loss=True,
        loss_settings=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_classes = base.check_positive_int("num_classes", num_classes)
        self.num_queries = base.check_positive_int("num_queries", num_queries)
        self.hidden_dim = base.check_positive_int("hidden_dim", hidden_dim)
        self.num_heads = base.check_positive_int("num_heads", num_heads)
        _check_widths(hidden_dim, num_heads, num_encoder_layers)
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = base.check_positive_int(
            "num_decoder_layers", num_decoder_layers
        )
        self.feedforward_dim = base.check_positive_int(
            "feedforward_dim", feedforward_dim
        )
        self.dropout = base.check_rate("dropout", dropout)
        self.norm_first = check_bool("norm_first", norm_first)
        self.backbone_type, self.resnet_depths, self.resnet_block = (
            check_backbone_options(backbone_type, resnet_depths, resnet_block)
        )
        self.backbone_filters = tuple(backbone_filters)
        self.blocks_per_stage = blocks_per_stage
        self.stem_strides = stem_strides
        self.attention_module = registry.check_name(
            attention_module, "attention_module", allow_none=True,
            kinds=("grid",),
        )
        self.attention_kwargs = dict(attention_kwargs or {})
        self.transformer_attention = registry.check_name(
            transformer_attention, "transformer_attention", kinds=("tokens",)
        )
        self.transformer_attention_kwargs = dict(
            transformer_attention_kwargs or {}
        )
        self.aux_loss = check_bool("aux_loss", aux_loss)
        self.loss_settings = detection_loss.check_loss_settings(
            loss_settings, "loss_settings"
        )
        self._make_layers()

    @classmethod
    def from_config(cls, config):
        # Files written before `loss_settings` hold the seven settings as
        # arguments of their own.
        config = dict(config)
        legacy = {
            name: config.pop(name)
            for name in detection_loss.LOSS_DEFAULTS
            if name in config
        }
        if legacy:
            config["loss_settings"] = {
                **legacy, **(config.get("loss_settings") or {})
            }
        quantized = config.pop(QUANTIZED_LAYERS, None)
        parent = super().from_config
        model = build_with_frozen_layers(lambda **kwargs: parent(kwargs), config)
        # Built later (`build_from_config`, before the weights load): its
        # layers are quantized again then.
        object.__setattr__(model, "_quantize_when_built", quantized)
        return model

    def get_config(self):
        config = super().get_config()
        # Frozen and quantized layers, which the constructor does not make
        # again (a quantized DETR's file could not load before).
        config.update(graph_state_config(self))
        return config

    def _make_layers(self):
        self.backbone = make_backbone(self)
        self.input_projection = keras.layers.Conv2D(
            self.hidden_dim, 1, name="input_projection",
            data_format="channels_last", dtype=self.dtype_policy,
        )
        block_args = dict(
            num_heads=self.num_heads,
            mlp_dim=self.feedforward_dim,
            dropout=self.dropout,
            attention_dropout=self.dropout,
            attention=self.transformer_attention,
            attention_kwargs=self.transformer_attention_kwargs,
            layer_norm_epsilon=1e-5,
            norm_first=self.norm_first,
            activation="relu",
            dtype=self.dtype_policy,
        )
        self.encoder_layers = [
            TransformerEncoderBlock(
                name=f"encoder_{i}", attention_name="self_attention",
                **block_args,
            )
            for i in range(self.num_encoder_layers)
        ]
        self.encoder_norm = (
            keras.layers.LayerNormalization(
                epsilon=1e-5, name="encoder_norm", dtype=self.dtype_policy
            )
            if self.norm_first and self.num_encoder_layers
            else None
        )
        self.decoder_layers = [
            TransformerDecoderBlock(name=f"decoder_{i}", **block_args)
            for i in range(self.num_decoder_layers)
        ]
        self.decoder_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, name="decoder_norm", dtype=self.dtype_policy
        )
        self.class_head = keras.layers.Dense(
            self.num_classes + 1, name="class_head", dtype=self.dtype_policy
        )
        self.box_head = [
            keras.layers.Dense(
                self.hidden_dim, activation="relu", name=f"box_head_{i}",
                dtype=self.dtype_policy,
            )
            for i in range(2)
        ] + [keras.layers.Dense(4, name="box_head_2", dtype=self.dtype_policy)]
        # The last decoder layer's loss terms, shown next to the total loss.
        self._class_loss_tracker = keras.metrics.Mean(name="class_loss")
        self._l1_loss_tracker = keras.metrics.Mean(name="l1_loss")
        self._giou_loss_tracker = keras.metrics.Mean(name="giou_loss")

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        if len(input_shape) != 4 or None in input_shape[1:]:
            raise ValueError(
                "Received an invalid value for argument `images`, expected "
                "shape (B, height, width, channels) with known height, width "
                f"and channels. Received: images.shape={input_shape}"
            )
        self.backbone.build(input_shape)
        feature_shape = self.backbone.compute_output_shape(input_shape)
        self.input_projection.build(feature_shape)
        grid = feature_shape[1] * feature_shape[2]
        memory_shape = (None, grid, self.hidden_dim)
        query_shape = (None, self.num_queries, self.hidden_dim)
        for layer in self.encoder_layers:
            layer.build(memory_shape)
        if self.encoder_norm is not None:
            self.encoder_norm.build(memory_shape)
        for layer in self.decoder_layers:
            layer.build(query_shape, memory_shape)
        self.decoder_norm.build(query_shape)
        self.class_head.build(query_shape)
        for layer in self.box_head:
            layer.build(query_shape)  # every layer reads D features
        self.query_embedding = self.add_weight(
            name="query_embedding",
            shape=(self.num_queries, self.hidden_dim),
            initializer=keras.initializers.RandomNormal(stddev=1.0),
        )
        self.feature_size = (feature_shape[1], feature_shape[2])
        self.image_channels = input_shape[-1]
        self.built = True
        quantized = getattr(self, "_quantize_when_built", None)
        if quantized:
            object.__setattr__(self, "_quantize_when_built", None)
            requantize(self, quantized)

    def call(self, images, training=None, return_attention_scores=False,
             pixel_mask=None):
        # `uint8` pixels, as the functional applications take them.
        images = float_inputs(self, images)
        features = self.input_projection(
            self.backbone(images, training=training)
        )  # B, h, w, D
        height, width = features.shape[1], features.shape[2]
        memory = ops.reshape(features, (-1, height * width, self.hidden_dim))
        mask, position = feature_positions(
            pixel_mask, images, height, width, self.hidden_dim
        )
        position = ops.cast(position, memory.dtype)
        for layer in self.encoder_layers:
            memory = layer(
                memory, mask=mask, position=position, training=training
            )
        if self.encoder_norm is not None:
            memory = self.encoder_norm(memory)

        query_position = ops.cast(self.query_embedding, memory.dtype)[None]
        # Zeros (B, N, D): the decoder starts from the query positions only.
        x = ops.zeros_like(memory[:, :1, :1]) + ops.zeros_like(
            query_position
        )
        outputs = []
        weights = None
        last = len(self.decoder_layers) - 1
        for index, layer in enumerate(self.decoder_layers):
            scores = return_attention_scores and index == last
            x = layer(
                x,
                memory,
                memory_mask=mask,
                position=query_position,
                memory_position=position,
                training=training,
                return_attention_scores=scores,
            )
            if scores:
                x, weights = x
            if self.aux_loss or index == last:
                outputs.append(self.decoder_norm(x))
        hidden = ops.stack(outputs, axis=1)  # B, L, N, D
        logits = self.class_head(hidden)
        boxes = hidden
        for layer in self.box_head:
            boxes = layer(boxes)
        boxes = ops.sigmoid(ops.cast(boxes, "float32"))
        result = {"logits": logits[:, -1], "boxes": boxes[:, -1]}
        if len(outputs) > 1:
            result["aux_logits"] = logits[:, :-1]
            result["aux_boxes"] = boxes[:, :-1]
        if return_attention_scores:
            result["cross_attention"] = ops.reshape(
                weights, (-1, self.num_heads, self.num_queries, height, width)
            )
        return result

    # Inference.

    def _trace_for_image_size(self, x, function):
        # `call` needs static grid sizes (its sine positions are constants),
        # and Keras traces a second image size with unknown sizes: a new
        # size gets a new function.
        spec = getattr(x, "element_spec", x)  # a tf.data.Dataset's
        spec = spec[0] if isinstance(spec, (tuple, list)) else spec
        shape = getattr(spec, "shape", None)
        if shape is None or len(shape) != 4:
            return
        self._retrace_when_changed(function, "image_size", tuple(shape[1:3]))

    def _check_images(self, x):
        # Before Keras traces them: on JAX an error inside the traced step
        # left the model's variables emptied (every later call failed).
        spec = getattr(x, "element_spec", x)  # a tf.data.Dataset's
        spec = spec[0] if isinstance(spec, (tuple, list)) else spec
        shape = getattr(spec, "shape", None)
        channels = getattr(self, "image_channels", None)
        if shape is not None and (
            len(shape) != 4 or shape[-1] not in (None, channels or shape[-1])
        ):
            raise ValueError(
                "Received an invalid value for argument `images`, expected "
                f"shape (B, height, width, {channels or 'channels'}). "
                f"Received: images.shape={tuple(shape)}"
            )

    def predict(self, x, *args, **kwargs):
        """`keras.Model.predict`, on images of any size."""
        self._check_images(x)
        self._trace_for_image_size(x, "predict_function")
        return super().predict(x, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.evaluate`, on images of any size."""
        self._check_images(x)
        self._trace_for_image_size(x, "test_function")
        return super().evaluate(x, y, *args, **kwargs)

    def fit(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.fit` (`DETRTraining.fit`), the images checked."""
        self._check_images(x)
        # (Its validation calls `evaluate`, which does the same.)
        self._trace_for_image_size(x, "train_function")
        return super().fit(x, y, *args, **kwargs)

    def predict_boxes(
        self,
        images,
        score_threshold=0.5,
        batch_size=64,
        return_attention=False,
        upsample_attention=False,
        pixel_mask=None,
    ):
        """Detections per image, in pixels.

        A query's score is its most likely object class's probability
        (softmax over the `K + 1` classes); queries scoring below
        `score_threshold` are dropped (use 0 to keep all, e.g. for mAP).

        Args:
            images: `(B, height, width, C)`.
            score_threshold: the least score kept.
            batch_size: images per forward pass.
            return_attention: also return, per detection, the last decoder
                layer's cross-attention averaged over heads.
            upsample_attention: resize those maps to the image size
                (bilinear) instead of the `(h, w)` feature grid.
            pixel_mask: optional `(B, height, width)` for a padded batch, 1
                on the image and 0 on padding, the image in the top-left
                corner (Hugging Face's `pixel_mask`): the padding is not
                attended, and each image's boxes (and upsampled maps) are
                in its own pixels, as transformers'
                `post_process_object_detection` with the images' sizes.

        Returns:
            A list of `B` dicts: `"boxes"` float32 `(k, 4)` pixel corners
            `(x1, y1, x2, y2)` clipped to the image, `"scores"` `(k,)`,
            `"labels"` int32 `(k,)`, sorted by decreasing score; with
            `return_attention`, `"attention"` `(k, h, w)` (or
            `(k, height, width)`), each map summing to 1 over the grid.

        Raises:
            ValueError: for images not `(B, height, width, C)`, a
                `batch_size` not a positive integer, a `score_threshold`
                not a number in [0, 1], or a bad `pixel_mask`.
        """
        images = np.asarray(images, dtype="float32")
        self._check_images(images)
        batch_size = base.check_positive_int("batch_size", batch_size)
        base.check_positive_number(
            "score_threshold", score_threshold, allow_zero=True
        )
        if score_threshold > 1:  # scores are probabilities: none kept
            raise base.invalid("score_threshold", "a score in [0, 1]", score_threshold)
        if not len(images):
            return []
        height, width = images.shape[1:3]
        pixel_mask, sizes = image_sizes(pixel_mask, images)
        if return_attention or pixel_mask is not None:
            keys = ["logits", "boxes"] + ["cross_attention"] * return_attention
            outputs = {key: [] for key in keys}
            for start in range(0, len(images), batch_size):
                part = slice(start, start + batch_size)
                out = self(
                    images[part],
                    training=False,
                    return_attention_scores=return_attention,
                    pixel_mask=None if pixel_mask is None else pixel_mask[part],
                )
                for key in outputs:
                    outputs[key].append(ops.convert_to_numpy(out[key]))
            outputs = {k: np.concatenate(v) for k, v in outputs.items()}
        else:
            outputs = self.predict(images, batch_size=batch_size, verbose=0)
        return decode_detections(
            outputs, (height, width), score_threshold, upsample_attention, sizes
        )

    def with_preset_classes(self, num_classes, spec, config):
        """`from_preset(name, num_classes=K)`'s model: every weight of this
        preset but the class head's (the backbone, the transformer, the
        queries and the box head), and a fresh class head of `K + 1`
        outputs, for fine-tuning on other classes.

        Example:

        ```python
        model = DETR.from_preset("detr_digits", num_classes=3)
        ```
        """
        model = type(self)(**{**config, "num_classes": num_classes})
        if not self.built:
            return model
        model.build(spec.input_shape)
        head = {id(v) for v in model.class_head.weights}
        own_head = {id(v) for v in self.class_head.weights}
        kept = [v for v in model.weights if id(v) not in head]
        given = [v for v in self.weights if id(v) not in own_head]
        for target, value in zip(kept, given, strict=True):
            target.assign(value)
        return model


presets.register_preset(
    "detr_digits",
    "DETR",
    {
        "num_classes": 10,
        "num_queries": 10,
        "hidden_dim": 64,
        "num_heads": 4,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "feedforward_dim": 128,
        "backbone_filters": (32, 64),
        "blocks_per_stage": 1,
        "stem_strides": 2,
        # A class loss weight of 2 (DETR: 1) ends the early phase where
        # only boxes improve about twice as soon on this data.
        "loss_settings": {"class_loss_weight": 2.0},
    },
    weights="detr_digits.weights.h5",
    description="DETR for digits on 64x64 canvases (`make_detection_set`: "
    "10 classes, 1-4 objects, an 8x8 feature grid), trained by "
    "`benchmarks/bench_detection.py --save` (20 minutes, stopped in epoch 18 "
    "of 30): held-out mAP@0.5 0.856, mAP 0.537.",
    input_shape=(None, 64, 64, 1),
)
