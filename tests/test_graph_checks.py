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
