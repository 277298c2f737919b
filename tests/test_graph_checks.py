"""Graph review: the functional node classifier's symbolic shapes and dtypes,
and errors that name the argument (sampler of another graph, mismatched
shapes in `masked_accuracy` and `layerwise_predict`, karate club options)."""

import keras
import numpy as np
import pytest

from keras_attention.applications import GATNodeClassifier
from keras_attention.applications import layerwise_predict
from keras_attention.applications import masked_accuracy
from keras_attention.applications import sampled_node_dataset
from keras_attention.datasets import NeighborSampler
from keras_attention.datasets import load_karate_club


@pytest.fixture(scope="module")
def karate():
    return load_karate_club()


def small_model():
    return GATNodeClassifier(
        num_features=34, num_classes=2, hidden_units=2, num_heads=2
    )


def test_classifier_keeps_integer_edges_and_unknown_node_count():
    # The edge ids stay integers between the wrappers, so the graph layers
    # see an edge list (not a float adjacency of 2 nodes).
    model = small_model()
    for name in ("graph_attention_1", "graph_attention_2"):
        edges = model.get_layer(name).input[1]
        assert keras.backend.standardize_dtype(edges.dtype) == "int32"
    assert tuple(model.output.shape) == (1, None, 2)
    shape = model.compute_output_shape([(1, 34, 34), (1, 2, 156)])
    assert tuple(shape) == (1, 34, 2)


def test_sampled_dataset_rejects_a_sampler_of_another_graph(karate):
    smaller = karate.edges[:, (karate.edges < 20).all(axis=0)]
    for sampler in (
        NeighborSampler(smaller, 20, [2, 2]),  # silently a truncated graph
        NeighborSampler(np.concatenate([karate.edges, [[40], [41]]], 1), 42, [2, 2]),
        NeighborSampler(karate.edges[:, :-2], 34, [2, 2]),  # other edges
    ):
        with pytest.raises(ValueError, match="`sampler`.*34 nodes, 156 edges"):
            sampled_node_dataset(karate, [0, 1], [2, 2], 4, sampler=sampler)
    same = NeighborSampler(karate.edges, 34, [2, 2])
    assert sampled_node_dataset(karate, [0, 1], [2, 2], 4, sampler=same)


@pytest.mark.parametrize(
    "shapes,argument",
    [
        (((34, 2), (34,), (10,)), "mask"),
        (((34, 2), (30,), (34,)), "labels"),
        (((34,), (34,), (34,)), "logits"),
    ],
)
def test_masked_accuracy_names_the_mismatched_argument(shapes, argument):
    logits, labels, mask = (np.zeros(shape) for shape in shapes)
    with pytest.raises(ValueError, match=f"argument `{argument}`"):
        masked_accuracy(logits, labels.astype(int), mask.astype(bool) | True)


def test_masked_accuracy_takes_a_batch_of_one_graph():
    logits = np.zeros((1, 4, 2))
    logits[0, :3, 1] = 1.0
    labels = np.array([[1, 1, 0, 0]])
    assert masked_accuracy(logits, labels, np.ones((1, 4), bool)) == 0.75


def test_layerwise_predict_names_features_of_another_width(karate):
    with pytest.raises(ValueError, match="`features`, expected 34 features"):
        layerwise_predict(small_model(), karate.features[:, :10], karate.edges)


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"val_fraction": "0.5"}, "val_fraction"),
        ({"val_fraction": True}, "val_fraction"),
        ({"num_train_per_class": True}, "num_train_per_class"),
    ],
)
def test_karate_club_rejects_non_numbers(kwargs, argument):
    with pytest.raises(ValueError, match=f"argument `{argument}`"):
        load_karate_club(**kwargs)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dense", [False, True])
def test_feature_dropout_drops_each_nodes_message_once(version, dense):
    # The GAT paper's code drops `seq_fts` (each node's projected features)
    # after the scores: one mask per source node, shared by every edge it
    # sends, scaled by 1 / (1 - rate); the coefficients do not change.
    from keras_attention.layers import GraphAttention

    rng = np.random.default_rng(0)
    features = rng.normal(size=(4, 3)).astype("float32")
    edges = np.array([[0, 0, 3], [1, 2, 0]], "int32")  # 0 -> 1, 0 -> 2, 3 -> 0
    graph = edges
    if dense:
        graph = np.zeros((4, 4), bool)
        graph[edges[1], edges[0]] = True
    layer = GraphAttention(
        16, num_heads=2, add_self_loops=False, version=version,
        use_bias=False, feature_dropout=0.5, seed=3,
    )
    plain, alpha = layer([features, graph], return_attention_scores=True)
    dropped, alpha_training = layer(
        [features, graph], return_attention_scores=True, training=True
    )
    np.testing.assert_allclose(alpha_training, alpha, rtol=1e-6)
    plain, dropped = np.asarray(plain), np.asarray(dropped)
    # Nodes 1 and 2 hear only node 0 (coefficient 1): the same dropped message.
    np.testing.assert_array_equal(dropped[1], dropped[2])
    kept = dropped[1] != 0
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(dropped[1][kept], 2 * plain[1][kept], rtol=1e-5)
    assert GraphAttention.from_config(layer.get_config()).feature_dropout == 0.5


def test_node_classifier_drops_projected_features_at_the_input_rate():
    model = GATNodeClassifier(num_features=34, num_classes=2, dropout=0.4)
    rates = [layer.feature_dropout for layer in model.layers if hasattr(layer, "version")]
    assert rates == [0.4, 0.4]
    assert model.get_config()["feature_dropout"] == 0.4
    model = GATNodeClassifier(num_features=34, num_classes=2, feature_dropout=0.0)
    rates = [layer.feature_dropout for layer in model.layers if hasattr(layer, "version")]
    assert rates == [0.0, 0.0]
    with pytest.raises(ValueError, match="`feature_dropout`"):
        GATNodeClassifier(num_features=34, num_classes=2, feature_dropout=1.5)


@pytest.mark.parametrize("dense", [False, True])
def test_integer_edge_features_are_taken_as_numbers(dense):
    # Counts or categories as edge features: the self loops' mean of them
    # failed on TensorFlow ("`x` and `y` must have the same dtype").
    from keras_attention.layers import GraphAttention

    x = np.random.default_rng(0).random((4, 3)).astype("float32")
    edges = np.array([[0, 1, 2], [1, 2, 3]], "int32")
    counts = np.array([[1, 2], [3, 0], [2, 2]], "int32")
    if dense:
        adjacency = np.zeros((4, 4), bool)
        adjacency[edges[1], edges[0]] = True
        features = np.zeros((4, 4, 2), "int32")
        features[edges[1], edges[0]] = counts
        edges, counts = adjacency, features
    layer = GraphAttention(units=2, num_heads=2)
    got = layer([x, edges, counts])
    want = layer([x, edges, counts.astype("float32")])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), atol=1e-6
    )


def test_an_adjacency_of_another_batch_size_says_which_batch():
    # The message named only N, which the adjacency matched.
    from keras_attention.layers import GraphAttention

    nodes = np.zeros((1, 6, 16), "float32")
    with pytest.raises(ValueError, match="B=1 as in it"):
        GraphAttention(units=4)([nodes, np.ones((3, 6, 6), "float32")])
