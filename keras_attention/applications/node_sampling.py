"""Mini-batch node classification: sampled batches for `fit`, layer-wise inference.

`sampled_node_dataset` turns `keras_attention.datasets.NeighborSampler`'s
sub-graphs into a `tf.data.Dataset` that `GATNodeClassifier.fit` (the same
model and recipe as full-batch training) consumes: every element is one
sub-graph as a batch of one graph, `((features (1, n, F), edges (1, 2, e)),
labels (1, n), weights (1, n))`, the weights non-zero on the seed nodes
only, so the loss and the model's weighted accuracy count the seeds only.

`layerwise_predict` runs a trained model on **every** node without
sampling and with bounded memory: each layer is computed for all nodes,
`chunk_size` target nodes at a time (each chunk with its full incoming
neighbourhood), before the next layer starts (the inference of GraphSAGE
and PyTorch Geometric's examples). Its outputs equal the full-graph call.
"""

import itertools
import math

import keras
import numpy as np

from keras_attention.datasets.sampling import NeighborSampler
from keras_attention.datasets.sampling import check_edges
from keras_attention.datasets.sampling import class_ids_with_none
from keras_attention.datasets.sampling import check_fanouts
from keras_attention.datasets.sampling import check_seeds
from keras_attention.datasets.sampling import csr_by_target
from keras_attention.datasets.sampling import sorted_unique
from keras_attention._validation import invalid


def _check_count(argument, value):
    """A positive Python or NumPy integer, else keras's `ValueError`."""
    if isinstance(value, bool) or not isinstance(
        value, (int, np.integer)
    ) or value <= 0:
        raise invalid(argument, "a positive integer", value)


def _seed_ids(seeds, num_nodes):
    seeds = np.asarray(seeds)
    if seeds.dtype == bool:
        if seeds.shape != (num_nodes,):
            raise ValueError(
                "Received an invalid value for argument `seeds`, expected node "
                f"ids or a boolean mask of shape ({num_nodes},). Received: "
                f"seeds.shape={seeds.shape}"
            )
        seeds = np.flatnonzero(seeds)
    return check_seeds(seeds, num_nodes)


def check_graph_labels(graph, num_nodes, labelled=None, argument="seeds"):
    """`graph.labels` as int32 `(N,)`, checked: one per node, whole
    numbers (-1 for none; NaN too, read as none) below `graph.num_classes`;
    every node of `labelled` (ids) has one, else a ValueError naming
    `argument`. Fractions, NaN and one-hot rows reached training cast or
    out of range (JAX trained on them without a word)."""
    labels = np.asarray(graph.labels)
    if labels.shape != (num_nodes,) or labels.dtype.kind not in "iuf":
        raise invalid(
            "graph.labels",
            f"one integer class id per node, shape ({num_nodes},) (-1 for "
            "none)",
            f"an array of shape {labels.shape} and dtype {labels.dtype}",
        )
    labels, bad = class_ids_with_none(labels)
    if len(bad):
        raise invalid(
            "graph.labels", "whole class ids (-1 for none)",
            f"{labels[bad[0]]} at node {bad[0]}",
        )
    classes = getattr(graph, "num_classes", None)
    if classes is not None and labels.size and labels.max() >= classes:
        bad = np.flatnonzero(labels >= classes)
        raise invalid(
            "graph.labels", f"class ids below graph.num_classes={classes}",
            f"{int(labels[bad[0]])} at node {bad[0]}",
        )
    labels = labels.astype("int32")
    if labelled is not None:
        unlabelled = labelled[labels[labelled] < 0]
        if len(unlabelled):
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, "
                f"expected labelled nodes. Received: {len(unlabelled)} "
                f"nodes without a label, e.g. node {int(unlabelled[0])}"
            )
    return labels


def _sampler_of(graph, num_nodes, fanouts, sampler):
    """`sampler`, checked against the graph and the fan-outs, or a new one."""
    if sampler is None:
        sampler = NeighborSampler(graph.edges, num_nodes, fanouts)
    elif (sampler.num_nodes, sampler.num_edges) != (
        num_nodes, np.shape(graph.edges)[-1]
    ):
        raise ValueError(
            "Received an invalid value for argument `sampler`, expected a "
            f"NeighborSampler of `graph` ({num_nodes} nodes, "
            f"{np.shape(graph.edges)[-1]} edges). Received: a sampler of "
            f"{sampler.num_nodes} nodes and {sampler.num_edges} edges"
        )
    elif tuple(check_fanouts(fanouts)) != tuple(sampler.fanouts):
        raise ValueError(
            "Received an invalid value for argument `fanouts`, expected the "
            f"fanouts of the given `sampler`, {list(sampler.fanouts)} (the "
            f"sampler draws the neighbours). Received: fanouts={fanouts!r}"
        )
    return sampler


