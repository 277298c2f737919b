"""DETR's detections: decoding its outputs, COCO mean average precision."""

import keras
import numpy as np
from keras import ops

from keras_attention.applications import detection_loss
from keras_attention.applications.detection_loss import PAD_LABEL
from keras_attention._validation import check_ids_in_range


def evaluate_detections(
    model_or_predictions,
    images,
    boxes,
    labels,
    num_classes=None,
    batch_size=64,
    max_detections=100,
):
    """COCO mean average precision of detections, with `faster-coco-eval`.

    Ground truth and detections are put into in-memory COCO dicts (boxes in
    pixels) and scored by `faster_coco_eval.COCOeval_faster` (a maintained
    pycocotools-compatible implementation): AP averaged over classes, at
    IoU 0.5, 0.75 and over 0.5:0.05:0.95, at most `max_detections` per
    image.

    Args:
        model_or_predictions: a `DETR` (all its queries are scored, no
            threshold, as in DETR's evaluation), or a list of per-image
            dicts as `DETR.predict_boxes` returns.
        images: `(B, height, width, C)`; only their size is read when
            predictions are given.
        boxes: `(B, M, 4)` ground-truth normalised `(cx, cy, w, h)`.
        labels: `(B, M)`, -1 for padding.
        num_classes: the class ids are `0..num_classes - 1`; defaults to the
            model's, else to one more than the largest label.
        batch_size: for the model's predictions.
        max_detections: detections kept per image (COCO uses 100).

    Returns:
        A dict of floats: `"map"` (AP@[.5:.95]), `"map50"`, `"map75"`,
        `"mar100"` (recall with at most `max_detections`), and the counts
        `"num_images"`, `"num_objects"`, `"num_detections"`.

    Raises:
        ValueError: for ground truth `fit` would refuse (boxes not
            normalised `(cx, cy, w, h)` inside the image, labels outside
            `[0, num_classes)` other than -1, shapes that disagree), and
            for predictions with labels outside the classes or boxes that
            are not pixel corners `(x1, y1, x2, y2)`: either would match
            nothing and score 0 unseen.

    Example:

    ```python
    scores = evaluate_detections(model, data.images, data.boxes, data.labels)
    scores["map50"], scores["map"]
    ```
    """
    from faster_coco_eval import COCOeval_faster

    images = np.asarray(images)
    boxes, labels = detection_loss.check_target_arrays(boxes, labels)
    if images.ndim == 4:
        height, width = images.shape[1:3]
    else:
        raise ValueError(
            "Received an invalid value for argument `images`, expected "
            "shape (B, height, width, channels). "
            f"Received: images.shape={images.shape}"
        )
    if isinstance(model_or_predictions, keras.Model):
        predictions = model_or_predictions.predict_boxes(
            images, score_threshold=0.0, batch_size=batch_size
        )
        if num_classes is None:
            num_classes = getattr(model_or_predictions, "num_classes", None)
    else:
        predictions = list(model_or_predictions)
    if len(predictions) != len(boxes) or len(boxes) != len(images):
        raise ValueError(
            "Expected as many predictions, box rows and label rows as "
            f"images. Received: {len(predictions)} predictions, "
            f"images.shape={images.shape}, boxes.shape={boxes.shape}, "
            f"labels.shape={labels.shape}"
        )
    boxes, labels, real, num_classes = _checked_targets(
        boxes, labels, num_classes
    )

    ground_truth = _coco_ground_truth(
        boxes, labels, real, (height, width), num_classes
    )
    results = _coco_results(predictions, max_detections, num_classes)
    detections = ground_truth.loadRes(results)
    evaluator = COCOeval_faster(
        ground_truth, detections, iouType="bbox", print_function=lambda *a: None
    )
    evaluator.params.maxDets = [1, 10, max_detections]
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    stats = evaluator.stats_as_dict
    if callable(stats):
        stats = stats()
    recall_key = "AR_third" if max_detections == 100 else f"AR_{max_detections}"
    return {
        "map": max(float(stats["AP_all"]), 0.0),
        "map50": max(float(stats["AP_50"]), 0.0),
        "map75": max(float(stats["AP_75"]), 0.0),
        "mar100": max(float(stats.get(recall_key, 0.0)), 0.0),
        "num_images": len(boxes),
        "num_objects": int(real.sum()),
        "num_detections": len(results),
    }


