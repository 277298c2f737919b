"""Neighbour sampling, mini-batch GAT training, layer-wise inference, graph files.

The sampler is checked against the definition (PyG `NeighborLoader`:
per-layer fan-outs, without replacement, seeds first, first-appearance
numbering) on graphs with nodes above and below the fan-out; the dataset's
loss and accuracy against hand computations over its batches; layer-wise
inference against the full-graph call.
"""

import gzip
import os

import keras
import numpy as np
import pytest

from keras_attention.applications import GATNodeClassifier
from keras_attention.applications import layerwise_predict
from keras_attention.applications import masked_accuracy
from keras_attention.applications import sampled_node_dataset
from keras_attention.datasets import NeighborSampler
from keras_attention.datasets import load_graph_files
from keras_attention.datasets import load_karate_club
from keras_attention.datasets import make_graph


@pytest.fixture(scope="module")
def graph():
    # Power-law degrees: many nodes above a fan-out of 4, many below.
    return make_graph(
        num_nodes=400, avg_degree=8, feature_dim=12, num_classes=3,
        kind="power_law", seed=1,
    )


def incoming(edges, num_nodes):
    lists = [set() for _ in range(num_nodes)]
    for source, target in edges.T:
        lists[target].add(int(source))
    return lists


# ------------------------------------------------------------------ sampler


def test_sampler_follows_neighbor_loader_semantics(graph):
    n = len(graph.features)
    fanouts = (4, 3)
    sampler = NeighborSampler(graph.edges, n, fanouts)
    neighbours = incoming(graph.edges, n)
    seeds = np.array([5, 17, 3, 250, 99])
    sub = sampler.sample(seeds, seed=7)
    nodes, edges = sub.nodes, sub.edges
    assert sub.num_seeds == 5 and nodes[:5].tolist() == seeds.tolist()
    assert len(np.unique(nodes)) == len(nodes)
    assert edges.shape == (2, sum(sub.edges_per_layer))
    # Every sampled edge is an edge of the graph, none twice.
    pairs = list(zip(nodes[edges[0]].tolist(), nodes[edges[1]].tolist()))
    assert len(set(pairs)) == len(pairs)
    assert all(s in neighbours[t] for s, t in pairs)
    # Layer by layer: the targets are the nodes the previous layer added,
    # each with min(degree, fan-out) neighbours; added nodes are numbered
    # in order of first appearance.
    frontier, known, offset = list(seeds), list(seeds), 0
    for fanout, count in zip(fanouts, sub.edges_per_layer):
        layer = pairs[offset : offset + count]
        offset += count
        for t in frontier:
            got = [s for s, target in layer if target == t]
            assert len(got) == min(len(neighbours[t]), fanout)
        assert {t for _, t in layer} <= set(frontier)
        added = []
        for s, _ in layer:
            if s not in known and s not in added:
                added.append(s)
        assert nodes[len(known) : len(known) + len(added)].tolist() == added
        known += added
        frontier = added
    assert len(known) == len(nodes)


def test_sampler_draws_uniformly_without_replacement():
    # Node 0 has 20 incoming neighbours; draw 5 of them 4,000 times at once.
    edges = np.stack([np.arange(1, 21), np.zeros(20, int)])
    sampler = NeighborSampler(edges, 21, [5])
    rng = np.random.default_rng(0)
    sources, targets = sampler.sample_neighbours(np.zeros(4000, int), 5, rng)
    draws = sources.reshape(4000, 5)
    assert all(len(set(row)) == 5 for row in draws.tolist())
    frequency = np.bincount(sources, minlength=21)[1:] / 4000
    np.testing.assert_allclose(frequency, 0.25, atol=0.03)


