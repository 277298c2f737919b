"""What a user of the pictures meets: clear errors for wrong arguments of
`grad_cam`, `attention_rollout` and the plots; Grad-CAM of mixed-precision
and subclassed softmax classifiers equal to their float32 / logit twins;
pictures of the recipes that say which split they show."""

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention import recipes
from keras_attention.applications import VisionTransformer
from keras_attention.visualization import attention_rollout
from keras_attention.visualization import grad_cam
from keras_attention.visualization import plot_image_overlay


def small_cnn(output_dtype=None):
    inputs = keras.Input((6, 10, 1))
    x = keras.layers.Conv2D(3, 3, padding="same", name="conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    scores = keras.layers.Dense(4, name="scores", dtype=output_dtype)
    return keras.Model(inputs, scores(x))


class Subclassed(keras.Model):
    def __init__(self, activation=None):
        super().__init__()
        self.conv = keras.layers.Conv2D(3, 3, padding="same")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.scores = keras.layers.Dense(4, activation=activation)

    def call(self, x):
        return self.scores(self.pool(self.conv(x)))


IMAGES = np.random.default_rng(0).random((2, 6, 10, 1), "float32")


@pytest.mark.parametrize("make", [small_cnn, Subclassed])
@pytest.mark.parametrize("argument", ["batch_size", "max_channels"])
@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_grad_cam_checks_score_cam_options_on_both_engines(make, argument, value):
    with pytest.raises(ValueError, match=f"argument `{argument}`.*positive integer"):
        grad_cam(make(), IMAGES, method="scorecam", **{argument: value})


def test_grad_cam_of_a_layer_without_a_feature_map_names_the_layer():
    with pytest.raises(ValueError, match="argument `layer`.*Received: layer='pool'"):
        grad_cam(small_cnn(), IMAGES, layer="pool")


def test_grad_cam_of_an_empty_batch_names_the_images():
    with pytest.raises(ValueError, match="argument `images`, expected at least one"):
        grad_cam(small_cnn(), IMAGES[:0])


def test_rollout_with_no_layers_names_the_argument():
    vit = VisionTransformer(
        image_size=4, patch_size=2, num_classes=3, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, num_channels=1,
    )
    with pytest.raises(ValueError, match="argument `layers`"):
        attention_rollout(vit, np.zeros((1, 4, 4, 1)), layers=[])


def test_a_picture_path_that_is_a_folder_or_under_a_file_is_named(tmp_path):
    (tmp_path / "taken.png").mkdir()
    (tmp_path / "file").write_text("")
    for path in (tmp_path / "taken.png", tmp_path / "file" / "cam.png"):
        with pytest.raises(ValueError, match="argument `path`"):
            plot_image_overlay(np.zeros((4, 4)), np.ones((2, 2)), path=path)
    assert (tmp_path / "taken.png").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _titles(fig):
    texts = [ax.get_title() for ax in fig.axes]
    if fig._suptitle is not None:  # `get_suptitle` is matplotlib 3.8's
        texts.append(fig._suptitle.get_text())
    return " ".join(texts)


def _keep_figures_only(monkeypatch, figures):
    """The recipe saves no model nor page; its figures go to `figures`."""
    monkeypatch.setattr(recipes, "_save", lambda model, out, name: name)
    monkeypatch.setattr(recipes, "_explore", lambda *a, **k: "page.html")
    monkeypatch.setattr(recipes, "_close", figures.append)


def _recording(calls, result):
    """A stand-in for a training or scoring method: records its inputs."""
    def method(*args, **kwargs):
        calls.append((args, kwargs))
        return result
    return method


def test_classification_pictures_say_they_show_test_images(monkeypatch, tmp_path):
    # The recipe without its training: the pictures, and which split is
    # trained on and which scored (a recipe scoring its training images
    # would publish a wrong accuracy), are what is checked.
    from keras_attention import _run_data
    from keras_attention.applications import presets

    figures, fitted, scored = [], [], []
    monkeypatch.setattr(keras.Model, "fit", _recording(fitted, None))
    monkeypatch.setattr(keras.Model, "evaluate", _recording(scored, [1.0, 0.5]))
    _keep_figures_only(monkeypatch, figures)
    result = recipes.run_classification(
        "cbam_resnet", None, 1, str(tmp_path), 0, quick=True
    )
    assert len(figures) == 4
    for i, fig in enumerate(figures):
        assert f"test image {i}" in _titles(fig)
    size = presets.get_preset("cbam_resnet_digits").config["image_size"]
    (x_train, y_train), (x_test, y_test), _ = _run_data.image_data(None, 0, True, size)
    (_, x, y), _ = fitted[0]
    np.testing.assert_array_equal(x, x_train)
    (_, x, y), _ = scored[0]
    np.testing.assert_array_equal(x, x_test)
    np.testing.assert_array_equal(y, y_test)
    assert result.metrics["accuracy"] == 0.5


def test_graph_picture_and_notes_say_which_nodes(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(keras.Model, "fit", lambda self, *a, **k: None)
    monkeypatch.setattr(
        keras.Model, "evaluate", lambda self, *a, **k: {"accuracy": 0.5}
    )
    _keep_figures_only(monkeypatch, figures)
    result = recipes.run_node_classification("gat", None, 1, str(tmp_path), 0)
    assert "every node" in _titles(figures[0])
    assert any("test split" in note for note in result.notes)


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "scorecam"])
def test_grad_cam_of_a_mixed_precision_model(method):
    # tf-keras-vis mixes the bfloat16 feature map with float32 weights
    # (the scores in float32, as keras's mixed-precision guide advises).
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        half = small_cnn(output_dtype="float32")
    finally:
        keras.config.set_dtype_policy(previous)
    full = small_cnn()
    full.set_weights([np.asarray(w, "float32") for w in half.get_weights()])
    cam = grad_cam(half, IMAGES, class_index=1, method=method)
    expected = grad_cam(full, IMAGES, class_index=1, method=method)
    assert cam.shape == IMAGES.shape[:3] and cam.dtype == "float32"
    np.testing.assert_allclose(cam, expected, atol=0.05)


