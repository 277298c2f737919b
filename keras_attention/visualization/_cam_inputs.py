"""The arguments of `grad_cam`: the images, the classes to explain, the
Score-CAM options and the model's output, checked before any map is
computed."""

import keras
import numpy as np

from keras_attention._validation import check_positive_int
from keras_attention.visualization import _grid


def check_images(images):
    """The batch as float32 NumPy `(B, height, width, channels)`, `B >= 1`."""
    images = np.asarray(keras.ops.convert_to_numpy(images), "float32")
    _grid.check_image_batch(images)
    if not len(images):
        raise ValueError(
            "Received an invalid value for argument `images`, expected at "
            "least one image. Received: images.shape="
            f"{images.shape}"
        )
    return images


def check_score_cam_options(max_channels, batch_size):
    """Score-CAM's `max_channels` (a positive int or `None`) and
    `batch_size` (a positive int), checked for every method alike."""
    check_positive_int("max_channels", max_channels, allow_none=True)
    check_positive_int("batch_size", batch_size)


def check_outputs(outputs):
    if not keras.ops.is_tensor(outputs) or len(outputs.shape) != 2:
        raise ValueError(
            "Class activation maps need a classifier with one output "
            "(B, num_classes). Received: "
            f"{getattr(outputs, 'shape', type(outputs))}"
        )


def check_features(features, target):
    """Raise unless the target's tensor is a feature map `(B, h, w, C)` or
    tokens `(B, N, C)`, naming the layer that gave it."""
    shape = tuple(getattr(features, "shape", ()))
    if len(shape) not in (3, 4):
        raise ValueError(
            "Received an invalid value for argument `layer`, expected a layer "
            "whose output is a feature map (B, h, w, C) or tokens (B, N, C). "
            f"Received: layer={target.path!r} (output shape {shape})"
        )


def as_tensor(images):
    return keras.ops.convert_to_tensor(images)


def class_indices(model, images, class_index=None):
    """One class per image: the given one(s), or the predicted class."""
    count = len(images)
    if class_index is None:
        outputs = model(as_tensor(images), training=False)
        check_outputs(outputs)
        return [int(i) for i in np.argmax(keras.ops.convert_to_numpy(outputs), -1)]
    values = np.atleast_1d(np.asarray(class_index))
    if values.dtype.kind not in "iu" or values.ndim != 1 or (
        len(values) not in (1, count)
    ) or (values < 0).any():
        raise ValueError(
            "Received an invalid value for argument `class_index`, expected "
            f"None, a non-negative int or {count} of them (one per image). "
            f"Received: class_index={class_index!r}"
        )
    classes = _num_classes(model, images)
    if classes is not None and (values >= classes).any():
        raise ValueError(
            "Received an invalid value for argument `class_index`, expected "
            f"a class of the model's {classes} (0 to {classes - 1}). "
            f"Received: class_index={class_index!r}"
        )
    if len(values) == 1:
        values = np.repeat(values, count)
    return [int(i) for i in values]


def _num_classes(model, images):
    """The size of the model's class axis (its outputs' last), or `None`."""
    try:
        classes = model.outputs[0].shape[-1]
    except (AttributeError, IndexError, TypeError, ValueError):
        outputs = model(as_tensor(images[:1]), training=False)
        classes = getattr(outputs, "shape", (None,))[-1]
    return None if classes is None else int(classes)
