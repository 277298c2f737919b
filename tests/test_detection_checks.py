"""DETR checks: training on a second image size, the
targets a user's own data brings (ragged lists, no objects at all, a
`tf.data` pipeline with an unknown number of objects), and
`plot_detections`' box checks."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_attention.applications.detection import DETR  # noqa: E402
from keras_attention.applications.detection_loss import validate_targets  # noqa: E402
from tests.test_detection import TINY  # noqa: E402

# The fewest layers, for the tests that trace a train step more than once.
SMALLEST = dict(
    TINY, num_queries=2, hidden_dim=8, num_decoder_layers=1,
    feedforward_dim=8, backbone_filters=(4,),
)


def targets(num_images, image_size):
    """One 4-pixel square (class 1) per image, padded to 2 columns."""
    images = np.zeros((num_images, image_size, image_size, 1), "float32")
    images[:, 2:6, 2:6] = 1.0
    side = 4 / image_size
    boxes = np.zeros((num_images, 2, 4), "float32")
    boxes[:, 0] = [4 / image_size, 4 / image_size, side, side]
    labels = np.array([[1, -1]] * num_images, "int32")
    return images, {"boxes": boxes, "labels": labels}


def test_a_second_image_size_or_target_width_is_traced_anew(monkeypatch):
    # `call` needs static image sizes and the matcher a static number of
    # target columns M; Keras traces a second shape with unknown sizes.
    # `predict` and `evaluate` traced each image size anew, `fit` did not,
    # nor any of them a second M: each failed inside the traced step (an
    # opaque TypeError; "expected the last two dimensions `(N, M)` to be
    # known statically"). Keras's `fit` and `evaluate` are replaced here by
    # a record of the functions they would reuse.
    import tensorflow as tf

    seen = []
    for method, function in [("fit", "train_function"),
                             ("evaluate", "test_function")]:
        monkeypatch.setattr(
            keras.Model, method,
            lambda self, *args, _f=function, **kwargs: seen.append(
                getattr(self, _f)
            ),
        )
    model = DETR(**SMALLEST)
    model.compile(optimizer="adam")
    images, y = targets(2, 16)
    for call in (model.fit, model.evaluate):
        call(images, y)
    model.train_function = model.test_function = "traced"
    for call in (model.fit, model.evaluate):
        call(images, y)  # the same shapes: kept
    assert seen[-2:] == ["traced", "traced"]
    narrower = {key: value[:, :1] for key, value in y.items()}
    for call in (model.fit, model.evaluate):
        call(images, narrower)
    assert seen[-2:] == [None, None]
    model.train_function = model.test_function = "traced"
    bigger, y_bigger = targets(2, 24)
    data = tf.data.Dataset.from_tensor_slices((bigger, y_bigger)).batch(2)
    for call in (model.fit, model.evaluate):
        call(data)  # another image size and M
    assert seen[-2:] == [None, None]
    model.train_function = model.test_function = "traced"
    for call in (model.fit, model.evaluate):
        call(bigger, y_bigger)  # the dataset's shapes
    assert seen[-2:] == ["traced", "traced"]


@pytest.mark.large
def test_fit_and_validate_on_a_second_image_size_and_target_width():
    import tensorflow as tf

    model = DETR(**SMALLEST)
    model.compile(optimizer="adam")
    images, y = targets(2, 16)
    model.fit(images, y, epochs=1, verbose=0, validation_data=(images, y))
    images, y = targets(2, 24)
    data = tf.data.Dataset.from_tensor_slices((images, y)).batch(2)
    model.fit(data, epochs=1, verbose=0, validation_data=(images, y))
    y = {key: value[:, :1] for key, value in y.items()}
    history = model.fit(
        images, y, epochs=1, verbose=0, validation_data=(images, y)
    )
    assert np.isfinite(history.history["val_loss"][-1])


def test_ragged_targets_are_refused_by_name():
    boxes = [np.array([[0.5, 0.5, 0.2, 0.2]]), np.zeros((0, 4))]
    labels = [np.array([1]), np.zeros((0,), int)]
    with pytest.raises(ValueError, match="pad .*-1"):
        validate_targets(boxes, labels, 3)


@pytest.mark.large
def test_fit_on_targets_without_any_object_after_others():
    # (B, 0, 4) targets (background images only) after targets with
    # objects: the matcher got an unknown M.
    model = DETR(**SMALLEST)
    model.compile(optimizer="adam", jit_compile=True)
    images, y = targets(4, 16)
    for columns in (1, 0):
        history = model.fit(
            images, {key: value[:, :columns] for key, value in y.items()},
            epochs=1, batch_size=4, verbose=0,
        )
        assert np.isfinite(history.history["loss"][-1])


def test_unknown_number_of_target_columns_is_refused_by_name():
    model = DETR(**TINY)
    images, y = targets(2, 16)
    y_pred = model(images)
    unknown = {
        "boxes": keras.KerasTensor((None, None, 4)),
        "labels": keras.KerasTensor((None, None), "int32"),
    }
    with pytest.raises(ValueError, match="padded_shapes"):
        model._loss_terms(unknown, y_pred)


def test_plot_detections_refuses_boxes_without_four_coordinates():
    from keras_attention.visualization import plot_detections

    image = np.zeros((16, 16))
    with pytest.raises(ValueError, match="`boxes`"):
        plot_detections(image, [[0.5, 0.5, 0.2]], [1])
    with pytest.raises(ValueError, match="`boxes`"):
        plot_detections(image, [0.5, 0.5, 0.2, 0.2, 0.1, 0.1, 0.2, 0.2], [1, 2])
    # Pixel boxes (`predict_boxes`'s) left at the normalised default were
    # drawn far outside the picture, without a word.
    with pytest.raises(ValueError, match="`boxes`.*normalized=False.*up to 12"):
        plot_detections(image, [[2, 2, 12, 12]], [1], box_format="xyxy")
    plot_detections(image, [[2, 2, 12, 12]], [1], box_format="xyxy", normalized=False)


def test_evaluate_detections_refuses_what_would_score_zero_unseen():
    from keras_attention.applications import evaluate_detections

    images = np.zeros((2, 32, 32, 1))
    boxes = np.array([[[0.25, 0.25, 0.25, 0.25], [0, 0, 0, 0]],
                      [[0.5, 0.5, 0.5, 0.5], [0, 0, 0, 0]]])
    labels = np.array([[0, -1], [1, -1]])
    found = [
        {"boxes": np.array([[4.0, 4, 12, 12]]), "scores": np.ones(1), "labels": np.array([0])},
        {"boxes": [], "scores": [], "labels": []},  # none, as plain lists
    ]
    assert evaluate_detections(found, images, boxes, labels)["map50"] == pytest.approx(0.5)
    # Ground truth `fit` refuses: a negative width, pixel boxes, names.
    negative = boxes.copy()
    negative[0, 0, 2] = -0.2
    for bad_boxes, bad_labels, match in [
        (negative, labels, r"`boxes`.*positive widths.*boxes\[0, 0\]"),
        (boxes * 32, labels, r"`boxes`.*inside the image"),
        (boxes, np.array([["a", "-"], ["b", "-"]]), r"`labels`.*integer"),
        (boxes, labels.astype(bool), r"`labels`.*integer"),
    ]:
        with pytest.raises(ValueError, match=match):
            evaluate_detections(found, images, bad_boxes, bad_labels)
    # Predictions COCO would skip (a class outside the categories) or
    # never match (corners in the wrong order, cx/cy/w/h).
    for change, match in [
        (dict(labels=np.array([2])), r"labels in \[0, 2\).*got \[2\] at image 0"),
        (dict(labels=np.array([-1])), r"labels in \[0, 2\)"),
        (dict(boxes=np.array([[8.0, 8, 8, 4]])), r"x1 <= x2.*boxes\[0\]=\[8.0, 8.0, 8.0, 4.0\]"),
        (dict(boxes=np.array([[4.0, 4, 12, np.inf]])), r"finite pixel corners"),
        (dict(scores=np.ones(2)), r"scores \(k,\).*scores \(2,\)"),
    ]:
        with pytest.raises(ValueError, match=r"`model_or_predictions`.*" + match):
            evaluate_detections([dict(found[0], **change), found[1]], images, boxes, labels)


def test_predict_boxes_checks_its_arguments_and_takes_an_empty_batch():
    model = DETR(**SMALLEST)
    images = np.zeros((2, 16, 16, 1), "float32")
    assert model.predict_boxes(images[:0]) == []
    assert model.predict_boxes(images[:0], return_attention=True) == []
    for arguments, name in [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(batch_size=0, return_attention=True), "batch_size"),
        (dict(score_threshold=None), "score_threshold"),
        (dict(score_threshold=-0.1), "score_threshold"),
        (dict(score_threshold=1.5), "score_threshold"),  # kept none
    ]:
        with pytest.raises(ValueError, match=f"`{name}`"):
            model.predict_boxes(images, **arguments)
    assert len(model.predict_boxes(images, score_threshold=0, batch_size=1)) == 2


def test_unchecked_targets_are_clipped_to_the_image_by_their_corners():
    from keras_attention.applications.detection_loss import sanitize_targets

    boxes = np.array([[[0.95, 0.5, 0.2, 0.2], [1.5, 0.5, 0.1, 0.1],
                       [0.5, 0.5, 0.4, 0.4], [np.nan, 0, 0, 0]]])
    clipped, clean_labels, mask = sanitize_targets(boxes, np.zeros((1, 4)), 2)
    clipped = keras.ops.convert_to_numpy(clipped)[0]
    # Sticking out on the right: its corners clipped (0.85..1.0), not its
    # centre and size apart (which left it sticking out).
    np.testing.assert_allclose(clipped[0], [0.925, 0.5, 0.15, 0.2], atol=1e-6)
    # Wholly outside: a sliver on the edge; inside: unchanged.
    np.testing.assert_allclose(clipped[1], [0.99995, 0.5, 1e-4, 0.1], atol=1e-6)
    np.testing.assert_allclose(clipped[2], [0.5, 0.5, 0.4, 0.4], atol=1e-6)
    assert keras.ops.convert_to_numpy(mask).tolist() == [[True, True, True, False]]


def test_a_frozen_backbone_stays_frozen_in_training_and_in_its_file(tmp_path):
    # Frozen before the first call, the backbone's layers (made in its
    # `build`) stayed trainable; and a `.keras` file, rebuilt the same way,
    # unfroze them (and the optimizer's slots no longer matched: its state
    # was dropped).
    model = DETR(**SMALLEST)
    images, y = targets(4, 16)
    model.backbone.trainable = False  # before the first call
    model(images[:1])
    backbone = {id(w) for w in model.backbone.weights}
    assert not backbone & {id(w) for w in model.trainable_weights}
    model.compile(optimizer="adam", jit_compile=False)
    model.fit(images, y, epochs=1, batch_size=4, verbose=0)
    model.save(tmp_path / "frozen.keras")
    loaded = keras.models.load_model(tmp_path / "frozen.keras")
    assert len(loaded.trainable_weights) == len(model.trainable_weights)
    assert int(loaded.optimizer.iterations) == 1
    before = [w.copy() for w in loaded.backbone.get_weights()]
    loaded.fit(images, y, epochs=1, batch_size=4, verbose=0)
    for old, new in zip(before, loaded.backbone.get_weights()):
        np.testing.assert_array_equal(new, old)


@pytest.mark.large  # CI time: float64 is checked on torch (test_float64)
def test_detr_trains_under_a_float64_floatx():
    # The matching cost's one-hot labels took floatx (float64) and met the
    # float32 probabilities: a TypeError in `fit` (float16 alike).
    from keras_attention import datasets
    from keras_attention.applications import DETR

    keras.config.set_floatx("float64")
    try:
        data = datasets.make_detection_set(2, image_size=16, max_objects=1,
                                           object_scale=(4, 6))
        model = DETR(num_classes=10, num_queries=2, hidden_dim=8, num_heads=2,
                     num_encoder_layers=1, num_decoder_layers=1,
                     feedforward_dim=8, backbone_filters=(4, 4))
        model.compile()
        history = model.fit(data.images, {"boxes": data.boxes, "labels": data.labels},
                            epochs=1, batch_size=2, verbose=0)
        assert np.isfinite(history.history["loss"][0])
    finally:
        keras.config.set_floatx("float32")