def test_rollout_of_a_windowed_attention_names_the_layer():
    model = keras.Sequential([
        keras.Input((4, 4, 8)),
        keras_attention.layers.LocalWindowAttention(
            num_heads=2, window_size=2, name="windows"
        ),
    ])
    with pytest.raises(ValueError, match="argument `layers`.*'windows'"):
        attention_rollout(model, np.ones((1, 4, 4, 8)), layers=["windows"])


def test_detection_pictures_say_they_show_test_canvases(monkeypatch, tmp_path):
    from keras_attention import applications

    from keras_attention import datasets

    figures, fitted, scored = [], [], []
    monkeypatch.setattr(keras.Model, "fit", _recording(fitted, None))
    monkeypatch.setattr(
        applications, "evaluate_detections", _recording(scored, {"map50": 0.5})
    )
    _keep_figures_only(monkeypatch, figures)
    recipes.run_detection("detr", None, 1, str(tmp_path), 0, quick=True)
    assert len(figures) == 3
    for i, fig in enumerate(figures):
        assert f"test canvas {i}" in _titles(fig)
    # Scored on the canvases of the digits' test split, trained on others.
    test = datasets.make_detection_set(64, seed=1000, digit_split="test")
    (_, images, boxes, labels), _ = scored[0]
    np.testing.assert_array_equal(images, test.images)
    np.testing.assert_array_equal(boxes, test.boxes)
    np.testing.assert_array_equal(labels, test.labels)
    (_, train_images, _), _ = fitted[0]
    assert train_images.shape[0] == 256
    assert not any(
        np.array_equal(image, test.images[0]) for image in train_images
    )


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "scorecam"])
def test_grad_cam_of_a_subclassed_model_reads_the_logits(method):
    # As for a functional model: the softmax of the output layer is made
    # linear while the map is computed, then restored.
    probabilities, logits = Subclassed("softmax"), Subclassed()
    probabilities(IMAGES)
    logits(IMAGES)
    logits.set_weights(probabilities.get_weights())
    cam = grad_cam(probabilities, IMAGES, class_index=1, method=method)
    expected = grad_cam(logits, IMAGES, class_index=1, method=method)
    np.testing.assert_allclose(cam, expected, atol=1e-5)
    assert probabilities.scores.activation is keras.activations.softmax


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "scorecam"])
def test_grad_cam_reads_the_logits_before_a_softmax_layer(method):
    # A `keras.layers.Softmax` output has no `activation` to make linear:
    # the map was the probabilities' (tf-keras-vis's too).
    inputs = keras.Input((6, 10, 1))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(3, name="scores")(x)
    with_softmax = keras.Model(inputs, keras.layers.Softmax()(logits))
    without = keras.Model(inputs, logits)
    cam = grad_cam(with_softmax, IMAGES, class_index=1, method=method, layer="conv")
    expected = grad_cam(without, IMAGES, class_index=1, method=method, layer="conv")
    np.testing.assert_allclose(cam, expected, atol=1e-5)
    probabilities = keras.ops.convert_to_numpy(with_softmax(IMAGES))
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)  # restored


