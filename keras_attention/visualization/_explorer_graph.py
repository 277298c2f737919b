"""The explorer's graph view: nodes, edges and their coefficients."""

import keras
import numpy as np

from keras_attention.visualization import _explorer_data as data
from keras_attention.visualization import maps as maps_lib


def graph_payload(context, inputs, layers, node_labels):
    features, flat_edges = _graph_inputs(inputs)
    num_nodes = features.shape[-2]
    coefficient_sets = _coefficients(context, inputs, layers, flat_edges, num_nodes)
    all_edges = flat_edges
    count = flat_edges.shape[1]
    if any(value.shape[0] == count + num_nodes for _, value in coefficient_sets):
        # Some layer adds a self loop per node (after the given edges); one
        # that adds none (`add_self_loops=False`) puts 0 on them.
        loops = np.arange(num_nodes)
        all_edges = np.concatenate([flat_edges, np.stack([loops, loops])], axis=1)
        for index, (name, value) in enumerate(coefficient_sets):
            if value.shape[0] == count:
                coefficient_sets[index] = (name, np.concatenate(
                    [value, np.zeros((num_nodes, value.shape[1]), value.dtype)]
                ))
                context.notes.append(
                    f"{name} adds no self loops: the loops the other graph "
                    "layers add show 0 for it."
                )
    keep_nodes = _nodes_to_keep(context, flat_edges, num_nodes)
    position_of = -np.ones(num_nodes, "int64")
    position_of[keep_nodes] = np.arange(len(keep_nodes))
    inside = (position_of[all_edges[0]] >= 0) & (position_of[all_edges[1]] >= 0)
    kept_edges = position_of[all_edges[:, inside]]
    xy = _layout(len(keep_nodes), kept_edges)
    entries = []
    for name, value in coefficient_sets:
        value = value[inside]
        entries.append(
            {
                "name": name,
                "heads": int(value.shape[1]),
                # float32: a hub's coefficients (about 1/degree each)
                # fell into a few of 256 steps of [0, 1], some to 0.
                "data": data.b64(np.asarray(value, "<f4")),
            }
        )
    payload = {
        "nodes": {
            "ids": keep_nodes.tolist(),
            "x": np.round(xy[:, 0], 4).tolist(),
            "y": np.round(xy[:, 1], 4).tolist(),
        },
        "edges": {"source": kept_edges[0].tolist(), "target": kept_edges[1].tolist()},
        "layers": entries,
    }
    if node_labels is not None:
        node_labels = np.asarray(node_labels).reshape(-1)
        if len(node_labels) != num_nodes:
            raise ValueError(
                "Received an invalid value for argument `node_labels`, "
                f"expected one label per node ({num_nodes}). Received: "
                f"{len(node_labels)} labels"
            )
        payload["nodes"]["label"] = node_labels[keep_nodes].astype(int).tolist()
    predicted = _predicted_nodes(context, inputs, num_nodes)
    if predicted is not None:
        payload["nodes"]["predicted"] = predicted[keep_nodes].tolist()
    return payload


def _graph_inputs(inputs):
    """`(features, edges (2, E))` of `[features, edges]`, checked."""
    if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected "
            "[features (N, F) or (1, N, F), edges (2, E) or (1, 2, E)] for a "
            f"graph model. Received: inputs of shape {data.shapes(inputs)}"
        )
    features, edges = (np.asarray(x) for x in inputs)
    flat_edges = edges.reshape(edges.shape[-2:]) if edges.ndim == 3 else edges
    if flat_edges.ndim != 2 or flat_edges.shape[0] != 2 or edges.ndim not in (2, 3):
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected edges "
            f"(2, E) or (1, 2, E). Received: edges.shape={edges.shape}"
        )
    return features, flat_edges.astype("int64")


def _coefficients(context, inputs, layers, flat_edges, num_nodes):
    """`[(name, (E or E + N, H))]`: each graph layer's per-edge coefficients."""
    from keras_attention.layers import GraphAttention

    graph_layers = {
        path for path, layer in maps_lib.attention_layers(context.model).items()
        if isinstance(layer, GraphAttention)
    }
    weights = context.maps(list(inputs), layers)
    coefficient_sets = []
    for name, value in weights.items():
        value = data.calls(value)
        if name not in graph_layers or isinstance(value, tuple):
            continue
        value = np.asarray(value, "float32")
        if value.ndim == 3 and value.shape[0] == 1:
            value = value[0]
        if value.ndim == 1:
            value = value[:, None]
        if value.ndim != 2 or value.shape[0] not in (
            flat_edges.shape[1], flat_edges.shape[1] + num_nodes
        ):
            context.notes.append(
                f"{name}: coefficients of shape {value.shape} are not one per "
                "edge; not shown."
            )
            continue
        coefficient_sets.append((name, value))
    if not coefficient_sets:
        raise ValueError(
            "The model's GraphAttention layers returned no per-edge "
            "coefficients for these inputs; explore graphs given as an edge "
            f"list. Received: inputs of shape {data.shapes(inputs)}"
        )
    return coefficient_sets


def _nodes_to_keep(context, flat_edges, num_nodes):
    """At most `max_nodes` nodes, sorted: breadth first from node 0."""
    import networkx as nx

    if num_nodes <= context.max_nodes:
        return np.arange(num_nodes)
    graph = nx.Graph()
    graph.add_nodes_from(range(num_nodes))
    graph.add_edges_from(flat_edges.T.tolist())
    order, seen = [], set()
    for start in range(num_nodes):  # node 0's component first
        if len(order) >= context.max_nodes:
            break
        if start in seen:
            continue
        for node in nx.bfs_tree(graph, start):
            seen.add(node)
            order.append(node)
    context.notes.append(
        f"The {context.max_nodes} nodes nearest node 0 (breadth first) of "
        f"the {num_nodes} are shown, with the edges between them."
    )
    return np.array(sorted(order[: context.max_nodes]))


def _layout(count, kept_edges):
    """Node positions `(count, 2)` in [0, 1]: a spring layout, seed 0."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(count))
    graph.add_edges_from(
        (int(a), int(b)) for a, b in kept_edges.T.tolist() if a != b
    )
    layout = nx.spring_layout(graph, seed=0)
    xy = np.array([layout[i] for i in range(count)], "float32")
    return (xy - xy.min(0)) / np.maximum(xy.max(0) - xy.min(0), 1e-6)


def _predicted_nodes(context, inputs, num_nodes):
    """The model's predicted class of every node, or `None`."""
    try:
        outputs = context.model(list(inputs), training=False)
        outputs = np.asarray(keras.ops.convert_to_numpy(outputs))
        if outputs.ndim == 3:
            outputs = outputs[0]
        if outputs.ndim == 2 and len(outputs) == num_nodes:
            return outputs.argmax(-1)
    except Exception:  # noqa: BLE001 - predictions are extra
        pass
    return None
