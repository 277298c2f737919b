"""Pictures on the JAX and torch backends: the same maps as on TensorFlow.

The in-process tests run on the backend in use (`KERAS_BACKEND=jax
python -m pytest tests/test_visualization_backends.py`); the `large` one
starts one process per backend (keras's backend is fixed per process) and
compares their maps for the same weights.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attention import layers as ka_layers
from keras_attention import visualization as vis
from keras_attention.applications import VisionTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _set_weights(model, seed=0):
    """Weights from NumPy, the same on every backend."""
    rng = np.random.default_rng(seed)
    model.set_weights(
        [rng.normal(0.0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    return model


def _cnn():
    """Conv -> ReLU -> CBAM -> global average -> softmax: a functional model
    that tf-keras-vis handles on TensorFlow."""
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    x = ka_layers.CBAM(reduction=2, name="cbam")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(x)
    return _set_weights(keras.Model(inputs, outputs))


def _vit():
    model = VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=2,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    model(np.zeros((1, 8, 8, 1), "float32"))
    return _set_weights(model, seed=1)


def _images(count=2):
    return np.random.default_rng(2).random((count, 8, 8, 1)).astype("float32")


def pictures():
    """Every picture of the two small models, as `{name: array}`."""
    found = {}
    images = _images()
    for name, model in (("cnn", _cnn()), ("vit", _vit())):
        for method in vis.cam.METHODS:
            found[f"{name}/{method}"] = vis.grad_cam(
                model, images, class_index=[0, 2], method=method
            )
        found[f"{name}/gradcam_batch_1"] = vis.grad_cam(model, images[:1])
    found["vit/rollout"] = vis.attention_rollout(_vit(), images)
    for path, weights in vis.attention_maps(_vit(), images).items():
        found[f"vit/maps/{path}"] = weights
    return found


def test_grad_cam_is_the_closed_form_on_this_backend():
    """Conv -> GAP -> Dense: the gradient at the conv output is the dense
    kernel's column over h * w, so Grad-CAM is ReLU(A @ W[:, c]), scaled
    to [0, 1]; on JAX and torch this failed inside TensorFlow's tape."""
    inputs = keras.Input((6, 6, 2))
    features = keras.layers.Conv2D(3, 3, padding="same", activation="relu", name="conv")(inputs)
    pooled = keras.layers.GlobalAveragePooling2D()(features)
    model = _set_weights(keras.Model(inputs, keras.layers.Dense(2, name="head")(pooled)))
    images = np.random.default_rng(3).random((1, 6, 6, 2)).astype("float32")
    for subclassed in (False, True):  # tf-keras-vis's route and the tape's
        if subclassed:
            wrapper = keras.Sequential([keras.Sequential(model.layers[1:], name="inner")])
            wrapper.build((None, 6, 6, 2))
            got = vis.grad_cam(wrapper, images, class_index=1, layer="conv", expand=False)
        else:
            got = vis.grad_cam(model, images, class_index=1, layer="conv", expand=False)
        maps = keras.Model(inputs, features).predict(images, verbose=0)
        kernel = keras.ops.convert_to_numpy(model.get_layer("head").kernel)[:, 1]
        cam = np.maximum(maps @ kernel, 0.0)
        cam = (cam - cam.min()) / (cam.max() - cam.min() + keras.config.epsilon())
        np.testing.assert_allclose(got, cam, atol=2e-5)


def test_grad_cam_of_a_vision_transformer_on_this_backend():
    images = _images(1)
    for method in ("gradcam", "gradcam++"):
        cam = vis.grad_cam(_vit(), images, method=method)
        assert cam.shape == (1, 8, 8) and np.isfinite(cam).all()
        assert cam.min() >= 0.0 and cam.max() <= 1.0


def test_explorer_image_page_has_its_cams_on_this_backend(tmp_path):
    """The page's Grad-CAMs: on JAX and torch each was a note with the
    TensorFlow error instead."""
    from tests.test_explorer import page_data

    data = page_data(vis.explore(_vit(), _images(1), tmp_path / "vit.html"))
    assert [c["name"] for c in data["cams"]] == ["Grad-CAM", "Grad-CAM++", "Score-CAM"]
    assert not [note for note in data["notes"] if "not computed" in note]


def test_plots_and_rollout_take_the_weights_a_layer_returns(tmp_path):
    """On torch a layer's weights record gradients: NumPy refused them."""
    x = _images(1).reshape(1, 4, 16)
    _, weights = ka_layers.MultiHeadAttention(2, 4)(x, x, return_attention_scores=True)
    _, (_, spatial) = ka_layers.CBAM(reduction=1)(
        _images(1), return_attention_scores=True
    )
    figure = vis.plot_attention_heatmap(
        weights[0], list("abcd"), list("wxyz"), path=tmp_path / "heat.png"
    )
    assert figure is not None and (tmp_path / "heat.png").exists()
    vis.plot_image_overlay(_images(1)[0], spatial[0, ..., 0], path=tmp_path / "map.png")
    rolled = vis.rollout_matrices([weights, weights])
    np.testing.assert_allclose(rolled.sum(-1), 1.0, atol=1e-5)


@pytest.mark.large
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_pictures_agree_with_tensorflow(backend, tmp_path):
    """Grad-CAM (tf-keras-vis on TensorFlow, the backend's gradients
    elsewhere), Score-CAM, rollout and the maps for the same weights."""
    runs = {}
    for name in ("tensorflow", backend):
        path = tmp_path / f"{name}.npz"
        code = (
            f"import sys; sys.path.insert(0, {ROOT!r}); import numpy as np\n"
            "from tests.test_visualization_backends import pictures\n"
            f"np.savez({str(path)!r}, **pictures())\n"
        )
        env = dict(os.environ, KERAS_BACKEND=name, TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True,
            text=True, timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = dict(np.load(path))
    reference, got = runs["tensorflow"], runs[backend]
    assert sorted(got) == sorted(reference), json.dumps(sorted(got))
    for key in reference:
        np.testing.assert_allclose(got[key], reference[key], atol=2e-4, err_msg=key)
