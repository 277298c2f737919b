"""`GraphAttention`'s input checks: the node features, the graph (an edge
list or a dense adjacency) and the edge features, by shape, dtype and,
when known, index values."""

import keras
import numpy as np
from keras import ops

from keras_attention._validation import check_ids_in_range
from keras_attention._validation import exporting
from keras_attention._validation import known_dim
from keras_attention._validation import torch_compiling
from keras_attention._validation import traced_by_torch
from keras_attention.layers import base


def _is_integer(x):
    dtype = keras.backend.standardize_dtype(x.dtype)
    return "int" in dtype


def _known_values(x):
    """`x` as a NumPy array when its values are known (eager), else None."""
    if isinstance(x, np.ndarray):
        return x
    if torch_compiling():
        return None
    try:
        return ops.convert_to_numpy(x)
    except Exception:  # a symbolic or traced tensor has no values yet
        return None


def shape_or_none(x):
    return None if x is None else tuple(x.shape)


def _differ(a, b):
    """Whether two sizes cannot be equal: both static and different, or,
    under JAX's export, symbols not known to be equal (`batch` and `a`).
    `None` and torch's traced sizes are not compared."""
    if a is None or b is None or traced_by_torch(a) or traced_by_torch(b):
        return False
    return not a == b


_EXPORT_HINT = {
    "edges": (
        " keras's `model.export` gives every input an unknown first "
        "dimension, shared by all inputs: pass `input_signature` with the "
        "edges as `keras.InputSpec(shape=(2, None), dtype=\"int32\")`."
    ),
    "dense": (
        " On JAX, keras's `model.export` names each unknown dimension "
        "apart: pass `jax2tf_kwargs={\"polymorphic_shapes\": [[\"(b, n, "
        "F)\", \"(b, n, n)\"]]}` (`[[\"(n, F)\", \"(n, n)\"]]` "
        "unbatched; F the features) to say that they are the same N."
    ),
}


def split_graph_shapes(input_shape):
    """`(features, edges, edge_features)` shapes of `[node_features, edges(,
    edge_features)]`, checked."""
    shapes = list(input_shape) if isinstance(input_shape, (list, tuple)) else []
    if base.is_shape(input_shape) or not 2 <= len(shapes) <= 3:
        raise ValueError(
            "Expected the inputs to be a list [node_features, edges] or "
            "[node_features, edges, edge_features]. Received: "
            f"input_shape={input_shape}"
        )
    features, edges = tuple(shapes[0]), tuple(shapes[1])
    edge_features = tuple(shapes[2]) if len(shapes) == 3 else None
    if len(features) not in (2, 3):
        raise ValueError(
            "Received an invalid value for argument `node_features`, "
            "expected a tensor of rank 2 (N, F) or 3 (B, N, F). "
            f"Received: node_features.shape={features}"
        )
    if features[-1] is None:
        raise ValueError(
            "The last dimension of `node_features` must be known. "
            f"Received: node_features.shape={features}"
        )
    if len(edges) not in (2, 3) or (len(edges) == 3 and len(features) == 2):
        expected = (
            "an edge list (2, E) or an adjacency (N, N)"
            if len(features) == 2
            else "an adjacency (B, N, N) or (N, N)"
        )
        raise ValueError(
            "Received an invalid value for argument `edges`, expected "
            f"{expected} for node_features.shape={features}. "
            f"Received: edges.shape={edges}"
        )
    if edge_features is not None and (
        len(edge_features) < 2 or edge_features[-1] is None
    ):
        raise ValueError(
            "Received an invalid value for argument `edge_features`, "
            "expected a tensor (E, F_e) or (..., N, N, F_e) with a known "
            f"last dimension. Received: edge_features.shape={edge_features}"
        )
    return features, edges, edge_features


def check_graph_inputs(features, edges, edge_features):
    """Validate the call's tensors; returns `"edge_list"` or `"dense"`."""
    split_graph_shapes(
        [features.shape, edges.shape]
        + ([] if edge_features is None else [edge_features.shape])
    )
    node_shape, edge_shape = tuple(features.shape), tuple(edges.shape)
    n = known_dim(node_shape[-2])
    dtype = keras.backend.standardize_dtype(edges.dtype)
    hints = _EXPORT_HINT if exporting(node_shape, edge_shape) else {}
    if _is_integer(edges):
        # torch's trace holds the first dimension's value: 1 where keras's
        # export made it unknown.
        rows = edge_shape[0]
        rows = int(rows) if len(edge_shape) == 2 and traced_by_torch(rows) else rows
        if len(node_shape) != 2 or len(edge_shape) != 2 or _differ(rows, 2):
            raise ValueError(
                "Received an invalid value for argument `edges`: an "
                "integer tensor is an edge list, expected shape (2, E) "
                "with node_features (N, F) (pass a dense adjacency as "
                "bool or float). Received: edges.shape="
                f"{edge_shape}, edges.dtype={dtype}, "
                f"node_features.shape={node_shape}." + hints.get("edges", "")
            )
        if edge_features is not None and (
            len(edge_features.shape) != 2
            or _differ(edge_shape[1], edge_features.shape[0])
        ):
            raise ValueError(
                "Received an invalid value for argument `edge_features`, "
                "expected one row per edge, (E, F_e) with "
                f"E={edge_shape[1]}. Received: "
                f"edge_features.shape={tuple(edge_features.shape)}"
            )
        values = _known_values(edges)
        if values is not None and n is not None:
            check_ids_in_range("edges", values, n, "node indices", f"N={n} nodes")
        return "edge_list"
    if dtype != "bool" and "float" not in dtype:
        raise ValueError(
            "Received an invalid value for argument `edges`, expected an "
            "integer edge list (2, E) or a bool or float adjacency. "
            f"Received: edges.dtype={dtype}"
        )
    if (
        _differ(edge_shape[-1], edge_shape[-2])
        or _differ(edge_shape[-1], node_shape[-2])
        or (len(edge_shape) == 3 and _differ(edge_shape[0], node_shape[0]))
    ):
        raise ValueError(
            "Received an invalid value for argument `edges`: a float or "
            "bool tensor is a dense adjacency, expected a square "
            f"(N, N) or (B, N, N) with N={node_shape[-2]} as in "
            + (f"node_features, and B={node_shape[0]} as in it "
               if len(node_shape) == 3 else "node_features ")
            + "(an edge list must be an integer tensor (2, E)). "
            f"Received: edges.shape={edge_shape}, edges.dtype={dtype}, "
            f"node_features.shape={node_shape}." + hints.get("dense", "")
        )
    if edge_features is not None:
        shape = tuple(edge_features.shape)
        if len(shape) != len(edge_shape) + 1 or any(
            _differ(d, e) for d, e in zip(shape, edge_shape)
        ):
            raise ValueError(
                "Received an invalid value for argument `edge_features`, "
                f"expected the adjacency's shape plus features, "
                f"{edge_shape + ('F_e',)}. Received: "
                f"edge_features.shape={shape}"
            )
    return "dense"