def test_sampler_is_deterministic_from_its_seed(graph):
    sampler = NeighborSampler(graph.edges, len(graph.features), [4, 4])
    a = sampler.sample(np.arange(30), seed=3)
    b = sampler.sample(np.arange(30), seed=3)
    c = sampler.sample(np.arange(30), seed=4)
    np.testing.assert_array_equal(a.nodes, b.nodes)
    np.testing.assert_array_equal(a.edges, b.edges)
    assert a.edges.shape != c.edges.shape or not np.array_equal(a.nodes, c.nodes)


@pytest.mark.parametrize(
    "fanouts", [[0], [10, -1], [1.5], "10", [], [True], None]
)
def test_bad_fanouts_name_the_argument(fanouts):
    edges = load_karate_club().edges
    with pytest.raises(ValueError, match=r"`fanouts`.*fanouts="):
        NeighborSampler(edges, 34, fanouts)


def test_bad_seeds_and_edges_name_the_argument():
    edges = load_karate_club().edges
    sampler = NeighborSampler(edges, 34, [2])
    with pytest.raises(ValueError, match=r"`seeds`.*\[0, 34\).*\[-1, 3\]"):
        sampler.sample([3, -1])
    with pytest.raises(ValueError, match=r"`seeds`.*\[0, 34\).*\[0, 34\]"):
        sampler.sample([0, 34])
    with pytest.raises(ValueError, match="`seeds`.*distinct"):
        sampler.sample([1, 1])
    bad = edges.copy()
    bad[0, 3] = 40
    with pytest.raises(ValueError, match=r"`edges`.*\[0, 34\).*\[0, 40\]"):
        NeighborSampler(bad, 34, [2])
    with pytest.raises(ValueError, match=r"`edges`.*\(2, E\)"):
        NeighborSampler(edges.T, 34, [2])


# ------------------------------------------------------------------ dataset


def test_dataset_is_padded_deterministic_and_weights_seeds_only(graph):
    seeds = np.flatnonzero(graph.train_mask)
    data = sampled_node_dataset(graph, seeds, [4, 3], batch_size=32, seed=5)
    again = sampled_node_dataset(graph, seeds, [4, 3], batch_size=32, seed=5)
    assert int(data.cardinality()) == int(np.ceil(len(seeds) / 32))
    first_epoch = list(data.as_numpy_iterator())
    second_epoch = list(data.as_numpy_iterator())
    np.testing.assert_array_equal(
        first_epoch[0][0][1], list(again.as_numpy_iterator())[0][0][1]
    )
    assert not np.array_equal(first_epoch[0][1], second_epoch[0][1])
    seen = []
    for (x, e), y, w in first_epoch:
        size = x.shape[1]
        # The most a batch can hold, at most the whole graph.
        assert size == min(32 * (1 + 4 + 12), 400) + 1
        assert e.shape == (1, 2, min(32 * (4 + 12), graph.edges.shape[1]))
        count = int((w > 0).sum())
        assert (w[0, :count] == size / 32).all() and (w[0, count:] == 0).all()
        seen.extend(y[0, :count])
    assert sorted(seen) == sorted(graph.labels[seeds])


