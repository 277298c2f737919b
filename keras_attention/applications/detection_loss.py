"""DETR's set-prediction loss: box geometry, matching cost, Hungarian loss.

Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
Everything that runs inside the train step is `keras.ops` with static
shapes, so it compiles under XLA; `validate_targets` is NumPy and checks the
targets once, before training.

Shape letters: `B` images, `N` predictions (object queries), `M` targets
(ground-truth objects, padded), `K` object classes (the logits have `K + 1`
entries, the last one "no object").

Boxes are normalised `(cx, cy, w, h)` in `[0, 1]` as in DETR; padded targets
have the label `-1` (`keras_attention.datasets.PAD_LABEL`).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention import _validation as base
from keras_attention import matching

PAD_LABEL = -1
# Tolerance of `validate_targets` for boxes that stick out of the image by
# rounding (in units of the image side); such boxes are clipped.
BOX_TOLERANCE = 1e-3
_EPS = 1e-7


def cxcywh_to_xyxy(boxes):
    """`(..., 4)` boxes `(cx, cy, w, h)` -> corners `(x0, y0, x1, y1)`."""
    centre, size = boxes[..., :2], boxes[..., 2:]
    return ops.concatenate([centre - 0.5 * size, centre + 0.5 * size], axis=-1)


def pairwise_generalized_iou(boxes1, boxes2):
    """Generalised IoU (Rezatofighi et al., 2019) of every pair of boxes.

    `GIoU = IoU - |C \\ (A u B)| / |C|`, `C` the smallest box enclosing `A`
    and `B`; it lies in `[-1, 1]` and, unlike IoU, has a gradient for boxes
    that do not overlap.

    Args:
        boxes1: `(..., N, 4)` corners `(x0, y0, x1, y1)`.
        boxes2: `(..., M, 4)` corners.

    Returns:
        `(..., N, M)` generalised IoU, and the plain IoU `(..., N, M)`.
    """
    a = boxes1[..., :, None, :]  # ..., N, 1, 4
    b = boxes2[..., None, :, :]  # ..., 1, M, 4
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    top_left = ops.maximum(a[..., :2], b[..., :2])
    bottom_right = ops.minimum(a[..., 2:], b[..., 2:])
    overlap = ops.maximum(bottom_right - top_left, 0.0)
    intersection = overlap[..., 0] * overlap[..., 1]
    union = area_a + area_b - intersection
    iou = intersection / ops.maximum(union, _EPS)
    hull = ops.maximum(a[..., 2:], b[..., 2:]) - ops.minimum(
        a[..., :2], b[..., :2]
    )
    hull_area = hull[..., 0] * hull[..., 1]
    giou = iou - (hull_area - union) / ops.maximum(hull_area, _EPS)
    return giou, iou


def target_mask(labels, num_classes):
    """`(B, M)` True for real targets: labels in `[0, num_classes)`."""
    labels = ops.convert_to_tensor(labels)
    return ops.logical_and(labels >= 0, labels < num_classes)


def sanitize_targets(boxes, labels, num_classes):
    """Targets made safe for the loss, whatever the data holds.

    Labels outside `[0, num_classes)` and boxes with a non-finite coordinate
    are treated as padding; the real boxes are clipped to the image (their
    corners to `[0, 1]`, sizes at least 1e-4), and padding gets a dummy
    full-image box, so no loss term can become NaN. `validate_targets` is
    the strict check to run on the data first; this is the safety net for
    data that bypasses it (a `tf.data` pipeline).

    Returns:
        `(boxes, labels, mask)`: float32 `(B, M, 4)`, int32 `(B, M)` with
        -1 for padding, bool `(B, M)`.
    """
    boxes = ops.cast(boxes, "float32")
    labels = ops.cast(labels, "int32")
    finite = ops.all(ops.isfinite(boxes), axis=-1)
    mask = ops.logical_and(target_mask(labels, num_classes), finite)
    safe = ops.where(finite[..., None], boxes, 0.5)
    half = ops.clip(safe[..., 2:], 1e-4, 1.0) / 2
    low = ops.clip(safe[..., :2] - half, 0.0, 1.0 - 1e-4)
    high = ops.minimum(ops.maximum(safe[..., :2] + half, low + 1e-4), 1.0)
    clipped = ops.concatenate([(low + high) / 2, high - low], axis=-1)
    dummy = ops.convert_to_tensor([0.5, 0.5, 1.0, 1.0], "float32")
    boxes = ops.where(mask[..., None], clipped, dummy)
    labels = ops.where(mask, labels, PAD_LABEL)
    return boxes, labels, mask


def matching_cost(
    logits,
    pred_boxes,
    target_boxes,
    target_labels,
    class_cost=1.0,
    bbox_cost=5.0,
    giou_cost=2.0,
):
    """DETR's matching cost between every prediction and every target.

    `C[i, j] = -class_cost * p_i(c_j) + bbox_cost * |b_i - b_j|_1
    - giou_cost * GIoU(b_i, b_j)`, with `p_i` the softmax of prediction
    `i`'s logits and `c_j`, `b_j` target `j`'s class and box.

    Args:
        logits: `(B, N, K + 1)`.
        pred_boxes: `(B, N, 4)` normalised `(cx, cy, w, h)`.
        target_boxes: `(B, M, 4)` normalised `(cx, cy, w, h)`, sanitised.
        target_labels: int `(B, M)`; padding (-1) gets a class term of 0.
        class_cost, bbox_cost, giou_cost: the weights of the three terms.

    Returns:
        A dict of `(B, N, M)` tensors: `"cost"`, and the terms `"prob"`
        (`p_i(c_j)`), `"l1"`, `"giou"` (with gradients, for the loss).
    """
    num_logits = logits.shape[-1]
    probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)
    # float32 whatever floatx says (a float64 floatx made it float64).
    onehot = ops.one_hot(ops.maximum(target_labels, 0), num_logits, dtype="float32")
    onehot = onehot * ops.cast(target_labels >= 0, "float32")[..., None]
    prob = ops.einsum("bnk,bmk->bnm", probs, onehot)
    pred_boxes = ops.cast(pred_boxes, "float32")
    l1 = ops.sum(
        ops.abs(pred_boxes[:, :, None, :] - target_boxes[:, None, :, :]),
        axis=-1,
    )
    giou, _ = pairwise_generalized_iou(
        cxcywh_to_xyxy(pred_boxes), cxcywh_to_xyxy(target_boxes)
    )
    cost = -class_cost * prob + bbox_cost * l1 - giou_cost * giou
    return {"cost": cost, "prob": prob, "l1": l1, "giou": giou}


# DETR's loss settings and their defaults (the paper's): the weight of the
# "no object" class in the class loss, the weights of the three loss terms,
# and the weights of the matching cost's three terms. `DETR(loss_settings=)`
# and `set_prediction_loss(settings=)` take any of them.
LOSS_DEFAULTS = {
    "eos_coef": 0.1,
    "class_loss_weight": 1.0,
    "bbox_loss_weight": 5.0,
    "giou_loss_weight": 2.0,
    "class_cost": 1.0,
    "bbox_cost": 5.0,
    "giou_cost": 2.0,
}


def set_prediction_loss(
    logits,
    pred_boxes,
    target_boxes,
    target_labels,
    num_classes,
    settings=None,
    num_layers=1,
):
    """DETR's Hungarian loss for a batch of images (Carion et al., 2020).

    For each image, every target is matched to one distinct prediction by an
    exact minimum-cost assignment (`keras_attention.matching`) on
    `matching_cost`; unmatched predictions must predict "no object". Then

    - class: cross-entropy of every prediction against its matched class or
      "no object", the "no object" terms weighted by `eos_coef`, averaged
      with these weights (as `F.cross_entropy(weight=...)` does in DETR);
    - L1: `sum |b_i - b_j|_1` over matched pairs / number of targets;
    - GIoU: `sum (1 - GIoU(b_i, b_j))` over matched pairs / number of targets.

    The number of targets is counted per decoder layer over the whole batch
    and is at least 1, so images without objects (or a batch without any)
    give a finite loss. With `num_layers > 1` the batch holds the outputs of
    several decoder layers stacked image-major, `(B * num_layers, ...)`; each
    layer is matched separately and the layers' losses are summed, as DETR's
    auxiliary losses are.

    Args:
        logits: `(B, N, K + 1)`.
        pred_boxes: `(B, N, 4)`, normalised `(cx, cy, w, h)`.
        target_boxes: `(B, M, 4)`, normalised `(cx, cy, w, h)`, `M <= N`.
        target_labels: int `(B, M)`, -1 for padding.
        num_classes: `K`.
        settings: a dict of any of `LOSS_DEFAULTS`' keys, the others taking
            their defaults: `eos_coef` (weight of the "no object" class),
            `class_loss_weight`, `bbox_loss_weight`, `giou_loss_weight` (the
            weights of the loss terms), `class_cost`, `bbox_cost`,
            `giou_cost` (the weights of the matching cost).
        num_layers: how many decoder layers the batch stacks.

    Returns:
        A dict of scalars `"loss"` (the weighted sum), `"class_loss"`,
        `"l1_loss"`, `"giou_loss"` (each summed over layers); `"per_layer"`,
        the same four as `(num_layers,)` vectors; and `"assignment"`, the
        int32 `(B, M)` prediction matched to each target (-1 for padding).
    """
    settings = check_loss_settings(settings)
    num_predictions = pred_boxes.shape[1]
    logits = ops.cast(logits, "float32")
    pred_boxes = ops.cast(pred_boxes, "float32")
    target_boxes, target_labels, mask = sanitize_targets(
        target_boxes, target_labels, num_classes
    )
    terms = matching_cost(
        logits,
        pred_boxes,
        target_boxes,
        target_labels,
        class_cost=settings["class_cost"],
        bbox_cost=settings["bbox_cost"],
        giou_cost=settings["giou_cost"],
    )
    assignment = matching.linear_sum_assignment(terms["cost"], mask)
    pairs = matching.matched_pairs(assignment, num_predictions)  # B, N, M
    matched = ops.sum(pairs, axis=-1)  # B, N: 1 for matched predictions

    # Each prediction's target class: its target's, else "no object" (K).
    target_onehot = ops.einsum(
        "bnm,bmk->bnk",
        pairs,
        ops.one_hot(
            ops.maximum(target_labels, 0), num_classes + 1, dtype="float32"
        ),
    ) + (1.0 - matched)[..., None] * ops.one_hot(
        num_classes, num_classes + 1, dtype="float32"
    )
    cross_entropy = -ops.sum(
        target_onehot * ops.log_softmax(logits, axis=-1), axis=-1
    )  # B, N
    class_weights = matched + settings["eos_coef"] * (1.0 - matched)

    def per_layer(x):
        # (B * L, ...) stacked image-major -> (L,) sums over the rest.
        x = ops.reshape(x, (-1, num_layers, num_predictions, x.shape[-1]))
        return ops.sum(x, axis=(0, 2, 3))

    class_loss = per_layer((class_weights * cross_entropy)[..., None]) / (
        per_layer(class_weights[..., None])
    )
    num_boxes = ops.maximum(
        ops.sum(ops.cast(mask, "float32")) / float(num_layers), 1.0
    )
    l1_loss = per_layer(pairs * terms["l1"]) / num_boxes
    giou_loss = per_layer(pairs * (1.0 - terms["giou"])) / num_boxes
    loss = (
        settings["class_loss_weight"] * class_loss
        + settings["bbox_loss_weight"] * l1_loss
        + settings["giou_loss_weight"] * giou_loss
    )
    return {
        "loss": ops.sum(loss),
        "class_loss": ops.sum(class_loss),
        "l1_loss": ops.sum(l1_loss),
        "giou_loss": ops.sum(giou_loss),
        "assignment": assignment,
        "per_layer": {
            "loss": loss,
            "class_loss": class_loss,
            "l1_loss": l1_loss,
            "giou_loss": giou_loss,
        },
    }


def check_target_arrays(boxes, labels):
    """`boxes` `(B, M, 4)` and integer `labels` `(B, M)` as NumPy arrays."""
    try:
        boxes = np.asarray(boxes)
        labels = np.asarray(labels)
    except ValueError as error:  # e.g. per-image lists of unequal lengths
        raise ValueError(
            "Received an invalid value for argument `boxes` or `labels`, "
            "expected arrays (B, M, 4) and (B, M): pad each image's objects "
            f"to M with label {PAD_LABEL} (padding rows may hold any box). "
            f"NumPy: {error}"
        ) from None
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise ValueError(
            "Received an invalid value for argument `boxes`, expected an "
            "array of shape (B, M, 4) of normalised (cx, cy, w, h). "
            f"Received: boxes.shape={boxes.shape}"
        )
    if labels.shape != boxes.shape[:2]:
        raise ValueError(
            "Received an invalid value for argument `labels`, expected an "
            f"array of shape {boxes.shape[:2]} matching `boxes`. "
            f"Received: labels.shape={labels.shape}"
        )
    if labels.dtype.kind not in "iuf" or (
        labels.size and not np.all(np.equal(np.mod(labels, 1), 0))
    ):
        raise ValueError(
            "Received an invalid value for argument `labels`, expected "
            f"integer class ids. Received: labels.dtype={labels.dtype}"
        )
    return boxes, labels


def validate_targets(
    boxes,
    labels,
    num_classes,
    num_queries=None,
    tolerance=BOX_TOLERANCE,
):
    """Checks detection targets on the host before training.

    Real targets are those with a label other than -1 (padding). Their
    boxes, normalised `(cx, cy, w, h)`, must be finite, have positive sizes
    and lie inside the image; boxes that stick out by at most `tolerance`
    (rounding) are clipped to the image. Padding rows may hold anything.

    When the padded width `M` is larger than `num_queries` but no image has
    more real targets than queries, the real targets are moved to the front
    and the padding trimmed to `num_queries` columns (the matcher needs
    `M <= N`).

    Args:
        boxes: `(B, M, 4)` normalised `(cx, cy, w, h)`.
        labels: int `(B, M)`, in `[0, num_classes)` or -1 for padding.
        num_classes: `K`.
        num_queries: the model's `N`; optional.
        tolerance: how far (in image sides) a box may stick out.

    Returns:
        `(boxes, labels)` as float32 and int32 NumPy arrays, padding
        rows zeroed.

    Raises:
        ValueError: naming the argument, the first offending image and
            object, and the value.
    """
    boxes, labels = check_target_arrays(boxes, labels)
    labels = labels.astype("int64")
    real = labels != PAD_LABEL
    bad = real & ((labels < 0) | (labels >= num_classes))
    if bad.any():
        b, m = np.argwhere(bad)[0]
        raise ValueError(
            "Received an invalid value for argument `labels`, expected class "
            f"ids in [0, {num_classes}) or {PAD_LABEL} for padding. "
            f"Received: labels[{b}, {m}]={labels[b, m]}"
        )
    boxes = boxes.astype("float64")
    real_boxes = np.where(real[..., None], boxes, 0.5)

    def first_bad(condition, what):
        if condition.any():
            b, m = np.argwhere(condition)[0]
            raise ValueError(
                "Received an invalid value for argument `boxes`, expected "
                f"{what}. Received: boxes[{b}, {m}]={boxes[b, m].tolist()} "
                "(normalised cx, cy, w, h)"
            )

    first_bad(
        real & ~np.all(np.isfinite(real_boxes), axis=-1), "finite coordinates"
    )
    first_bad(
        real & np.any(real_boxes[..., 2:] <= 0, axis=-1),
        "positive widths and heights",
    )
    corners = np.concatenate(
        [
            real_boxes[..., :2] - real_boxes[..., 2:] / 2,
            real_boxes[..., :2] + real_boxes[..., 2:] / 2,
        ],
        axis=-1,
    )
    outside = np.any(
        (corners < -tolerance) | (corners > 1 + tolerance), axis=-1
    )
    first_bad(
        real & outside,
        f"boxes inside the image (corners in [0, 1] within {tolerance})",
    )
    corners = np.clip(corners, 0.0, 1.0)
    fixed = np.concatenate(
        [
            (corners[..., :2] + corners[..., 2:]) / 2,
            corners[..., 2:] - corners[..., :2],
        ],
        axis=-1,
    )
    first_bad(
        real & np.any(fixed[..., 2:] <= 0, axis=-1),
        "boxes with a positive size inside the image",
    )
    boxes = np.where(real[..., None], fixed, 0.0).astype("float32")
    labels = np.where(real, labels, PAD_LABEL).astype("int32")

    if num_queries is not None:
        boxes, labels = _fit_to_queries(boxes, labels, real, num_queries)
    return boxes, labels


def _fit_to_queries(boxes, labels, real, num_queries):
    """Real targets first and the padding cut to `num_queries` columns."""
    counts = real.sum(axis=1)
    if counts.size and counts.max() > num_queries:
        b = int(np.argmax(counts))
        raise ValueError(
            "Received an invalid value for argument `labels`, expected "
            f"at most num_queries={num_queries} objects per image. "
            f"Received: {counts[b]} objects in image {b}"
        )
    if boxes.shape[1] > num_queries:
        order = np.argsort(~real, axis=1, kind="stable")[:, :num_queries]
        boxes = np.take_along_axis(boxes, order[..., None], axis=1)
        labels = np.take_along_axis(labels, order, axis=1)
    return boxes, labels


def check_loss_settings(settings, argument="settings"):
    """`LOSS_DEFAULTS` updated with `settings` (a dict, or `None`), each a
    non-negative float (`eos_coef` positive). Raises a `ValueError` naming
    `argument` for an unknown key."""
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise base.invalid(
            argument, f"a dict with keys among {sorted(LOSS_DEFAULTS)}",
            settings,
        )
    unknown = sorted(set(settings) - set(LOSS_DEFAULTS))
    if unknown:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`: unknown "
            f"keys {unknown}. Expected keys among {sorted(LOSS_DEFAULTS)}."
        )
    checked = {}
    for name, value in {**LOSS_DEFAULTS, **settings}.items():
        if isinstance(value, bool) or not isinstance(
            value, (int, float)
        ) or not (value >= 0 and math.isfinite(value)):
            raise base.invalid(
                f'{argument}["{name}"]', "a non-negative float", value
            )
        checked[name] = float(value)
    if checked["eos_coef"] <= 0:
        raise base.invalid(
            f'{argument}["eos_coef"]', "a positive float", checked["eos_coef"]
        )
    return checked


def scale_for_replicas(loss):
    """`loss` divided by the replicas of the current `tf.distribute` strategy.

    The replicas' gradients are summed, so each replica's loss is divided by
    their number, as Keras's own losses are; a `compute_loss` override must
    do it itself (without it, two replicas take steps twice too large).
    """
    if keras.backend.backend() != "tensorflow":
        return loss
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss / replicas if replicas > 1 else loss
