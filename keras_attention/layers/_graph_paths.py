"""GraphAttention's two paths: an edge list and a dense adjacency.

- `with_self_loops(edges, N)`: the edge list the coefficients' rows follow.
- `edge_list_path`: gathers and segment sums over the edges
  (`segment_softmax_of_checked_ids`); `O(E * H * units)` memory.
- `adjacency_path`: the scores as the additive bias of the shared dense
  core (`base.attend`), masked by the adjacency.

Both take the layer (`keras_attention.layers.graph.GraphAttention`) for its
weights, projections (`layer._heads`), dropout and output (`layer._finish`).
"""

import math

from keras import ops
import keras

from keras_attention._validation import traced_by_torch
from keras_attention.layers import base
from keras_attention.ops.masks import segment_softmax_of_checked_ids


def with_self_loops(edges, num_nodes):
    """The edge list `(2, E + N)` that `GraphAttention` attends over.

    The edges `(2, E)` followed by one self loop `(i, i)` per node, in node
    order: the rows of the coefficients that `GraphAttention` returns for an
    edge list when `add_self_loops=True`. (Self loops already in `edges` keep
    their row there, with coefficient 0.)
    """
    loops = ops.arange(num_nodes, dtype=edges.dtype)
    return ops.concatenate([edges, ops.stack([loops, loops])], axis=1)


def _leaky_relu(x, negative_slope):
    """LeakyReLU with the slope in `x`'s dtype (`keras.ops.leaky_relu`, and
    `ops.cast` of a Python float, on TensorFlow go through float32: 0.2
    became 0.2000000030, a 1e-8 relative error in a float64 layer; a
    Python float times a tensor takes the tensor's dtype)."""
    return ops.where(x > 0, x, x * float(negative_slope))


def _rows(x, index):
    """`x[index]` for `x` `(N, ...)` and `index` `(E,)`: `(E, ...)`.

    Gathered as a matrix `(N, prod(...))`: keras's torch `take` of a rank-3
    tensor goes through `ravel`, which torch's ONNX export cannot write.
    """
    rest = tuple(x.shape[1:])
    if len(rest) < 2:
        return ops.take(x, index, axis=0)
    flat = ops.reshape(x, (-1, math.prod(rest)))
    return ops.reshape(ops.take(flat, index, axis=0), (-1,) + rest)


def edge_list_path(layer, features, edges, edge_features, training):
    """GAT on an edge list `(2, E)`: `(N, out)` and the coefficients `(E', H)`.

    Gathers and segment sums over the edges (self loops appended after
    them); never an `N x N` matrix.
    """
    num_nodes = features.shape[0]
    if num_nodes is None:
        num_nodes = ops.shape(features)[0]
    dtype = keras.backend.standardize_dtype(edges.dtype)
    if dtype not in ("int32", "int64"):
        # Gathers and segment sums take int32 or int64 indices only.
        wide = dtype in ("uint32", "uint64")
        edges = ops.cast(edges, "int64" if wide else "int32")
    if traced_by_torch(num_nodes):
        # keras's ONNX export traces an unknown size as 1 with inputs of
        # ones: one node and the edge 1 -> 1, which a gather refuses.
        # Clamped as XLA does; valid edges are unchanged.
        edges = ops.clip(edges, 0, num_nodes - 1)
    source, target = edges[0], edges[1]
    mask = None
    if layer.add_self_loops:
        mask = ops.concatenate(
            [
                ops.not_equal(source, target),
                ops.ones((num_nodes,), "bool"),
            ]
        )
        if edge_features is not None:
            # A self loop's features: the mean over the node's incoming
            # non-loop edges (PyG's fill_value="mean").
            valid = ops.cast(ops.not_equal(source, target), edge_features.dtype)
            total = ops.segment_sum(
                edge_features * valid[:, None], target, num_segments=num_nodes
            )
            count = ops.segment_sum(valid, target, num_segments=num_nodes)
            loop_features = total / ops.maximum(count, 1.0)[:, None]
            edge_features = ops.concatenate(
                [edge_features, loop_features], axis=0
            )
        edges = with_self_loops(edges, num_nodes)
        source, target = edges[0], edges[1]
    edge_term = None
    if edge_features is not None:
        edge_term = layer._heads(edge_features, layer.edge_projection)  # (E', H, C)
    if layer.version == "v1":
        h = layer._heads(features, layer.projection)  # (N, H, C)
        score_source = ops.sum(h * layer.attention_source, axis=-1)  # (N, H)
        score_target = ops.sum(h * layer.attention_target, axis=-1)
        scores = _rows(score_source, source) + _rows(
            score_target, target
        )  # (E', H)
        if edge_term is not None:
            scores = scores + ops.sum(edge_term * layer.attention_edge, axis=-1)
        scores = _leaky_relu(scores, layer.negative_slope)
        values, messages = h, None
    else:
        values = layer._heads(features, layer.source)  # (N, H, C)
        h_target = layer._heads(features, layer.target)
        messages = _rows(values, source)  # (E', H, C)
        z = messages + _rows(h_target, target)
        if edge_term is not None:
            z = z + edge_term
        z = _leaky_relu(z, layer.negative_slope)
        scores = ops.sum(z * layer.attention_kernel, axis=-1)  # (E', H)
    # The edges were checked (`check_graph_inputs`): the ids are not.
    alpha = segment_softmax_of_checked_ids(
        scores, target, num_segments=num_nodes, mask=mask
    )
    weights = layer._coefficient_dropout(alpha, training)
    dropped = layer._message_dropout(values, training)
    if messages is None or dropped is not values:
        messages = _rows(dropped, source)  # (E', H, C)
    weighted = messages * ops.cast(weights, messages.dtype)[..., None]
    if features.shape[0] == 0:
        heads = weighted  # no nodes, no edges (Keras's torch segment_sum
        # refuses zero segments)
    else:
        heads = ops.segment_sum(weighted, target, num_segments=num_nodes)
    return layer._finish(heads), alpha  # (N, out), (E', H)