def sampled_node_dataset(
    graph,
    seeds,
    fanouts,
    batch_size=64,
    shuffle=True,
    seed=0,
    pad=True,
    sampler=None,
):
    """A `tf.data.Dataset` of sampled sub-graphs for `GATNodeClassifier`.

    Each epoch visits every seed once, `batch_size` seeds per batch
    (shuffled with `shuffle=True`), each batch with its own sampled
    neighbourhood (`NeighborSampler`; PyTorch Geometric's `NeighborLoader`
    semantics). The `k`-th iteration over the dataset (counting from 0)
    draws from `[seed, k]`, so two datasets built alike and iterated alike
    yield the same batches. Every new iterator counts: one opened to peek
    at a batch shifts the epochs after it, and Keras's JAX and torch
    trainers open one before training starts. With `shuffle=False`
    (evaluation) the order and the neighbourhoods are the same every epoch.

    The seed nodes come first in each sub-graph and alone carry a weight,
    `n / batch_size` for `n` nodes per sub-graph: Keras's mean loss over
    the sub-graph is then the seeds' summed loss over `batch_size`, and a
    weighted accuracy (`GATNodeClassifier.compile`'s default) is the
    fraction of correctly classified seeds over the epoch. With `pad=True`
    every batch has the same shape (the most nodes and edges the fan-outs
    allow; see `NeighborSampler.batch_arrays`), so XLA compiles one step.

    Args:
        graph: a `keras_attention.datasets.GraphData` (features, edges,
            labels are read).
        seeds: node ids, or a boolean mask over the nodes (e.g.
            `graph.train_mask`); every seed needs a label (>= 0).
        fanouts: neighbours sampled per node and layer, e.g. `[10, 10]`.
        batch_size: seeds per batch.
        shuffle: reshuffle the seeds and resample every epoch.
        seed: seed of the shuffling and sampling.
        pad: pad every batch to one shape.
        sampler: a `NeighborSampler` of the graph to reuse (its CSR).

    Returns:
        A `tf.data.Dataset` of `((features, edges), labels, weights)` with
        a known cardinality (`ceil(len(seeds) / batch_size)`).

    Example:

    ```python
    graph = load_planetoid(path, "cora", normalize_features=True)
    train = sampled_node_dataset(graph, graph.train_mask, [10, 10], 64)
    model = GATNodeClassifier.from_preset("gat_cora")
    model.compile()
    model.fit(train, epochs=10)
    logits = layerwise_predict(model, graph.features, graph.edges)
    ```
    """
    import tensorflow as tf

    features = np.asarray(graph.features, np.float32)
    num_nodes = len(features)
    _check_count("batch_size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        # Else it failed inside `fit`, in the dataset's generator.
        raise invalid("seed", "a non-negative integer", seed)
    sampler = _sampler_of(graph, num_nodes, fanouts, sampler)
    seeds = _seed_ids(seeds, num_nodes)
    if len(seeds) == 0:
        raise ValueError(
            "Received an invalid value for argument `seeds`, expected at "
            "least one seed node. Received: no seeds"
        )
    labels = check_graph_labels(graph, num_nodes, seeds)
    num_batches = math.ceil(len(seeds) / batch_size)
    epochs = itertools.count()

    def generate():
        epoch = next(epochs) if shuffle else 0
        order = np.random.default_rng([seed, epoch]).permutation(seeds) if (
            shuffle
        ) else seeds
        for b in range(num_batches):
            x, e, y, w = sampler.batch_arrays(
                order[b * batch_size : (b + 1) * batch_size],
                features,
                labels,
                batch_size,
                seed=[seed, epoch, b],
                pad=pad,
            )
            yield (x, e), y, w

    width = features.shape[1]
    if pad:
        max_nodes, max_edges = sampler.max_sizes(batch_size)
        n, e = max_nodes + 1, max_edges
    else:
        n, e = None, None
    signature = (
        (
            tf.TensorSpec((1, n, width), tf.float32),
            tf.TensorSpec((1, 2, e), tf.int32),
        ),
        tf.TensorSpec((1, n), tf.int32),
        tf.TensorSpec((1, n), tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches))
    dataset = dataset.prefetch(1)
    # `GATNodeClassifier.fit` checks it against its own (in the compiled
    # step JAX's loss took class ids beyond the logits without a word).
    dataset.num_classes = getattr(graph, "num_classes", None)
    return dataset


def _is_graph_wrapper(layer):
    """Input layers and the `(1, ...)` <-> `(...)` wrappers of one graph."""
    if isinstance(layer, keras.layers.InputLayer):
        return True
    shapes = [tuple(layer.input.shape)] if not isinstance(
        layer.input, (list, tuple)
    ) else [tuple(t.shape) for t in layer.input]
    shapes.append(tuple(layer.output.shape))
    return any(len(shape) == 3 for shape in shapes)


def _chunk_subgraph(indptr, indices, start, stop):
    """Targets `[start, stop)` first, then their other sources; local edges."""
    targets = np.arange(start, stop, dtype=np.int64)
    sources = indices[indptr[start] : indptr[stop]].astype(np.int64)
    degrees = np.diff(indptr[start : stop + 1])
    local_targets = np.repeat(np.arange(stop - start), degrees)
    inside = (sources >= start) & (sources < stop)
    outside = sorted_unique(sources[~inside])
    local_sources = np.where(
        inside, sources - start, (stop - start) + np.searchsorted(outside, sources)
    )
    nodes = np.concatenate([targets, outside])
    edges = np.stack([local_sources, local_targets]).astype(np.int32)
    return nodes, edges


def layerwise_predict(model, features, edges, chunk_size=4096):
    """The outputs of a `GATNodeClassifier` for every node, layer by layer.

    Each layer runs for all nodes before the next, on chunks of
    `chunk_size` target nodes together with their full incoming
    neighbourhood (no sampling), in inference mode; the memory of a step
    is bounded by a chunk's neighbourhood instead of the whole graph. The
    result equals `model([features[None], edges[None]], training=False)`
    up to the order of floating-point sums.

    The model must be a chain of per-node layers between the wrappers of
    one graph (as `GATNodeClassifier` is): layers called on `[x, edges]`
    are graph layers, others act on each node alone (dropout).

    Args:
        model: a `GATNodeClassifier` (or a model of the same shape).
        features: float `(N, F)` node features.
        edges: int `(2, E)` edge list (row 0 source, row 1 target).
        chunk_size: target nodes per step.

    Returns:
        A NumPy array `(N, num_classes)` of logits.
    """
    features = np.asarray(features, np.float32)
    if features.ndim != 2:
        raise ValueError(
            "Received an invalid value for argument `features`, expected a "
            f"(N, F) array. Received: features.shape={features.shape}"
        )
    model_inputs = getattr(model, "inputs", None) or [None]
    width = getattr(model_inputs[0], "shape", (None,))[-1]
    if width is not None and features.shape[1] != width:
        raise ValueError(
            "Received an invalid value for argument `features`, expected "
            f"{width} features per node, as the model's input. Received: "
            f"features.shape={features.shape}"
        )
    _check_count("chunk_size", chunk_size)
    num_nodes = len(features)
    edges = check_edges(edges, num_nodes)
    indptr, indices = csr_by_target(edges, num_nodes)
    chunks = [
        (start, min(start + chunk_size, num_nodes))
        for start in range(0, num_nodes, chunk_size)
    ]
    subgraphs = {}
    x = features
    for layer in model.layers:
        if _is_graph_wrapper(layer):
            continue
        is_graph_layer = isinstance(layer.input, (list, tuple))
        outputs = []
        for start, stop in chunks:
            if is_graph_layer:
                if (start, stop) not in subgraphs:
                    subgraphs[start, stop] = _chunk_subgraph(
                        indptr, indices, start, stop
                    )
                nodes, local_edges = subgraphs[start, stop]
                out = layer([x[nodes], local_edges], training=False)
                # A copy: a view would keep the whole neighbourhood's rows.
                out = keras.ops.convert_to_numpy(out)[: stop - start].copy()
            else:
                out = keras.ops.convert_to_numpy(layer(x[start:stop], training=False))
            outputs.append(out)
        x = np.concatenate(outputs)
    return x


def masked_accuracy(logits, labels, mask):
    """Fraction of the nodes of `mask` whose argmax of `logits` is the label."""
    logits, labels, mask = np.asarray(logits), np.asarray(labels), np.asarray(mask)
    for argument, shape, expected in (
        ("logits", logits.shape[-1:] if logits.ndim >= 2 else None, "(N, C)"),
        ("labels", labels.shape, logits.shape[:-1]),
        ("mask", mask.shape, labels.shape),
    ):
        if shape is None or (argument != "logits" and shape != expected):
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, "
                f"expected the shape {expected} (logits (N, C), labels and "
                f"mask (N,)). Received: logits.shape={logits.shape}, "
                f"labels.shape={labels.shape}, mask.shape={mask.shape}"
            )
    mask = mask.astype(bool) & (labels >= 0)
    if not mask.any():  # the mean of nothing: NaN and a NumPy warning
        raise ValueError(
            "Received an invalid value for argument `mask`, expected a "
            "split with at least one labelled node. Received: a mask that "
            "selects no labelled node (an empty split)"
        )
    predictions = np.argmax(logits, axis=-1)
    return float(np.mean(predictions[mask] == labels[mask]))