def hand_counts(model, dataset, batch_size):
    """Seed accuracy and mean batch loss computed outside Keras."""
    correct = total = 0
    losses = []
    for (x, e), y, w in dataset.as_numpy_iterator():
        logits = keras.ops.convert_to_numpy(model([x, e], training=False))[0]
        seeds = w[0] > 0
        correct += int((logits.argmax(-1)[seeds] == y[0, seeds]).sum())
        total += int(seeds.sum())
        shifted = logits[seeds] - logits[seeds].max(-1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        losses.append(-log_p[np.arange(seeds.sum()), y[0, seeds]].sum() / batch_size)
    return correct / total, float(np.mean(losses))


def test_fit_on_sampled_batches_counts_seeds_only(graph):
    keras.utils.set_random_seed(0)
    model = GATNodeClassifier(
        num_features=12, num_classes=3, hidden_units=4, num_heads=2,
        weight_decay=0.0,
    )
    model.compile()
    train = sampled_node_dataset(graph, graph.train_mask, [4, 3], batch_size=48)
    model.fit(train, epochs=2, verbose=0)
    val = sampled_node_dataset(
        graph, graph.val_mask, [4, 3], batch_size=24, shuffle=False
    )
    result = model.evaluate(val, verbose=0, return_dict=True)
    accuracy, loss = hand_counts(model, val, 24)
    assert result["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    # Fewer than 24 seeds in the last batch: not a multiple, on purpose.
    assert int(graph.val_mask.sum()) % 24


def test_minibatch_training_learns_and_layerwise_equals_full_graph(graph):
    keras.utils.set_random_seed(1)
    model = GATNodeClassifier(
        num_features=12, num_classes=3, hidden_units=4, num_heads=2,
        output_heads=2, dropout=0.2,
    )
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    train = sampled_node_dataset(graph, graph.train_mask, [5, 5], batch_size=64)
    model.fit(train, epochs=8, verbose=0)
    full = keras.ops.convert_to_numpy(
        model([graph.features[None], graph.edges[None]], training=False)
    )[0]
    for chunk_size in (37, 400):
        layerwise = layerwise_predict(model, graph.features, graph.edges, chunk_size)
        np.testing.assert_allclose(layerwise, full, atol=1e-5, rtol=0)
    assert masked_accuracy(full, graph.labels, graph.test_mask) > 0.7  # chance: 1/3


def test_dataset_rejects_bad_seeds(graph):
    with pytest.raises(ValueError, match="`seeds`"):
        sampled_node_dataset(graph, [0, 400], [2])
    labels = graph.labels.copy()
    labels[3] = -1
    unlabelled = graph._replace(labels=labels)
    with pytest.raises(ValueError, match="without a label, e.g. node 3"):
        sampled_node_dataset(unlabelled, [2, 3], [2])
    with pytest.raises(ValueError, match="`fanouts`"):
        sampled_node_dataset(graph, [1], [0])
    # A given sampler draws the neighbours: other fanouts were ignored.
    sampler = NeighborSampler(graph.edges, len(graph.features), [3, 2])
    with pytest.raises(ValueError, match=r"`fanouts`, expected the fanouts of the given `sampler`, \[3, 2\]"):
        sampled_node_dataset(graph, [1], [5], sampler=sampler)
    assert sampled_node_dataset(graph, [1], [3, 2], sampler=sampler) is not None
    # The seed was read inside the dataset's generator: a bad one failed in
    # `fit` ("Graph execution error", its TypeError buried inside).
    for seed in (None, -1, 1.5, True):
        with pytest.raises(ValueError, match="`seed`"):
            sampled_node_dataset(graph, [1], [2], seed=seed)


def test_sorted_unique_is_np_unique():
    # NumPy 2.4's np.unique was most of make_graph's time at 10^6 nodes.
    from keras_attention.datasets.sampling import sorted_unique

    rng = np.random.default_rng(0)
    for keys in (rng.integers(0, 50, 500), np.array([], np.int64), np.array([7])):
        np.testing.assert_array_equal(sorted_unique(keys), np.unique(keys))


# ------------------------------------------------------------------ make_graph


def test_make_graph_is_deterministic_and_class_correlated():
    a = make_graph(num_nodes=2000, avg_degree=10, feature_dim=8, num_classes=4, seed=3)
    b = make_graph(num_nodes=2000, avg_degree=10, feature_dim=8, num_classes=4, seed=3)
    np.testing.assert_array_equal(a.edges, b.edges)
    np.testing.assert_array_equal(a.features, b.features)
    source, target = a.edges
    assert (source != target).all()
    keys = set(zip(source.tolist(), target.tolist()))
    assert all((t, s) in keys for s, t in keys)  # symmetric
    assert 9.0 < a.edges.shape[1] / 2000 <= 10.0
    same_class = (a.labels[source] == a.labels[target]).mean()
    assert same_class == pytest.approx(0.8 + 0.2 / 4, abs=0.03)
    means = np.stack([a.features[a.labels == c].mean(0) for c in range(4)])
    nearest = ((a.features[:, None] - means) ** 2).sum(-1).argmin(-1)
    assert (nearest == a.labels).mean() > 0.8
    assert not (a.train_mask & a.val_mask).any() and not (a.val_mask & a.test_mask).any()
    assert (a.train_mask | a.val_mask | a.test_mask).all()
    heavy = make_graph(num_nodes=2000, avg_degree=10, feature_dim=8, kind="power_law")
    assert np.bincount(heavy.edges[1]).max() > 4 * np.bincount(a.edges[1]).max()



@pytest.mark.parametrize("kind", ["sbm", "power_law"])
def test_make_graph_homophily_one_keeps_edges_in_class_when_class_0_is_empty(kind):
    # seed 32: no node of class 0 (a class's weight range was then wrong).
    graph = make_graph(
        num_nodes=30, avg_degree=6, feature_dim=2, num_classes=8,
        homophily=1.0, kind=kind, seed=32,
    )
    assert not (graph.labels == 0).any()
    source, target = graph.edges
    np.testing.assert_array_equal(graph.labels[source], graph.labels[target])


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_nodes=0), "num_nodes"),
        (dict(avg_degree=-1), "avg_degree"),
        (dict(feature_dim=2.5), "feature_dim"),
        (dict(kind="ring"), "kind"),
        (dict(homophily=1.5), "homophily"),
        (dict(num_nodes=4, num_classes=8, avg_degree=2), "num_classes"),
    ],
)
def test_make_graph_rejects_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        make_graph(**kwargs)