def test_maps_of_a_vit_with_non_square_patches_use_its_grid(tmp_path):
    # 16 tokens of (2, 8) patches on 16 x 16 are an 8 x 2 grid; the tokens
    # and the image alone suggested 4 x 4 (square patches), a scrambled map.
    from keras_attention.visualization import explore

    vit = VisionTransformer(
        image_size=(16, 16), patch_size=(2, 8), num_classes=3, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8, num_channels=1,
    )
    x = np.random.default_rng(1).random((1, 16, 16, 1), "float32")
    assert attention_rollout(vit, x, upsample=False).shape == (1, 8, 2)
    assert grad_cam(vit, x, expand=False).shape == (1, 8, 2)
    page = explore(vit, x, tmp_path / "vit.html", cam_methods=())
    assert '"grid":[8,2]' in open(page, encoding="utf-8").read()


def _two_headed(nested):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 10, 1))
    x = keras.layers.Conv2D(3, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    dense = keras.layers.Dense(4, activation="softmax")
    if nested:
        head = keras.Sequential([keras.Input((3,)), dense], name="head")
        return keras.Model(inputs, head(x))
    return keras.Model(inputs, dense(x))


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "scorecam"])
def test_grad_cam_reads_the_logits_of_a_nested_softmax_head(method):
    flat, nested = _two_headed(False), _two_headed(True)
    nested.set_weights(flat.get_weights())
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(nested(IMAGES)),
        keras.ops.convert_to_numpy(flat(IMAGES)), rtol=1e-6,
    )
    # Was computed on the nested head's probabilities (0.28 apart).
    np.testing.assert_allclose(
        grad_cam(nested, IMAGES, method=method), grad_cam(flat, IMAGES, method=method),
        atol=1e-5,
    )


def test_grad_cam_of_a_feature_layer_shared_by_two_models():
    conv = keras.layers.Conv2D(3, 3, padding="same", activation="relu")

    def classifier():
        inputs = keras.Input((6, 10, 1))
        x = keras.layers.GlobalAveragePooling2D()(conv(inputs))
        return keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))

    first, second = classifier(), classifier()
    assert grad_cam(first, IMAGES).shape == grad_cam(second, IMAGES).shape == (2, 6, 10)


def test_score_cam_of_a_single_sigmoid_output_finds_the_patch():
    # One logit: a softmax over it is 1 for every masked copy (a constant
    # map); its sigmoid scores the copies.
    image = np.zeros((1, 12, 20, 1), "float32")
    image[0, :4, 14:18] = 1.0
    inputs = keras.Input((12, 20, 1))
    conv = keras.layers.Conv2D(2, 1, use_bias=False)
    dense = keras.layers.Dense(1, activation="sigmoid", use_bias=False)
    model = keras.Model(
        inputs, dense(keras.layers.GlobalAveragePooling2D()(conv(inputs)))
    )
    conv.set_weights([np.array([[[[1.0, -1.0]]]], "float32")])
    dense.set_weights([np.array([[1.0], [0.0]], "float32")])
    cam = grad_cam(model, image, method="scorecam")[0]
    assert cam.max() > 0.9 and cam[:4, 14:18].min() > 0.9
    assert cam[6:, :10].max() < 0.1


