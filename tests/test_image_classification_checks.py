"""Checks of the image classifiers a user meets when fine-tuning: class ids
outside the head, a preset at another image size, a preset's new head
keeping the model's name."""

import os

import keras
import numpy as np
import pytest

from keras_attention.applications import presets
from keras_attention.applications.cbam_resnet import CBAMResNet
from keras_attention.applications.converters import common
from keras_attention.applications.vision_transformer import VisionTransformer

TINY_RESNET = dict(image_size=8, num_channels=1, num_classes=3, filters=(4,))


def _needs_weights(name):
    spec = presets.get_preset(name)
    if not os.path.isfile(spec.weights_path):
        pytest.skip(f"{spec.weights_path} not trained yet")


@pytest.mark.parametrize("labels", [[0, 1, 2, 3], [-1, 0, 1, 2]])
def test_class_ids_outside_the_head_are_refused(labels):
    # Under XLA (a GPU's default) the sparse cross-entropy of such a label
    # is a silent NaN that ruins the weights; outside it TensorFlow raises
    # a graph error.
    model = CBAMResNet(**TINY_RESNET)
    model.compile(jit_compile=True)
    x = np.zeros((4, 8, 8, 1), "float32")
    y = np.array(labels)
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(ValueError, match=r"class ids in \[0, 3\)"):
        model.fit(x, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="num_classes=3"):
        model.evaluate(x, y, verbose=0)
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, model.weights))


def test_labels_of_other_losses_are_not_taken_for_class_ids():
    model = CBAMResNet(**{**TINY_RESNET, "num_classes": 1})
    model.compile(
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        weighted_metrics=[],
    )
    x = np.zeros((4, 8, 8, 1), "float32")
    model.evaluate(x, np.array([0.0, 1.0, 1.0, 0.0]), verbose=0)


def test_preset_with_new_classes_keeps_the_given_name():
    model = CBAMResNet.from_preset(
        "cbam_resnet_digits", load_weights=False, num_classes=2, name="mine"
    )
    assert model.name == "mine" and model.num_classes == 2


def test_vit_preset_at_another_image_size_resamples_the_position_embedding():
    _needs_weights("vit_digits")
    base = VisionTransformer.from_preset("vit_digits")
    model = VisionTransformer.from_preset(
        "vit_digits", image_size=(32, 24), num_classes=3
    )
    assert model.input_shape == (None, 32, 24, 1)
    assert model.output_shape == (None, 3)
    old = base.backbone.get_layer("patch_embedding").position_embedding
    new = model.backbone.get_layer("patch_embedding").position_embedding
    expected = common.resample_position_embedding(
        keras.ops.convert_to_numpy(old), (4, 4), (8, 6), prefix_tokens=1
    )
    np.testing.assert_allclose(new.numpy(), expected, atol=1e-7)
    np.testing.assert_array_equal(new.numpy()[:, 0], old.numpy()[:, 0])
    others = [
        (a, b) for a, b in zip(base.backbone.weights, model.backbone.weights)
        if a is not old
    ]
    assert len(others) == len(base.backbone.weights) - 1
    for a, b in others:
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="a divisor of image_size"):
        VisionTransformer.from_preset("vit_digits", image_size=30)


def test_one_hot_labels_with_a_categorical_loss_keep_the_default_accuracy():
    # `compile(loss=CategoricalCrossentropy(...))` with one-hot labels: the
    # default accuracy follows the labels (a sparse accuracy crashed).
    keras.utils.set_random_seed(0)
    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    model.compile(
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    x = np.random.default_rng(0).random((6, 8, 8, 1)).astype("float32")
    labels = np.array([0, 1, 2, 0, 1, 2])
    one_hot = np.eye(3, dtype="float32")[labels]
    logs = model.evaluate(x, one_hot, return_dict=True, verbose=0)
    predicted = keras.ops.convert_to_numpy(model(x)).argmax(-1)
    assert logs["accuracy"] == pytest.approx(float(np.mean(predicted == labels)))
    sparse = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    sparse.set_weights(model.get_weights())
    sparse.compile(jit_compile=False)
    logs = sparse.evaluate(x, labels, return_dict=True, verbose=0)
    assert logs["accuracy"] == pytest.approx(float(np.mean(predicted == labels)))