def adjacency_path(layer, features, adjacency, edge_features, training):
    """GAT on a dense adjacency: `(B, N, out)` and `(B, H, N, N)` (unbatched
    `(N, ...)` inputs give unbatched outputs).

    The scores enter the shared dense core (`base.attend`) as its additive
    bias, so masks, softmax and coefficient dropout are the core's.
    """
    unbatched = len(features.shape) == 2
    if unbatched:
        features = features[None]
        adjacency = adjacency[None]
        if edge_features is not None:
            edge_features = edge_features[None]
    elif len(adjacency.shape) == 2:
        adjacency = adjacency[None]
        if edge_features is not None:
            edge_features = edge_features[None]
    n = features.shape[1] or ops.shape(features)[1]
    # (B|1, N, N) boolean, [b, i, j] for the edge j -> i.
    mask = ops.not_equal(adjacency, ops.zeros((), adjacency.dtype))
    if layer.add_self_loops:
        eye = ops.cast(ops.eye(n), "bool")[None]
        if edge_features is not None:
            others = ops.cast(
                ops.logical_and(mask, ops.logical_not(eye)),
                edge_features.dtype,
            )
            total = ops.sum(edge_features * others[..., None], axis=-2)
            count = ops.sum(others, axis=-1)[..., None]
            loop_features = total / ops.maximum(count, 1.0)  # (B, N, F_e)
            edge_features = ops.where(
                eye[..., None], loop_features[:, :, None, :], edge_features
            )
        mask = ops.logical_or(mask, eye)
    edge_term = None
    if edge_features is not None:
        edge_term = layer._heads(edge_features, layer.edge_projection)  # (B, N, N, H, C)
    if layer.version == "v1":
        h = layer._heads(features, layer.projection)  # (B, N, H, C)
        score_source = ops.sum(h * layer.attention_source, axis=-1)  # (B, N, H)
        score_target = ops.sum(h * layer.attention_target, axis=-1)
        score_source = ops.transpose(score_source, (0, 2, 1))[:, :, None, :]
        score_target = ops.transpose(score_target, (0, 2, 1))[:, :, :, None]
        scores = score_target + score_source  # (B, H, N, N)
        if edge_term is not None:
            scores = scores + ops.transpose(
                ops.sum(edge_term * layer.attention_edge, axis=-1), (0, 3, 1, 2)
            )
        scores = _leaky_relu(scores, layer.negative_slope)
        values = h
    else:
        values = layer._heads(features, layer.source)  # (B, N, H, C)
        h_target = layer._heads(features, layer.target)
        # (B, N_target, N_source, H, C)
        z = values[:, None, :, :, :] + h_target[:, :, None, :, :]
        if edge_term is not None:
            z = z + edge_term
        z = _leaky_relu(z, layer.negative_slope)
        scores = ops.transpose(
            ops.sum(z * layer.attention_kernel, axis=-1), (0, 3, 1, 2)
        )
    values = layer._message_dropout(values, training)
    # softmax, dropout and the weighted sum on the shared core: the
    # scores enter as its bias (the dot-product term is zero, heads of
    # size one); the coefficients come back before dropout.
    zeros = ops.zeros_like(values[..., :1])  # (B, N, H, 1)
    heads, alpha = base.attend(
        layer,
        zeros,
        zeros,
        values,
        mask[:, None, :, :],
        training,
        return_weights=True,
        bias=scores,
    )  # (B, N, H, C), (B, H, N, N)
    alpha = ops.cast(alpha, scores.dtype)
    out = layer._finish(heads)
    if unbatched:
        return out[0], alpha[0]
    return out, alpha