# ------------------------------------------------------------------ files


def save_graph(folder, graph, csv=False, ogb=False):
    os.makedirs(folder / "raw", exist_ok=True)
    os.makedirs(folder / "split" / "random", exist_ok=True)
    edges = graph.edges[:, graph.edges[0] < graph.edges[1]]  # one direction

    def write(stem, array, fmt):
        path = folder / (stem + (".csv.gz" if ogb else ".csv" if csv else ".npy"))
        if ogb:
            with gzip.open(path, "wt") as f:
                np.savetxt(f, array, delimiter=",", fmt=fmt)
        elif csv:
            np.savetxt(path, array, delimiter=",", fmt=fmt)
        else:
            np.save(path, array)

    prefix = "raw/" if ogb else ""
    split = "split/random/" if ogb else ""
    write(prefix + ("edge" if ogb else "edges"), edges.T, "%d")
    write(prefix + ("node-feat" if ogb else "features"), graph.features, "%.8e")
    write(prefix + ("node-label" if ogb else "labels"), graph.labels[:, None], "%d")
    for stem, mask in (("train", graph.train_mask), ("valid" if ogb else "val", graph.val_mask), ("test", graph.test_mask)):
        write(split + stem, np.flatnonzero(mask), "%d")


@pytest.mark.parametrize("layout", ["npy", "csv", "ogb"])
def test_load_graph_files_round_trips(tmp_path, layout):
    graph = make_graph(num_nodes=60, avg_degree=4, feature_dim=5, num_classes=3, seed=2)
    save_graph(tmp_path, graph, csv=layout == "csv", ogb=layout == "ogb")
    loaded = load_graph_files(tmp_path)
    np.testing.assert_array_equal(loaded.edges, graph.edges)
    np.testing.assert_allclose(loaded.features, graph.features, rtol=1e-6)
    np.testing.assert_array_equal(loaded.labels, graph.labels)
    for name in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(graph, name))
    assert loaded.num_classes == 3



