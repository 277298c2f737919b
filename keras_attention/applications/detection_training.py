"""DETR's training: the Hungarian loss over decoder layers, and `fit` /
`evaluate` that check array targets first (`DETRTraining`, a mixin of
`detection.DETR`)."""

from keras import ops

from keras_attention.applications import detection_loss
from keras_attention.applications.compiling import DefaultJitCompile
from keras_attention.applications.detection_loss import validate_targets


def _check_target_dict(y):
    if not isinstance(y, dict) or not {"boxes", "labels"} <= set(y):
        raise ValueError(
            "Received an invalid value for argument `y`, expected a dict "
            "with keys 'boxes' (B, M, 4) and 'labels' (B, M). "
            f"Received: y={type(y).__name__}"
            + (f" with keys {sorted(y)}" if isinstance(y, dict) else "")
        )


class DETRTraining(DefaultJitCompile):
    """`compute_loss`, `validate_targets`, `fit` and `evaluate` of `DETR`.

    Needs the model's `loss_settings` (for
    `detection_loss.set_prediction_loss`), `num_queries`, `num_classes`, `aux_loss` outputs and the three loss
    trackers (`_class_loss_tracker`, `_l1_loss_tracker`,
    `_giou_loss_tracker`).
    """

    def compile(self, *args, jit_compile=None, **kwargs):
        """`keras.Model.compile`; `jit_compile=None` (the default) is XLA
        where it is faster (TensorFlow and JAX in float32), eager on
        torch, and is saved as a default (`DefaultJitCompile`)."""
        super().compile(
            *args, jit_compile=self.default_jit_compile(jit_compile, True),
            **kwargs,
        )

    def _loss_terms(self, y, y_pred):
        """The loss summed over decoder layers, and the last layer's terms."""
        _check_target_dict(y)
        boxes, labels = y["boxes"], y["labels"]
        if len(boxes.shape) == 3 and boxes.shape[1] is None:
            # The matcher needs a static number of target columns.
            raise ValueError(
                "Received an invalid value for argument `y`, expected a "
                "known number of target columns M in boxes (B, M, 4). "
                f"Received: boxes.shape={tuple(boxes.shape)}; pad the "
                "targets to a fixed M <= num_queries (e.g. `padded_batch("
                "..., padded_shapes=...)` with label -1)"
            )
        if boxes.shape[1] is not None and boxes.shape[1] > self.num_queries:
            raise ValueError(
                "Received an invalid value for argument `y`, expected at "
                f"most num_queries={self.num_queries} target columns. "
                f"Received: boxes.shape={tuple(boxes.shape)}; run "
                "`validate_targets` on the data to trim the padding"
            )
        logits, pred_boxes = y_pred["logits"], y_pred["boxes"]
        layers = 1
        if "aux_logits" in y_pred:
            # All decoder layers in one matching: (B, L, ...) -> (B * L, ...),
            # the targets repeated per layer.
            layers = y_pred["aux_logits"].shape[1] + 1
            logits = ops.concatenate(
                [y_pred["aux_logits"], logits[:, None]], axis=1
            )
            pred_boxes = ops.concatenate(
                [ops.cast(y_pred["aux_boxes"], pred_boxes.dtype),
                 pred_boxes[:, None]],
                axis=1,
            )
            logits = ops.reshape(logits, (-1,) + tuple(logits.shape[2:]))
            pred_boxes = ops.reshape(pred_boxes, (-1, self.num_queries, 4))
            boxes = ops.repeat(boxes, layers, axis=0)
            labels = ops.repeat(labels, layers, axis=0)
        terms = detection_loss.set_prediction_loss(
            logits, pred_boxes, boxes, labels, self.num_classes,
            self.loss_settings, num_layers=layers,
        )
        last = {k: v[-1] for k, v in terms["per_layer"].items()}
        return terms["loss"], last

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        """DETR's Hungarian loss, summed over decoder layers.

        `sample_weight` is not supported (DETR normalises by the number of
        boxes in the batch) and must be `None`.
        """
        if sample_weight is not None:
            raise ValueError(
                "DETR does not support `sample_weight`; weight images by "
                "repeating them instead. Received: sample_weight="
                f"{type(sample_weight).__name__}"
            )
        total, final = self._loss_terms(y, y_pred)
        # Weighted by the batch size, as Keras weighs its own `loss`, so a
        # short last batch counts for its images only.
        images = ops.cast(ops.shape(y_pred["logits"])[0], "float32")
        self._class_loss_tracker.update_state(final["class_loss"], images)
        self._l1_loss_tracker.update_state(final["l1_loss"], images)
        self._giou_loss_tracker.update_state(final["giou_loss"], images)
        for loss in self.losses:
            total = total + ops.cast(ops.sum(loss), total.dtype)
        return detection_loss.scale_for_replicas(total)

    def validate_targets(self, y):
        """`validate_targets` with this model's classes and queries.

        Args:
            y: a dict with `"boxes"` and `"labels"`.

        Returns:
            The dict with checked (clipped, possibly trimmed) NumPy arrays.
        """
        _check_target_dict(y)
        boxes, labels = validate_targets(
            y["boxes"],
            y["labels"],
            self.num_classes,
            num_queries=self.num_queries,
        )
        return {"boxes": boxes, "labels": labels}

    def _checked(self, y):
        # Array targets are checked here; a dataset or generator passes
        # through (its targets are sanitised inside the loss).
        if y is None:
            return None
        return self.validate_targets(y)

    def _build_state(self, x):
        # Without a distribution strategy Keras builds the optimizer inside
        # the first traced train step, which makes TensorFlow trace it twice;
        # building it here first halves the time to the first step.
        if not self.built and hasattr(x, "shape") and len(x.shape) == 4:
            self.build((None,) + tuple(x.shape[1:]))
        optimizer = getattr(self, "optimizer", None)  # None before compile
        if self.built and optimizer is not None and not optimizer.built:
            optimizer.build(self.trainable_variables)

    def _trace_for_target_columns(self, x, y, function):
        # The matcher needs a static number of target columns M, and Keras
        # traces a second M as unknown: a new M gets a new function.
        if y is None:  # a dataset of (images, targets)
            spec = getattr(x, "element_spec", None)
            y = spec[1] if isinstance(spec, tuple) and len(spec) > 1 else None
        shape = getattr(y.get("boxes"), "shape", None) if isinstance(
            y, dict
        ) else None
        if shape is None or len(shape) != 3:
            return
        self._retrace_when_changed(function, "target_columns", shape[1])

    def _retrace_when_changed(self, function, what, value):
        """Drops Keras's traced `function` (`"train_function"`, ...) when the
        static `what` of its data differs from the last call's: Keras would
        trace it again with that size unknown, which the step cannot take."""
        key = f"_{function}_{what}"
        if getattr(self, key, value) != value:
            setattr(self, function, None)
        setattr(self, key, value)

    def fit(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.fit`; array targets checked by `validate_targets`."""
        y = self._checked(y)
        # (Its validation calls `evaluate`, which does the same.)
        self._trace_for_target_columns(x, y, "train_function")
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and len(validation) == 2:
            kwargs["validation_data"] = (
                validation[0], self._checked(validation[1])
            )
        self._build_state(x)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.evaluate`, with array targets checked first."""
        y = self._checked(y)
        self._trace_for_target_columns(x, y, "test_function")
        return super().evaluate(x, y, *args, **kwargs)
