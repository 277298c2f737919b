"""Tests of GATNodeClassifier on the embedded karate club graph."""

import os

import keras
import numpy as np
import pytest

from keras_attention.applications.node_classification import GATEarlyStopping
from keras_attention.applications.node_classification import GATNodeClassifier
from keras_attention.applications.node_classification import node_classification_data
from keras_attention.datasets import load_karate_club


@pytest.fixture(scope="module")
def karate():
    return node_classification_data(load_karate_club(seed=0, num_train_per_class=4))


def elu(x):
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


def reference_gat_layer(layer, x, edges, concat):
    """GAT (v1) from the paper's equations, with one self loop per node."""
    kernel, a_source, a_target, bias = (
        keras.ops.convert_to_numpy(w)
        for w in (layer.kernel, layer.attention_source, layer.attention_target, layer.bias)
    )
    n = x.shape[0]
    heads, units = a_source.shape
    h = (x @ kernel).reshape(n, heads, units)
    source = np.concatenate([edges[0], np.arange(n)])
    target = np.concatenate([edges[1], np.arange(n)])
    e = (h[source] * a_source).sum(-1) + (h[target] * a_target).sum(-1)
    e = np.where(e > 0, e, 0.2 * e)  # LeakyReLU(0.2), (E + N, H)
    out = np.zeros((n, heads, units))
    for i in range(n):
        incoming = target == i
        alpha = np.exp(e[incoming] - e[incoming].max(0))
        alpha /= alpha.sum(0)
        out[i] = (alpha[:, :, None] * h[source[incoming]]).sum(0)
    out = out.reshape(n, heads * units) if concat else out.mean(1)
    return out + bias


def test_gat_matches_the_paper_equations(karate):
    model = GATNodeClassifier(
        num_features=34, num_classes=2, hidden_units=4, num_heads=3, output_heads=2
    )
    features, edges = karate.inputs[0][0], karate.inputs[1][0]
    hidden = elu(reference_gat_layer(model.get_layer("graph_attention_1"), features, edges, True))
    logits = reference_gat_layer(model.get_layer("graph_attention_2"), hidden, edges, False)
    out = keras.ops.convert_to_numpy(model(karate.inputs, training=False))
    assert out.shape == (1, 34, 2)
    np.testing.assert_allclose(out[0], logits, atol=1e-4)
    first, second = model.attention_scores(karate.inputs)
    assert tuple(first.shape) == (156 + 34, 3) and tuple(second.shape) == (190, 2)


def test_gat_trains_with_early_stopping_and_saves(karate, tmp_path):
    keras.utils.set_random_seed(0)
    assert GATNodeClassifier.from_preset("gat_karate").dropout == 0.6
    # Less dropout than the paper's 0.6, so 15 epochs show the loss falling.
    model = GATNodeClassifier.from_preset("gat_karate", dropout=0.2)
    assert (model.hidden_units, model.num_heads) == (8, 8)
    model.compile(optimizer=keras.optimizers.Adam(0.01), jit_compile=True)
    stopper = GATEarlyStopping(patience=10)
    history = model.fit(
        karate.inputs,
        karate.labels,
        sample_weight=karate.train_weights,
        validation_data=(karate.inputs, karate.labels, karate.val_weights),
        epochs=15,
        callbacks=[stopper],
        verbose=0,
    )
    losses = history.history["loss"]
    assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses
    assert stopper.best_epoch is not None
    path = os.path.join(tmp_path, "gat.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(karate.inputs)),
        keras.ops.convert_to_numpy(model(karate.inputs)),
        atol=1e-6,
    )
    # The weighted loss is the mean over the training nodes only.
    assert karate.train_weights.sum() == pytest.approx(34.0)
    assert (karate.train_weights > 0).sum() == 8


def test_l2_is_half_weight_decay_times_squared_norm():
    model = GATNodeClassifier(num_features=5, num_classes=2, weight_decay=5e-4)
    kernel = model.get_layer("graph_attention_1").kernel
    expected = 2.5e-4 * np.sum(keras.ops.convert_to_numpy(kernel) ** 2)
    assert float(kernel.regularizer(kernel)) == pytest.approx(expected, rel=1e-5)


def test_bad_graphs_raise_expected_versus_received(karate):
    model = GATNodeClassifier(num_features=34, num_classes=2)
    features, edges = karate.inputs
    bad = edges.copy()
    bad[0, 1, 0] = 34
    with pytest.raises(ValueError, match=r"node ids in \[0, 34\).*Received: edges with values in \[0, 34\]"):
        model.predict([features, bad], verbose=0)
    with pytest.raises(ValueError, match=r"expected a batch of one graph \(1, N, 34\)"):
        model.predict([features[:, :, :30], edges], verbose=0)
    with pytest.raises(ValueError, match=r"\(1, 2, E\).*Received: edges.shape=\(1, 3, 156\)"):
        model([features, np.concatenate([edges, edges[:, :1]], 1)])
    with pytest.raises(ValueError, match="Received: attention='gat'"):
        GATNodeClassifier(num_features=34, num_classes=2, attention="gat")
    with pytest.raises(ValueError, match="known presets"):
        GATNodeClassifier.from_preset("gat_reddit")