def test_load_graph_files_csv_with_one_feature_column_and_one_edge(tmp_path):
    # np.loadtxt gave 1-D arrays for these: "should hold a (N, F) matrix".
    np.savetxt(tmp_path / "features.csv", np.array([[0.5], [1.5], [2.5]]), delimiter=",")
    np.savetxt(tmp_path / "edges.csv", np.array([[0, 2]]), delimiter=",", fmt="%d")
    np.savetxt(tmp_path / "labels.csv", np.array([0, 1, 0]), fmt="%d")
    for stem, ids in (("train", [0]), ("val", [1]), ("test", [2])):
        np.savetxt(tmp_path / f"{stem}.csv", np.array(ids), fmt="%d")
    graph = load_graph_files(tmp_path)
    np.testing.assert_array_equal(graph.features, [[0.5], [1.5], [2.5]])
    np.testing.assert_array_equal(graph.edges, [[2, 0], [0, 2]])
    directed = load_graph_files(tmp_path, undirected=False)
    np.testing.assert_array_equal(directed.edges, [[0], [2]])


def test_load_graph_files_warns_that_two_npy_edges_read_as_two_rows(tmp_path):
    # (2, 2) is (2, E) and (E, 2) alike: read as (2, E), and said so.
    np.save(tmp_path / "features.npy", np.eye(4, dtype="float32"))
    np.save(tmp_path / "labels.npy", np.array([0, 1, 0, 1]))
    np.save(tmp_path / "edges.npy", np.array([[0, 2], [1, 3]]))
    for stem, ids in (("train", [0]), ("val", [1]), ("test", [2])):
        np.save(tmp_path / f"{stem}.npy", np.array(ids))
    with pytest.warns(UserWarning, match="sources \\[0, 2\\], targets \\[1, 3\\]"):
        graph = load_graph_files(tmp_path, undirected=False)
    np.testing.assert_array_equal(graph.edges, [[0, 2], [1, 3]])

def test_load_graph_files_errors_name_the_file(tmp_path):
    graph = make_graph(num_nodes=30, avg_degree=4, feature_dim=3, num_classes=2)
    save_graph(tmp_path, graph)
    os.remove(tmp_path / "labels.npy")
    with pytest.raises(FileNotFoundError, match="labels.npy"):
        load_graph_files(tmp_path)
    np.save(tmp_path / "labels.npy", graph.labels)
    np.save(tmp_path / "edges.npy", np.array([[0, 1], [2, 30]]))
    with pytest.raises(ValueError, match=r"edges.npy.*\[0, 30\).*\[0, 30\]"):
        load_graph_files(tmp_path)
    np.save(tmp_path / "edges.npy", graph.edges)
    np.save(tmp_path / "train.npy", np.array([0, 31]))
    with pytest.raises(ValueError, match=r"train.npy.*outside \[0, 30\)"):
        load_graph_files(tmp_path)


def test_load_graph_files_refuses_overlapping_splits(tmp_path):
    # Before: loaded, and a test node also trained on inflated the accuracy.
    graph = make_graph(num_nodes=30, avg_degree=4, feature_dim=3, num_classes=2)
    save_graph(tmp_path, graph)
    test = np.flatnonzero(graph.test_mask)
    np.save(tmp_path / "train.npy", np.concatenate([np.flatnonzero(graph.train_mask), test[:2]]))
    with pytest.raises(ValueError, match=r"train and test splits overlap: 2 node\(s\) in both .*train.npy.*test.npy"):
        load_graph_files(tmp_path)
    val = np.zeros(30, bool)
    val[test[0]] = True  # a boolean mask file, sharing one node with test
    np.save(tmp_path / "train.npy", np.flatnonzero(graph.train_mask))
    np.save(tmp_path / "val.npy", val)
    with pytest.raises(ValueError, match=r"val and test splits overlap: 1 node\(s\)"):
        load_graph_files(tmp_path)