def test_explorer_takes_uint8_images_and_shows_every_call_of_a_shared_layer(tmp_path):
    from keras_attention.layers import CBAM
    from keras_attention.layers import MultiHeadAttention
    from keras_attention.visualization import explore

    inputs = keras.Input((6, 10, 3))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(CBAM(reduction=2)(x))
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    pixels = np.random.default_rng(2).integers(0, 256, (2, 6, 10, 3)).astype("uint8")
    page = explore(model, pixels, tmp_path / "uint8.html", cam_methods=())
    assert '"kind":"image"' in open(page, encoding="utf-8").read()

    tokens = keras.Input((5, 8))
    shared = MultiHeadAttention(2, 4, name="shared")
    model = keras.Model(tokens, shared(shared(tokens, tokens), shared(tokens, tokens)))
    page = explore(model, np.random.default_rng(3).random((1, 5, 8)), tmp_path / "s.html")
    text = open(page, encoding="utf-8").read()
    assert '"name":"shared (call 3)"' in text and '"name":"shared"' in text


@pytest.mark.parametrize("make", [small_cnn, Subclassed])
def test_score_cam_with_more_channels_allowed_than_the_map_has(make):
    # tf-keras-vis (the graph models' engine on TensorFlow) refused a
    # `max_N` above the channel count, so the explorer's 64 lost Score-CAM
    # for every small CNN; the tape path took all channels.
    model = make()
    model(IMAGES)
    np.testing.assert_allclose(
        grad_cam(model, IMAGES, method="scorecam", max_channels=64),
        grad_cam(model, IMAGES, method="scorecam"), atol=1e-6,
    )


def test_attention_maps_from_two_threads_each_get_their_own():
    # The maps patched the shared layer's `call` for all threads: a
    # request served meanwhile was recorded into them, and two passes
    # ending out of order returned each other's weights and left the
    # layer patched for good. A layer that waits on events orders them.
    import threading

    from keras_attention.layers import MultiHeadAttention
    from keras_attention.visualization import attention_maps

    gates = {}

    class Gate(keras.layers.Layer):
        def call(self, x):
            gate = gates.get(threading.current_thread().name)
            if gate is not None:
                gate()
            return x

    inputs = keras.Input((4, 8))
    layer = MultiHeadAttention(num_heads=1, key_dim=4, name="mha")
    model = keras.Model(inputs, layer(Gate()(inputs)))
    rng = np.random.default_rng(0)
    xa, xb = (rng.standard_normal((1, 4, 8)).astype("float32") for _ in range(2))
    want_a = attention_maps(model, xa)["mha"]
    want_b = attention_maps(model, xb)["mha"]
    got = {}

    def run(name, target):
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    # A serves `model(xb)` while A's maps pass waits inside the model.
    inside, served = threading.Event(), threading.Event()
    gates["A"] = lambda: (inside.set(), served.wait(10))
    a = run("A", lambda: got.update(A=attention_maps(model, xa)))
    inside.wait(10)
    model(xb)
    served.set()
    a.join(20)
    np.testing.assert_allclose(got["A"]["mha"], want_a, atol=1e-6)

    # B starts after A and ends after it.
    b_inside, a_done = threading.Event(), threading.Event()
    gates["A"] = lambda: b_inside.wait(10)
    gates["B"] = lambda: (b_inside.set(), a_done.wait(10))
    a = run("A", lambda: (got.update(A=attention_maps(model, xa)), a_done.set()))
    b = run("B", lambda: got.update(B=attention_maps(model, xb)))
    a.join(20)
    b.join(20)
    gates.clear()
    np.testing.assert_allclose(got["A"]["mha"], want_a, atol=1e-6)
    np.testing.assert_allclose(got["B"]["mha"], want_b, atol=1e-6)
    assert "call" not in layer.__dict__, "the layer stayed patched"