def test_out_of_range_edges_as_eager_tensors_raise_before_tracing(karate):
    # Tensors (not only NumPy arrays) have known values too: a ValueError
    # naming `edges`, not an error from inside the traced step.
    model = GATNodeClassifier(num_features=34, num_classes=2)
    features, edges = karate.inputs
    bad = edges.copy()
    bad[0, 0, 3] = -1
    for method in (model.predict, model.evaluate):
        with pytest.raises(ValueError, match=r"`edges`, expected node ids in \[0, 34\)"):
            method(
                [keras.ops.convert_to_tensor(features), keras.ops.convert_to_tensor(bad)],
                verbose=0,
            )


def test_an_empty_split_raises_instead_of_scoring_zero(karate):
    # Before: evaluate reported accuracy 0.0 (keras's weighted mean over
    # no weight) and masked_accuracy NaN with a NumPy warning.
    from keras_attention.applications import masked_accuracy

    model = GATNodeClassifier(num_features=34, num_classes=2)
    model.compile(jit_compile=False)
    empty = np.zeros_like(karate.test_weights)
    match = r"`{}`, expected the weights of a split with at least one"
    with pytest.raises(ValueError, match=match.format("sample_weight")):
        model.evaluate(karate.inputs, karate.labels, sample_weight=empty,
                       verbose=0)
    with pytest.raises(ValueError, match=match.format("sample_weight")):
        model.evaluate(karate.inputs, karate.labels, None, 0, empty)
    with pytest.raises(ValueError, match=match.format("sample_weight")):
        model.fit(karate.inputs, karate.labels, sample_weight=empty, verbose=0)
    with pytest.raises(ValueError, match=match.format(r"validation_data\[2\]")):
        model.fit(karate.inputs, karate.labels, sample_weight=karate.train_weights,
                  validation_data=(karate.inputs, karate.labels, empty), verbose=0)
    labels = karate.labels[0]
    with pytest.raises(ValueError, match="`mask`.*no labelled node"):
        masked_accuracy(np.zeros((34, 2)), labels, np.zeros(34, bool))
    assert 0 <= masked_accuracy(np.zeros((34, 2)), labels, labels >= 0) <= 1


def test_planetoid_data_names_its_set_and_the_run_shows_progress(tmp_path, capsys, monkeypatch):
    # A folder of several sets took the first silently, and 300 epochs of a
    # full-graph run printed nothing.
    from keras_attention import recipes

    for name in ("cora", "citeseer"):
        (tmp_path / f"ind.{name}.graph").write_text("")
    assert recipes.planetoid_name(str(tmp_path)) == (str(tmp_path), "cora")
    assert "citeseer" in capsys.readouterr().out  # what else it holds
    citeseer = str(tmp_path / "ind.citeseer.graph")
    assert recipes.planetoid_name(citeseer) == (str(tmp_path), "citeseer")
    with pytest.raises(ValueError, match="--data"):
        recipes.planetoid_name(str(tmp_path / "elsewhere"))
    progress = recipes.EpochProgress(20)
    for epoch in range(7):
        progress.on_epoch_end(epoch, {
            "loss": 1.0 / (epoch + 1), "val_loss": 9.0,
            "val_cross_entropy": 0.25, "val_accuracy": 0.5,
        })
    progress.on_train_end()  # stopped early, at epoch 7
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" - ")[0] for line in lines] == [
        "epoch 2/20", "epoch 4/20", "epoch 6/20", "epoch 7/20"]
    assert "val_accuracy: 0.5000" in lines[-1]
    # The validation loss early stopping watches, not Keras's with the L2.
    assert "val_cross_entropy: 0.2500" in lines[-1] and "val_loss" not in lines[-1]
    # On a terminal the bar shows each epoch's own figures, not their
    # running means (epoch 2 showed the mean loss of epochs 1 and 2).
    monkeypatch.setattr(recipes.sys.stdout, "isatty", lambda: True, raising=False)
    progress = recipes.EpochProgress(5)
    progress.bar.interval = 0  # every epoch drawn, however quick
    for epoch, loss in enumerate([3.0, 1.0, 5.0]):  # mean 3
        progress.on_epoch_end(epoch, {"loss": loss})
    assert "loss: 5.0000" in capsys.readouterr().out.split("\r")[-1]
