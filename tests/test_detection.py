"""Tests for DETR: the set loss against a scipy-matched NumPy reference,
target validation, training under XLA, saving, inference and COCO mAP."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy import optimize  # noqa: E402

from keras_attention.applications import detection_loss  # noqa: E402
from keras_attention.applications.detection import DETR  # noqa: E402
from keras_attention.applications import evaluate_detections  # noqa: E402
from keras_attention.applications.detection_layers import sine_position_encoding  # noqa: E402
from keras_attention.applications.detection_loss import validate_targets  # noqa: E402

NUM_CLASSES = 3
TINY = dict(
    num_classes=NUM_CLASSES,
    num_queries=4,
    hidden_dim=16,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=2,
    feedforward_dim=32,
    backbone_filters=(8, 16),
)


def numpy(x):
    return keras.ops.convert_to_numpy(x)


# NumPy reference, written from the paper's equations.


def np_xyxy(box):
    cx, cy, w, h = box
    return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])


def np_giou(a, b):
    """GIoU of two (cx, cy, w, h) boxes, one pair at a time."""
    a, b = np_xyxy(a), np_xyxy(b)
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = area(a) + area(b) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    return inter / union - (hull - union) / hull


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference_loss(logits, pred, boxes, labels, num_classes, eos_coef=0.1):
    """DETR's loss with scipy's Hungarian matching, image by image."""
    weighted_ce = weight_sum = l1 = giou = 0.0
    num_boxes = 0
    assignments = []
    for b in range(len(logits)):
        real = np.flatnonzero(labels[b] >= 0)
        probs = np_softmax(logits[b].astype("float64"))
        n = len(pred[b])
        cost = np.zeros((n, len(real)))
        for i in range(n):
            for k, j in enumerate(real):
                cost[i, k] = (
                    -probs[i, labels[b, j]]
                    + 5 * np.abs(pred[b, i] - boxes[b, j]).sum()
                    - 2 * np_giou(pred[b, i], boxes[b, j])
                )
        rows, cols = optimize.linear_sum_assignment(cost)
        assignment = np.full(labels.shape[1], -1)
        assignment[real[cols]] = rows
        assignments.append(assignment)
        target_class = np.full(n, num_classes)
        target_class[rows] = labels[b, real[cols]]
        log_probs = np.log(probs)
        for i in range(n):
            w = 1.0 if target_class[i] < num_classes else eos_coef
            weighted_ce -= w * log_probs[i, target_class[i]]
            weight_sum += w
        for i, k in zip(rows, cols):
            j = real[k]
            l1 += np.abs(pred[b, i] - boxes[b, j]).sum()
            giou += 1 - np_giou(pred[b, i], boxes[b, j])
        num_boxes += len(real)
    num_boxes = max(num_boxes, 1)
    class_loss = weighted_ce / weight_sum
    return {
        "class_loss": class_loss,
        "l1_loss": l1 / num_boxes,
        "giou_loss": giou / num_boxes,
        "loss": class_loss + 5 * l1 / num_boxes + 2 * giou / num_boxes,
        "assignment": np.array(assignments),
    }


def random_problem(rng, batch, num_queries, num_targets, num_classes):
    logits = rng.normal(size=(batch, num_queries, num_classes + 1)) * 2
    centres = rng.uniform(0.2, 0.8, (batch, num_queries, 2))
    sizes = rng.uniform(0.05, 0.4, (batch, num_queries, 2))
    pred = np.concatenate([centres, sizes], -1)
    t_centres = rng.uniform(0.25, 0.75, (batch, num_targets, 2))
    t_sizes = rng.uniform(0.05, 0.4, (batch, num_targets, 2))
    boxes = np.concatenate([t_centres, t_sizes], -1)
    labels = rng.integers(0, num_classes, (batch, num_targets))
    counts = rng.integers(0, num_targets + 1, batch)
    counts[0] = num_targets  # one full image
    counts[1] = 0  # one image without objects
    pad = np.arange(num_targets)[None, :] >= counts[:, None]
    labels = np.where(pad, -1, labels)
    boxes = np.where(pad[..., None], 0.0, boxes)
    cast = lambda x: x.astype("float32")  # noqa: E731
    return cast(logits), cast(pred), cast(boxes), labels.astype("int32")


# The loss.


def test_pairwise_generalized_iou_matches_reference():
    rng = np.random.default_rng(1)
    a = np.concatenate(
        [rng.uniform(0.2, 0.8, (5, 2)), rng.uniform(0.05, 0.5, (5, 2))], -1
    ).astype("float32")
    b = np.concatenate(
        [rng.uniform(0.2, 0.8, (3, 2)), rng.uniform(0.05, 0.5, (3, 2))], -1
    ).astype("float32")
    giou, iou = detection_loss.pairwise_generalized_iou(
        detection_loss.cxcywh_to_xyxy(a), detection_loss.cxcywh_to_xyxy(b)
    )
    expected = np.array([[np_giou(x, y) for y in b] for x in a])
    np.testing.assert_allclose(numpy(giou), expected, atol=1e-5)
    # Identical boxes: 1; disjoint boxes: IoU 0, GIoU negative.
    same = detection_loss.cxcywh_to_xyxy(a[:1])
    np.testing.assert_allclose(
        numpy(detection_loss.pairwise_generalized_iou(same, same)[0]), [[1.0]],
        atol=1e-6,
    )
    far = detection_loss.cxcywh_to_xyxy(np.array([[0.9, 0.9, 0.1, 0.1]], "float32"))
    g, i = detection_loss.pairwise_generalized_iou(same * 0 + [[0, 0, 0.1, 0.1]], far)
    assert numpy(i)[0, 0] == 0.0 and numpy(g)[0, 0] < 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_set_loss_matches_scipy_reference(seed):
    rng = np.random.default_rng(seed)
    logits, pred, boxes, labels = random_problem(rng, 5, 6, 4, NUM_CLASSES)
    ours = detection_loss.set_prediction_loss(
        logits, pred, boxes, labels, NUM_CLASSES
    )
    ref = reference_loss(logits, pred, boxes, labels, NUM_CLASSES)
    for key in ("class_loss", "l1_loss", "giou_loss", "loss"):
        np.testing.assert_allclose(numpy(ours[key]), ref[key], rtol=1e-4, err_msg=key)
    # Continuous random costs have a unique optimum: the same pairs.
    np.testing.assert_array_equal(numpy(ours["assignment"]), ref["assignment"])


def test_loss_settings_reach_every_term():
    rng = np.random.default_rng(6)
    logits, pred, boxes, labels = random_problem(rng, 4, 6, 4, NUM_CLASSES)
    ours = detection_loss.set_prediction_loss(
        logits, pred, boxes, labels, NUM_CLASSES, {"eos_coef": 0.3}
    )
    ref = reference_loss(logits, pred, boxes, labels, NUM_CLASSES, eos_coef=0.3)
    np.testing.assert_allclose(numpy(ours["loss"]), ref["loss"], rtol=1e-4)
    weighted = detection_loss.set_prediction_loss(
        logits, pred, boxes, labels, NUM_CLASSES,
        {"class_loss_weight": 2.0, "bbox_loss_weight": 0.5,
         "giou_loss_weight": 0.0},
    )
    np.testing.assert_allclose(
        numpy(weighted["loss"]),
        2.0 * numpy(weighted["class_loss"]) + 0.5 * numpy(weighted["l1_loss"]),
        rtol=1e-5,
    )


def test_stacked_layers_sum_their_losses():
    rng = np.random.default_rng(3)
    first = random_problem(rng, 3, 5, 3, NUM_CLASSES)
    second = random_problem(rng, 3, 5, 3, NUM_CLASSES)[:2] + first[2:]
    # Image-major stacking: (image 0 layer 0, image 0 layer 1, ...).
    stack = lambda a, b: np.stack([a, b], 1).reshape((-1,) + a.shape[1:])  # noqa: E731
    both = detection_loss.set_prediction_loss(
        stack(first[0], second[0]),
        stack(first[1], second[1]),
        np.repeat(first[2], 2, axis=0),
        np.repeat(first[3], 2, axis=0),
        NUM_CLASSES,
        num_layers=2,
    )
    total = sum(
        reference_loss(*p, NUM_CLASSES)["loss"] for p in (first, second)
    )
    np.testing.assert_allclose(numpy(both["loss"]), total, rtol=1e-4)


def test_loss_is_finite_without_boxes_and_with_full_images():
    rng = np.random.default_rng(4)
    logits, pred, boxes, labels = random_problem(rng, 2, 4, 4, NUM_CLASSES)
    empty = np.full_like(labels, -1)
    out = detection_loss.set_prediction_loss(logits, pred, boxes, empty, NUM_CLASSES)
    ref = reference_loss(logits, pred, boxes, empty, NUM_CLASSES)
    np.testing.assert_allclose(numpy(out["loss"]), ref["loss"], rtol=1e-5)
    assert numpy(out["l1_loss"]) == 0.0 and numpy(out["giou_loss"]) == 0.0
    full = rng.integers(0, NUM_CLASSES, labels.shape).astype("int32")
    out = detection_loss.set_prediction_loss(logits, pred, boxes, full, NUM_CLASSES)
    ref = reference_loss(logits, pred, boxes, full, NUM_CLASSES)
    np.testing.assert_allclose(numpy(out["loss"]), ref["loss"], rtol=3e-4)


def test_loss_sanitises_unchecked_targets():
    rng = np.random.default_rng(5)
    logits, pred, boxes, labels = random_problem(rng, 2, 4, 3, NUM_CLASSES)
    boxes[0, 0] = [np.nan, 0.5, 0.2, 0.2]
    boxes[0, 1] = [1.4, 0.5, -0.2, 0.3]
    labels[0, :2] = [1, 2]
    labels[1, 0] = 99  # out of range: treated as padding
    out = detection_loss.set_prediction_loss(logits, pred, boxes, labels, NUM_CLASSES)
    for key in ("loss", "class_loss", "l1_loss", "giou_loss"):
        assert np.isfinite(numpy(out[key])), key
    assert numpy(out["assignment"])[0, 0] == -1
    assert numpy(out["assignment"])[1, 0] == -1


def test_loss_gradients_are_finite_for_degenerate_boxes():
    logits = keras.Variable(np.zeros((1, 3, NUM_CLASSES + 1), "float32"))
    pred = keras.Variable(
        np.array(
            [[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.3, 0.3, 0.1, 0.1]]],
            "float32",
        )
    )
    boxes = np.array([[[0.5, 0.5, 0.2, 0.2], [0.7, 0.7, 0.1, 0.1]]], "float32")
    labels = np.array([[0, 2]], "int32")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("gradient check written with tf.GradientTape")
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = detection_loss.set_prediction_loss(
            logits, pred, boxes, labels, NUM_CLASSES
        )["loss"]
    grads = tape.gradient(loss, [logits, pred])
    assert all(np.all(np.isfinite(numpy(g))) for g in grads)


# Target validation.


def test_validate_targets_clips_trims_and_rejects():
    boxes = np.zeros((2, 6, 4), "float32")
    labels = np.full((2, 6), -1)
    boxes[0, 0] = [0.5, 0.5, 0.2, 0.2]
    boxes[0, 3] = [0.05, 0.5, 0.1004, 0.2]  # sticks out by 2e-4: clipped
    boxes[1, 5] = [0.3, 0.3, 0.1, 0.1]
    boxes[1, 2] = [np.nan] * 4  # padding may hold anything
    labels[0, [0, 3]] = [1, 2]
    labels[1, 5] = 0
    checked_boxes, checked_labels = validate_targets(
        boxes, labels, NUM_CLASSES, num_queries=3
    )
    # Real objects first, padding trimmed to num_queries columns.
    assert checked_boxes.shape == (2, 3, 4)
    np.testing.assert_array_equal(checked_labels, [[1, 2, -1], [0, -1, -1]])
    x0 = checked_boxes[0, 1, 0] - checked_boxes[0, 1, 2] / 2
    assert x0 >= 0.0 and abs(x0) < 1e-6
    assert np.all(np.isfinite(checked_boxes))

    def bad(change, match):
        b, lab = boxes.copy(), labels.copy()
        change(b, lab)
        with pytest.raises(ValueError, match=match):
            validate_targets(b, lab, NUM_CLASSES, num_queries=3)

    bad(lambda b, lab: b.__setitem__((0, 0), [0.95, 0.5, 0.2, 0.2]), "inside the image")
    bad(lambda b, lab: b.__setitem__((0, 0), [0.5, 0.5, -0.1, 0.2]), "positive widths")
    bad(lambda b, lab: b.__setitem__((0, 0), [0.5, np.inf, 0.1, 0.2]), "finite")
    bad(lambda b, lab: lab.__setitem__((0, 0), NUM_CLASSES), r"labels\[0, 0\]=3")
    bad(lambda b, lab: lab.__setitem__((0, 0), -2), "class ids")

    def too_many(b, lab):
        lab[1, :4] = 0
        b[1, :4] = [0.5, 0.5, 0.1, 0.1]

    bad(too_many, "at most num_queries=3")
    with pytest.raises(ValueError, match="shape"):
        validate_targets(boxes[..., :3], labels, NUM_CLASSES)


# The model.


def tiny_data(num_images=8, seed=0, image_size=16, max_objects=3):
    rng = np.random.default_rng(seed)
    images = np.zeros((num_images, image_size, image_size, 1), "float32")
    boxes = np.zeros((num_images, max_objects, 4), "float32")
    labels = np.full((num_images, max_objects), -1, "int32")
    for i in range(num_images):
        count = i % (max_objects + 1)  # includes images without objects
        for j in range(count):
            size = 4
            top, left = 1 + 5 * j, int(rng.integers(0, image_size - size))
            cls = int(rng.integers(NUM_CLASSES))
            images[i, top : top + size, left : left + size, 0] = (cls + 1) / 3
            boxes[i, j] = [
                (left + size / 2) / image_size,
                (top + size / 2) / image_size,
                size / image_size,
                size / image_size,
            ]
            labels[i, j] = cls
    return images, boxes, labels


def test_sine_position_encoding():
    pos = sine_position_encoding(3, 4, 8)
    assert pos.shape == (12, 8)
    # Rows 0..3 share the row half and differ in the column half.
    np.testing.assert_allclose(pos[0, :4], pos[3, :4])
    assert not np.allclose(pos[0, 4:], pos[1, 4:])
    # The first channel pair is sin/cos of the normalised position.
    np.testing.assert_allclose(pos[4, 0], np.sin(2 / 3 * 2 * np.pi), atol=1e-6)
    np.testing.assert_allclose(pos[1, 5], np.cos(2 / 4 * 2 * np.pi), atol=1e-6)
    with pytest.raises(ValueError, match="hidden_dim"):
        sine_position_encoding(2, 2, 6)


def test_output_shapes_and_attention():
    model = DETR(**TINY)
    images, _, _ = tiny_data(2)
    out = model(images, return_attention_scores=True)
    assert tuple(out["logits"].shape) == (2, 4, NUM_CLASSES + 1)
    assert tuple(out["boxes"].shape) == (2, 4, 4)
    assert tuple(out["aux_logits"].shape) == (2, 1, 4, NUM_CLASSES + 1)
    assert tuple(out["aux_boxes"].shape) == (2, 1, 4, 4)
    # 16x16 images, two stride-2 stages: a 4x4 grid.
    assert tuple(out["cross_attention"].shape) == (2, 2, 4, 4, 4)
    np.testing.assert_allclose(
        numpy(out["cross_attention"]).sum(axis=(3, 4)), 1.0, atol=1e-5
    )
    boxes = numpy(out["boxes"])
    assert np.all((boxes > 0) & (boxes < 1))
    single = DETR(**{**TINY, "num_decoder_layers": 1})
    assert set(single(images)) == {"logits", "boxes"}


def test_predict_on_images_of_several_sizes():
    # Keras traces a second input shape with unknown sizes; DETR's grid
    # (sine positions, reshapes) needs them, so each size is traced anew.
    model = DETR(**TINY)
    for size in (16, 24):
        images = tiny_data(2, image_size=size)[0][:, :, : size // 2]
        found = model.predict_boxes(images, score_threshold=0.0)
        assert found[0]["boxes"].shape == (4, 4)
        assert found[0]["boxes"][:, 2].max() <= size // 2


def test_pre_norm_and_mixed_precision_give_finite_losses():
    images, boxes, labels = tiny_data(4)
    y = {"boxes": boxes, "labels": labels}
    for kwargs in ({"norm_first": True}, {"dtype": "mixed_bfloat16"}):
        model = DETR(**TINY, **kwargs)
        out = model(images)
        loss = model.compute_loss(images, y, out)
        assert np.isfinite(float(numpy(loss))), kwargs
        assert numpy(out["boxes"]).dtype == np.float32


def test_cbam_backbone():
    model = DETR(**TINY, attention_module="cbam", attention_kwargs={"reduction": 4})
    images, _, _ = tiny_data(2)
    out = model(images)
    assert tuple(out["boxes"].shape) == (2, 4, 4)
    names = [w.path for w in model.weights]
    assert any("attention" in n for n in names)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="num_queries"):
        DETR(**{**TINY, "num_queries": 0})
    with pytest.raises(ValueError, match="hidden_dim"):
        DETR(**{**TINY, "hidden_dim": 18})
    with pytest.raises(ValueError, match=r'loss_settings\["eos_coef"\]'):
        DETR(**TINY, loss_settings={"eos_coef": 0.0})
    with pytest.raises(ValueError, match="loss_settings.*unknown keys"):
        DETR(**TINY, loss_settings={"eos_coeff": 0.2})
    with pytest.raises(ValueError, match="loss_settings"):
        DETR(**TINY, loss_settings=[("eos_coef", 0.2)])
    with pytest.raises(ValueError, match="not_a_layer|Unknown|unknown"):
        DETR(**TINY, attention_module="not_a_layer")
    with pytest.raises(ValueError, match="preset"):
        DETR.from_preset("nope")


def test_images_of_other_channels_are_refused_by_name_and_change_nothing():
    # The stem's error named no argument; on JAX, raised inside the traced
    # step, it left the model's variables emptied: every later `predict`
    # failed with "'NoneType' object is not callable".
    model = DETR(**TINY)
    model.compile(optimizer="adam")
    images, boxes, labels = tiny_data(2)
    want = model.predict(images, verbose=0)["boxes"]
    rgb = np.repeat(images, 3, axis=-1)
    for call in (
        lambda: model.predict(rgb, verbose=0),
        lambda: model.predict_boxes(rgb),
        lambda: model.evaluate(rgb, {"boxes": boxes, "labels": labels}, verbose=0),
        lambda: model.fit(rgb, {"boxes": boxes, "labels": labels}, verbose=0),
        lambda: model.predict(images[..., 0], verbose=0),
    ):
        with pytest.raises(ValueError, match=r"`images`.*\(B, height, width, 1\)"):
            call()
    np.testing.assert_allclose(model.predict(images, verbose=0)["boxes"], want)


def test_loss_settings_config_and_older_files():
    model = DETR(**TINY, loss_settings={"class_loss_weight": 2.0})
    config = model.get_config()
    assert config["loss_settings"] == {
        **detection_loss.LOSS_DEFAULTS, "class_loss_weight": 2.0
    }
    assert DETR.from_config(config).loss_settings == model.loss_settings
    # A config written before `loss_settings` held each setting on its own.
    legacy = {k: v for k, v in config.items() if k != "loss_settings"}
    legacy.update(eos_coef=0.2, class_loss_weight=2.0)
    restored = DETR.from_config(legacy)
    assert restored.loss_settings == {
        **detection_loss.LOSS_DEFAULTS, "eos_coef": 0.2,
        "class_loss_weight": 2.0,
    }


def test_fit_rejects_bad_targets_before_training():
    model = DETR(**TINY)
    model.compile(optimizer="adam", jit_compile=True)
    images, boxes, labels = tiny_data(4)
    bad_boxes = boxes.copy()
    bad_boxes[1, 0] = [0.5, 0.5, 0.2, -0.1]
    with pytest.raises(ValueError, match="positive widths"):
        model.fit(images, {"boxes": bad_boxes, "labels": labels}, epochs=1)
    bad_labels = labels.copy()
    bad_labels[1, 0] = 7
    with pytest.raises(ValueError, match="class ids"):
        model.fit(images, {"boxes": boxes, "labels": bad_labels}, epochs=1)
    many = np.tile(labels[3:4], (1, 2))  # 6 objects > 4 queries
    many_boxes = np.tile(boxes[3:4], (1, 2, 1))
    with pytest.raises(ValueError, match="num_queries=4"):
        model.fit(images[:1], {"boxes": many_boxes, "labels": many}, epochs=1)
    with pytest.raises(ValueError, match="'boxes'"):
        model.fit(images, labels, epochs=1)


@pytest.fixture(scope="module")
def trained():
    """A tiny DETR fitted for a few steps with jit_compile=True."""
    keras.utils.set_random_seed(0)
    model = DETR(**TINY)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=True)
    images, boxes, labels = tiny_data(8)
    # Wider padding than queries (trimmed by validate_targets), and one
    # image with as many objects as queries.
    boxes = np.concatenate([boxes, np.zeros((8, 3, 4), "float32")], 1)
    labels = np.concatenate([labels, np.full((8, 3), -1, "int32")], 1)
    labels[7, :4] = [0, 1, 2, 0]
    boxes[7, :4] = [[0.2, 0.2, 0.2, 0.2], [0.7, 0.2, 0.2, 0.2],
                    [0.2, 0.7, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]]
    y = {"boxes": boxes, "labels": labels}
    history = model.fit(images, y, epochs=12, batch_size=8, verbose=0)
    return model, images, y, history.history


@pytest.mark.xdist_group("detr_trained")  # one build of `trained`
def test_fit_with_xla_lowers_the_loss(trained):
    model, _, _, history = trained
    losses = history["loss"]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses
    assert {"class_loss", "l1_loss", "giou_loss"} <= set(history)


@pytest.mark.xdist_group("detr_trained")  # one build of `trained`
def test_predict_boxes(trained):
    model, images, _, _ = trained
    dets = model.predict_boxes(images, score_threshold=0.0)
    assert len(dets) == len(images)
    for d in dets:
        assert d["boxes"].shape == (4, 4) and d["labels"].shape == (4,)
        assert np.all(np.diff(d["scores"]) <= 0)
        assert np.all(d["boxes"][:, 2:] >= d["boxes"][:, :2])
        assert np.all((d["boxes"] >= 0) & (d["boxes"] <= 16))
    out = numpy(model(images[:1])["boxes"])[0]
    x1 = (out[:, 0] - out[:, 2] / 2).clip(0, 1) * 16
    np.testing.assert_allclose(np.sort(dets[0]["boxes"][:, 0]), np.sort(x1), atol=1e-4)
    with_maps = model.predict_boxes(
        images[:2], score_threshold=0.0, return_attention=True, upsample_attention=True
    )
    assert with_maps[0]["attention"].shape == (4, 16, 16)
    np.testing.assert_allclose(with_maps[0]["attention"].sum((1, 2)), 1.0, atol=1e-4)
    np.testing.assert_allclose(with_maps[0]["boxes"], dets[0]["boxes"], atol=1e-4)
    assert model.predict_boxes(images[:2], score_threshold=1.0)[0]["boxes"].shape == (0, 4)


@pytest.mark.xdist_group("detr_trained")  # one build of `trained`
def test_save_and_load(trained, tmp_path):
    model, images, _, _ = trained
    path = str(tmp_path / "detr.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded, DETR)
    a, b = model(images, training=False), loaded(images, training=False)
    for key in a:
        np.testing.assert_allclose(numpy(a[key]), numpy(b[key]), atol=1e-6)
    assert loaded.get_config() == model.get_config()


@pytest.mark.xdist_group("detr_trained")  # one build of `trained`
def test_evaluate_detections_against_known_answers(trained):
    _, images, y, _ = trained
    boxes, labels = validate_targets(y["boxes"], y["labels"], NUM_CLASSES)
    perfect = []
    for b, lab in zip(boxes, labels):
        real = lab >= 0
        c = b[real] * 16
        corners = np.concatenate([c[:, :2] - c[:, 2:] / 2, c[:, :2] + c[:, 2:] / 2], 1)
        perfect.append({"boxes": corners, "scores": np.ones(real.sum()), "labels": lab[real]})
    scores = evaluate_detections(perfect, images, boxes, labels, num_classes=NUM_CLASSES)
    assert scores["map"] == pytest.approx(1.0) and scores["map50"] == pytest.approx(1.0)
    # Shifted by a quarter of the width: IoU 0.6, a hit at 0.5, a miss at 0.75.
    shifted = [dict(p, boxes=p["boxes"] + [[1, 0, 1, 0]]) for p in perfect]
    scores = evaluate_detections(shifted, images, boxes, labels, num_classes=NUM_CLASSES)
    assert scores["map50"] == pytest.approx(1.0) and scores["map75"] == pytest.approx(0.0)
    # Right boxes, wrong classes: nothing found.
    wrong = [dict(p, labels=(p["labels"] + 1) % NUM_CLASSES) for p in perfect]
    assert evaluate_detections(wrong, images, boxes, labels)["map50"] == 0.0
    nothing = {
        "boxes": np.zeros((0, 4)), "scores": np.zeros(0), "labels": np.zeros(0, int)
    }
    empty = [nothing] * len(images)
    assert evaluate_detections(empty, images, boxes, labels)["map50"] == 0.0


def test_evaluate_detections_by_hand_and_labels_outside_the_classes():
    images = np.zeros((2, 64, 64, 1))
    boxes = np.array([[[0.25, 0.25, 0.25, 0.25], [0.75, 0.75, 0.25, 0.25]],
                      [[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]])
    labels = np.array([[0, 1], [0, -1]])
    corner = lambda cx, cy, w, h: 64 * np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    # One of the two class-0 objects found, first: COCO's 101-point AP of
    # recall 1/2 at precision 1 is 51/101; class 1 is missed (AP 0).
    found = [
        {"boxes": corner(*boxes[0, 0])[None], "scores": np.array([0.9]), "labels": np.array([0])},
        {"boxes": np.zeros((0, 4)), "scores": np.zeros(0), "labels": np.zeros(0, int)},
    ]
    scores = evaluate_detections(found, images, boxes, labels)
    assert scores["map50"] == pytest.approx(51 / 101 / 2)
    assert scores["mar100"] == pytest.approx(0.25)
    assert scores["num_objects"] == 3
    # Class 1 is outside num_classes=1: its object was left out unseen
    # (mAP 1 over class 0 alone).
    with pytest.raises(ValueError, match=r"`labels`.*\[0, 1\) for num_classes=1.*\[0, 1\]"):
        evaluate_detections(found, images, boxes, labels, num_classes=1)
    with pytest.raises(ValueError, match=r"`labels`.*\[-2, 0\]"):
        evaluate_detections(found, images, boxes, np.array([[0, -2], [0, -1]]))
    # A split without objects has no mAP (COCO's -1 was clipped to 0).
    with pytest.raises(ValueError, match=r"`labels`.*at least one object"):
        evaluate_detections(found, images, boxes, np.full((2, 2), -1))


@pytest.mark.xdist_group("detr_trained")  # one build of `trained`
def test_evaluate_detections_with_the_model(trained):
    model, images, y, _ = trained
    boxes, labels = validate_targets(y["boxes"], y["labels"], NUM_CLASSES)
    scores = evaluate_detections(model, images, boxes, labels)
    assert 0.0 <= scores["map"] <= scores["map50"] <= 1.0
    assert scores["num_detections"] == len(images) * model.num_queries


def test_shipped_preset_weights_detect_held_out_digits():
    from keras_attention.datasets import make_detection_set

    model = DETR.from_preset("detr_digits")
    test = make_detection_set(100, seed=4321, digit_split="test")
    scores = evaluate_detections(model, test.images, test.boxes, test.labels)
    # Measured: 0.856 on the benchmark's 1,000 held-out canvases; untrained
    # weights score about 0.
    assert scores["map50"] >= 0.7, scores
    fresh = DETR.from_preset("detr_digits", load_weights=False)
    assert evaluate_detections(fresh, test.images, test.boxes, test.labels)[
        "map50"
    ] < 0.1


def test_preset_with_other_classes_keeps_every_weight_but_the_class_head():
    """`from_preset(name, num_classes=K)`: fine-tuning on K other classes
    starts from the preset's backbone, transformer, queries and box head
    (it used to fail, its only way out `load_weights=False`)."""
    preset = DETR.from_preset("detr_digits")
    model = DETR.from_preset("detr_digits", num_classes=3)
    assert model.num_classes == 3
    assert tuple(model.class_head.kernel.shape) == (64, 4)
    head = {id(v) for v in model.class_head.weights}
    preset_head = {id(v) for v in preset.class_head.weights}
    kept = [v for v in model.weights if id(v) not in head]
    given = [v for v in preset.weights if id(v) not in preset_head]
    assert len(kept) == len(given) > 50
    for a, b in zip(kept, given):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    images = np.random.default_rng(0).random((1, 64, 64, 1), "float32")
    np.testing.assert_allclose(
        np.asarray(model(images)["boxes"]), np.asarray(preset(images)["boxes"]),
        atol=1e-6,
    )


def test_summary_of_a_built_detr_and_of_the_translators():
    # keras's `summary` of a subclassed model calls each layer's
    # `compute_output_shape` with the names its `build` recorded: the
    # decoder block's (tokens_shape, memory_shape) and keras-hub's
    # PositionEmbedding (inputs_shape) made it a TypeError.
    from keras_attention.applications import Seq2SeqTranslator
    from keras_attention.applications import TransformerTranslator

    lines = []
    model = DETR(**TINY)
    model.predict(np.zeros((1, 32, 32, 1), "float32"), verbose=0)
    model.summary(print_fn=lambda line, **kwargs: lines.append(line))
    assert f"{model.count_params():,}" in "\n".join(lines)
    for translator in (
        TransformerTranslator(num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16),
        Seq2SeqTranslator(embedding_dim=8, hidden_dim=8),
    ):
        lines = []
        translator.summary(print_fn=lambda line, **kwargs: lines.append(line))
        assert f"{translator.count_params():,}" in "\n".join(lines)


def test_detr_takes_uint8_images():
    # As the functional applications (ViT, CBAM-ResNet) do: the pixels in the
    # compute dtype, not a TypeError from the first convolution.
    model = DETR(**TINY)
    pixels = (np.random.default_rng(0).random((1, 32, 32, 1)) * 255).astype("uint8")
    out = model(pixels)
    expected = model(pixels.astype("float32"))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out["boxes"]),
        keras.ops.convert_to_numpy(expected["boxes"]), atol=1e-6,
    )
