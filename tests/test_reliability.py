"""Saved files that were tampered with, determinism, and resuming training."""

import json
import sys
import zipfile

import keras
import numpy as np
import pytest

from keras_attention.layers import AdditiveAttention, MultiHeadAttention


def small_model(dropout=0.1):
    tokens = keras.Input((8, 6))
    h = MultiHeadAttention(num_heads=2, key_dim=4, dropout=dropout, seed=3)(tokens)
    h = AdditiveAttention(units=4, dropout=dropout, seed=4)([h, tokens])
    out = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(tokens, out)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8, 6)).astype("float32")
    return x, x.mean(axis=(1, 2), keepdims=False)[:, None] * 3


def rewrite_config(path, out_path, change):
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(out_path, "w") as target:
        for item in source.infolist():
            content = source.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(content)
                change(config)
                content = json.dumps(config).encode()
            target.writestr(item, content)


def find_layer_config(config, class_name):
    if isinstance(config, dict):
        if config.get("class_name") == class_name:
            return config
        for value in config.values():
            found = find_layer_config(value, class_name)
            if found:
                return found
    if isinstance(config, list):
        for value in config:
            found = find_layer_config(value, class_name)
            if found:
                return found
    return None


@pytest.mark.parametrize(
    "module, registered_name",
    [
        ("ka_tamper_marker", "ka_tamper_marker>Evil"),  # a module on the path
        ("os", "os>system"),  # an arbitrary standard module
        ("keras_attention.layers", "keras_attention>NoSuchLayer"),  # unknown class
    ],
)
def test_tampered_keras_file_fails_clearly_and_imports_nothing(
    tmp_path, monkeypatch, module, registered_name
):
    (tmp_path / "ka_tamper_marker.py").write_text(
        "import sys\nsys.modules['ka_tamper_imported'] = True\n"
        "import keras\nclass Evil(keras.layers.Layer):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = small_model()
    path = tmp_path / "model.keras"
    model.save(path)

    def change(config):
        layer = find_layer_config(config, "MultiHeadAttention")
        layer["module"] = module
        layer["class_name"] = registered_name.split(">")[1]
        layer["registered_name"] = registered_name

    tampered = tmp_path / "tampered.keras"
    rewrite_config(path, tampered, change)
    with pytest.raises((TypeError, ValueError), match=registered_name.split(">")[1]):
        keras.saving.load_model(tampered, safe_mode=True)
    assert "ka_tamper_imported" not in sys.modules
    assert "ka_tamper_marker" not in sys.modules


def train(epochs, initial_epoch=0, model=None, dropout=0.1):
    x, y = data()
    if model is None:
        model = small_model(dropout)
        model.compile(keras.optimizers.Adam(1e-2), "mse", jit_compile=True)
    model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch,
              shuffle=False, verbose=0)
    return model


def test_two_seeded_runs_give_the_same_weights():
    keras.utils.set_random_seed(7)
    first = train(2).get_weights()
    keras.utils.set_random_seed(7)
    second = train(2).get_weights()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_stopped_and_resumed_run_ends_with_the_same_weights(tmp_path):
    # Without dropout: a `.keras` file holds the weights and the optimizer
    # state but not Keras's SeedGenerator states, so a resumed run draws
    # other dropout masks (a Keras-wide limitation, documented in README).
    keras.utils.set_random_seed(11)
    uninterrupted = train(4, dropout=0.0).get_weights()

    keras.utils.set_random_seed(11)
    model = train(2, dropout=0.0)
    path = tmp_path / "checkpoint.keras"
    model.save(path)
    resumed = keras.saving.load_model(path, safe_mode=True)
    resumed = train(4, initial_epoch=2, model=resumed)
    for a, b in zip(uninterrupted, resumed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