def test_load_graph_files_reads_what_users_save_or_says_why(tmp_path):
    graph = make_graph(num_nodes=30, avg_degree=4, feature_dim=3, num_classes=2)
    unlabelled = np.flatnonzero(graph.test_mask)[0]  # in no split
    test_mask = graph.test_mask.copy()
    test_mask[unlabelled] = False
    graph = graph._replace(test_mask=test_mask)
    save_graph(tmp_path, graph)
    # A 0/1 mask saved as integers was read as the node ids 0 and 1.
    np.save(tmp_path / "train.npy", graph.train_mask.astype("int64"))
    with pytest.raises(ValueError, match=r"train.npy.*distinct node ids.*0/1 mask.*astype\(bool\)"):
        load_graph_files(tmp_path)
    np.save(tmp_path / "train.npy", np.flatnonzero(graph.train_mask))
    # OGB's CSV labels write NaN for unlabelled nodes: it could not be read.
    os.remove(tmp_path / "labels.npy")
    text = [str(v) for v in graph.labels]
    text[unlabelled] = "nan"
    (tmp_path / "labels.csv").write_text("\n".join(text) + "\n")
    loaded = load_graph_files(tmp_path)
    assert loaded.labels[unlabelled] == -1
    np.testing.assert_array_equal(np.delete(loaded.labels, unlabelled), np.delete(graph.labels, unlabelled))
    text[unlabelled] = "1.5"
    (tmp_path / "labels.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(ValueError, match=r"labels.csv.*integer class ids.*1.5"):
        load_graph_files(tmp_path)


def test_labels_the_training_cannot_take_are_refused_by_name(graph):
    from keras_attention.applications import node_classification_data

    seeds = np.flatnonzero(graph.train_mask)[:4]
    for labels, match in [
        (np.where(np.arange(len(graph.labels)) == seeds[0], np.nan, graph.labels),
         "without a label"),  # NaN < 0 is False: it trained as -2**31
        (graph.labels + 0.5, "whole class ids"),  # 1.7 trained as 1
        (np.eye(graph.num_classes)[graph.labels], r"shape \(%d,\)" % len(graph.labels)),
        (np.where(graph.labels == 1, graph.num_classes, graph.labels), "below graph.num_classes"),
    ]:
        bad = graph._replace(labels=labels)
        with pytest.raises(ValueError, match=match):
            sampled_node_dataset(bad, seeds, [2])
        with pytest.raises(ValueError, match=match):
            node_classification_data(bad)
    # Masks: a wrong length broadcast (or failed in NumPy), ids were read
    # as a mask, and an unlabelled training node was dropped unseen.
    for mask in (graph.train_mask[:-1], np.flatnonzero(graph.train_mask), np.array([True])):
        with pytest.raises(ValueError, match=r"`graph.train_mask`, expected a boolean mask"):
            node_classification_data(graph._replace(train_mask=mask))
    labels = graph.labels.copy()
    labels[seeds[1]] = -1
    with pytest.raises(ValueError, match=rf"`graph.train_mask`.*e.g. node {seeds[1]}"):
        node_classification_data(graph._replace(labels=labels))


def test_fit_refuses_a_dataset_of_more_classes_and_warns_without_a_split(graph):
    from keras_attention.applications import node_classification_data

    model = GATNodeClassifier(
        num_features=graph.features.shape[1], num_classes=graph.num_classes - 1,
        hidden_units=2, num_heads=1,
    )
    model.compile()
    dataset = sampled_node_dataset(graph, graph.train_mask, [2], batch_size=16)
    # JAX's loss took the class ids beyond the logits without a word.
    with pytest.raises(ValueError, match=rf"`x`.*num_classes={graph.num_classes - 1}.*{graph.num_classes} classes"):
        model.fit(dataset, epochs=1, verbose=0)
    data = node_classification_data(graph)
    model = GATNodeClassifier(
        num_features=graph.features.shape[1], num_classes=graph.num_classes,
        hidden_units=2, num_heads=1,
    )
    model.compile()
    with pytest.warns(UserWarning, match="fit without `sample_weight` trains on every node"):
        model.fit(data.inputs, data.labels, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="evaluate without `sample_weight` scores every node"):
        model.evaluate(data.inputs, data.labels, verbose=0)