def _checked_targets(boxes, labels, num_classes):
    """The ground truth checked as `fit` checks it, and its real objects'
    mask and the number of classes."""
    real = labels != PAD_LABEL
    if not real.any():
        # COCO's "undefined" (-1) would read as a score of 0.
        raise ValueError(
            "Received an invalid value for argument `labels`, expected at "
            "least one object (a label other than "
            f"{PAD_LABEL}): the mAP of a split without objects is undefined. "
            f"Received: labels.shape={labels.shape}, all {PAD_LABEL}"
        )
    if num_classes is None:
        num_classes = int(labels[real].max()) + 1
    # A class outside the categories would leave its objects out of the
    # score unseen (COCO evaluates the listed categories only).
    check_ids_in_range(
        "labels", labels[real], num_classes, f"class ids (or {PAD_LABEL} "
        "for padding)", f"num_classes={num_classes}",
    )
    # Checked as `fit` checks them: a negative size or pixel boxes would
    # match nothing and score 0 unseen (those out by rounding are clipped).
    boxes, labels = detection_loss.validate_targets(boxes, labels, num_classes)
    boxes = boxes.astype("float64")
    return boxes, labels, real, num_classes


def _coco_ground_truth(boxes, labels, real, image_size, num_classes):
    """A `faster_coco_eval.COCO` of the targets, boxes in pixels.

    COCO ids start at 1: image `i` is `i + 1`, class `c` is `c + 1`.
    """
    from faster_coco_eval import COCO

    height, width = image_size
    pixel = boxes * np.array([width, height, width, height], "float64")
    annotations = []
    for i, j in zip(*np.nonzero(real)):
        cx, cy, w, h = pixel[i, j]
        annotations.append(
            {
                "id": len(annotations) + 1,
                "image_id": int(i) + 1,
                "category_id": int(labels[i, j]) + 1,
                "bbox": [cx - w / 2, cy - h / 2, w, h],
                "area": w * h,
                "iscrowd": 0,
            }
        )
    ground_truth = COCO()
    ground_truth.dataset = {
        "images": [
            {"id": i + 1, "width": int(width), "height": int(height)}
            for i in range(len(boxes))
        ],
        "annotations": annotations,
        "categories": [
            {"id": c + 1, "name": str(c)} for c in range(num_classes)
        ],
    }
    ground_truth.createIndex()
    return ground_truth


def _coco_results(predictions, max_detections, num_classes):
    """The COCO result list of per-image detections (best first, capped)."""
    results = []
    for i, detection in enumerate(predictions):
        corners = _checked_detection(i, detection, num_classes)
        order = np.argsort(-np.asarray(detection["scores"]), kind="stable")
        for k in order[:max_detections]:
            x1, y1, x2, y2 = corners[k]
            results.append(
                {
                    "image_id": i + 1,
                    "category_id": int(detection["labels"][k]) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": float(detection["scores"][k]),
                }
            )
    return results


def _checked_detection(i, detection, num_classes):
    """Image `i`'s predicted corners `(k, 4)`, checked: a class outside
    the categories or boxes not in `(x1, y1, x2, y2)` would score 0 unseen
    (COCO skips unknown categories)."""
    corners = np.asarray(detection["boxes"], dtype="float64")
    labels = np.asarray(detection["labels"])
    k = len(labels)
    if corners.size == 0:  # no detections, as `[]` too
        corners = corners.reshape(0, 4)
    problem = None
    if corners.shape != (k, 4) or np.shape(detection["scores"]) != (k,):
        problem = (
            f"boxes (k, 4), scores (k,) and labels (k,); got boxes "
            f"{corners.shape}, scores {np.shape(detection['scores'])}, "
            f"labels {labels.shape}"
        )
    elif k and (
        labels.dtype.kind not in "iuf" or np.any(labels % 1 != 0)
        or labels.min() < 0 or labels.max() >= num_classes
    ):
        problem = (
            f"labels in [0, {num_classes}) (num_classes={num_classes}); "
            f"got {labels.tolist()}"
        )
    elif not np.all(good := np.all(np.isfinite(corners), 1) & np.all(
        corners[:, 2:] >= corners[:, :2], 1
    )):
        bad = np.flatnonzero(~good)
        problem = (
            "finite pixel corners (x1, y1, x2, y2) with x1 <= x2, y1 <= y2 "
            "(as `DETR.predict_boxes` gives them); got "
            f"boxes[{bad[0]}]={corners[bad[0]].tolist()}"
        )
    if problem is not None:
        raise ValueError(
            "Received an invalid value for argument `model_or_predictions`, "
            f"expected per-image dicts of {problem} at image {i}."
        )
    return corners


def decode_detections(outputs, image_size, score_threshold=0.5,
                      upsample_attention=False, sizes=None):
    """Per-image detections in pixels from DETR's outputs (NumPy arrays).

    A query's score is its most likely object class's probability (softmax
    over the `K + 1` classes); queries scoring below `score_threshold` are
    dropped. See `DETR.predict_boxes` for the returned dicts.

    Args:
        outputs: `{"logits": (B, N, K + 1), "boxes": (B, N, 4)}`, and
            `"cross_attention"` `(B, H, N, h, w)` for attention maps.
        image_size: `(height, width)` of the images, for the pixel boxes.
        score_threshold: the least score kept.
        upsample_attention: resize the maps to the image size (bilinear).
        sizes: optional `(B, 2)` heights and widths of the images inside a
            padded batch (`image_size` is the padded size): each image's
            boxes in its own pixels, its upsampled maps cropped to it.
    """
    height, width = image_size
    logits = np.asarray(outputs["logits"], dtype="float64")
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    object_probs = probs[..., :-1]
    labels = object_probs.argmax(-1).astype("int32")
    scores = object_probs.max(-1).astype("float32")
    if sizes is None:
        sizes = np.array([[height, width]] * len(logits), "float32")
    sizes = np.asarray(sizes, "float32")
    scale = sizes[:, None, ::-1][..., [0, 1, 0, 1]]  # B, 1, 4: w, h, w, h
    corners = ops.convert_to_numpy(
        detection_loss.cxcywh_to_xyxy(
            ops.convert_to_tensor(outputs["boxes"], "float32")
        )
    )
    corners = np.clip(corners, 0.0, 1.0) * scale
    maps = None
    if "cross_attention" in outputs:
        maps = outputs["cross_attention"].mean(axis=1)  # B, N, h, w
        if upsample_attention:
            b, n, h, w = maps.shape
            resized = ops.image.resize(
                maps.reshape(b * n, h, w, 1), (height, width),
                interpolation="bilinear",
            )
            maps = ops.convert_to_numpy(resized).reshape(
                b, n, height, width
            )
            maps = maps / np.maximum(
                maps.sum(axis=(2, 3), keepdims=True), 1e-12
            )
    detections = []
    for index in range(len(scores)):
        keep = np.flatnonzero(scores[index] >= score_threshold)
        keep = keep[np.argsort(-scores[index, keep], kind="stable")]
        item = {
            "boxes": corners[index, keep].astype("float32"),
            "scores": scores[index, keep],
            "labels": labels[index, keep],
        }
        if maps is not None:
            item["attention"] = maps[index, keep].astype("float32")
            if upsample_attention:  # the image without its padding
                h, w = sizes[index].astype("int64")
                crop = item["attention"][:, :h, :w]
                item["attention"] = crop / np.maximum(
                    crop.sum(axis=(1, 2), keepdims=True), 1e-12
                )
        detections.append(item)
    return detections
