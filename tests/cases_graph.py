"""Harness case and NumPy reference for GraphAttention (GAT and GATv2).

The reference follows the papers' equations node by node with the layer's
own weights: Veličković et al. (2018), eqs. 1-5 (and eq. 6 for averaged
heads); Brody et al. (2022), eq. 7 (GATv2); edge features as PyTorch
Geometric's `lin_edge`. It shares no code with the layer: it walks an
explicit list of edges `(source, target, features)`.
"""

import numpy as np

from tests.harness import LayerCase
from tests.harness import ScoreContract


def value(variable):
    return None if variable is None else np.asarray(variable.numpy(), "float64")


def leaky_relu(x, slope):
    return np.where(x >= 0, x, slope * x)


ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


def graph_edges(edges, edge_features, num_nodes, add_self_loops):
    """The explicit edge list `[(j, i, f_ji, row)]` the node `i` attends over.

    `row` is the row of the edge in the layer's coefficients (None for a
    removed self loop). With self loops: existing loops are dropped and one
    loop per node appended, its features the mean of the node's other
    incoming edges' features.
    """
    listed = []
    for row, (j, i) in enumerate(zip(edges[0], edges[1])):
        f = None if edge_features is None else np.asarray(edge_features[row], "float64")
        listed.append((int(j), int(i), f, row))
    if not add_self_loops:
        return listed
    kept = [(j, i, f, row) for j, i, f, row in listed if j != i]
    for i in range(num_nodes):
        f = None
        if edge_features is not None:
            incoming = [g for _, t, g, _ in kept if t == i]
            f = np.mean(incoming, axis=0) if incoming else np.zeros(edge_features.shape[-1])
        kept.append((i, i, f, len(listed) + i))
    return kept


def one_graph(layer, x, edges, edge_features):
    """Output `(N, out)` and `{row: alpha (H,)}` of one graph from the papers."""
    x = np.asarray(x, "float64")
    n = x.shape[0]
    heads, units = layer.num_heads, layer.units
    slope = layer.negative_slope

    def per_head(kernel):
        return kernel.reshape(kernel.shape[0], heads, units)  # (F, H, C)

    w_e = None if layer.edge_kernel is None else per_head(value(layer.edge_kernel))
    if layer.version == "v1":
        w = per_head(value(layer.kernel))
        a_s, a_t = value(layer.attention_source), value(layer.attention_target)
        a_e = value(layer.attention_edge)
    else:
        w_s = per_head(value(layer.source_kernel))
        w_t = per_head(value(layer.target_kernel))
        a = value(layer.attention_kernel)
    pairs = graph_edges(edges, edge_features, n, layer.add_self_loops)
    heads_out = np.zeros((n, heads, units))
    coefficients = {}
    for i in range(n):
        incoming = [(j, f, row) for j, t, f, row in pairs if t == i]
        if not incoming:
            continue
        for h in range(heads):
            scores, messages = [], []
            for j, f, _ in incoming:
                if layer.version == "v1":
                    # e_ij = LeakyReLU(a^T [W h_i || W h_j] (+ a_e^T W_e f_ji))
                    e = a_t[h] @ (x[i] @ w[:, h]) + a_s[h] @ (x[j] @ w[:, h])
                    if f is not None:
                        e += a_e[h] @ (f @ w_e[:, h])
                    scores.append(leaky_relu(e, slope))
                    messages.append(x[j] @ w[:, h])
                else:
                    # e_ij = a^T LeakyReLU(W_t h_i + W_s h_j (+ W_e f_ji))
                    z = x[i] @ w_t[:, h] + x[j] @ w_s[:, h]
                    if f is not None:
                        z = z + f @ w_e[:, h]
                    scores.append(a[h] @ leaky_relu(z, slope))
                    messages.append(x[j] @ w_s[:, h])
            scores = np.array(scores)
            alpha = np.exp(scores - scores.max())
            alpha /= alpha.sum()
            heads_out[i, h] = alpha @ np.array(messages)
            for (_, _, row), a_ij in zip(incoming, alpha):
                coefficients.setdefault(row, np.zeros(heads))[h] = a_ij
    if layer.concat_heads:
        out = heads_out.reshape(n, heads * units)
    else:
        out = heads_out.mean(axis=1)
    if layer.bias is not None:
        out = out + value(layer.bias)
    name = layer.get_config()["activation"]
    name = name if isinstance(name, str) else name.get("config", name)
    return ACTIVATIONS[name](out), coefficients


def graph_reference(layer, inputs, return_coefficients=False):
    """The layer's output (and coefficients) from the papers' equations.

    Edge list inputs give coefficients `(E', H)` in the layer's row order;
    adjacencies give `(B, H, N, N)` (or `(H, N, N)`), converted through an
    explicit edge list `j -> i` for every `adjacency[i, j] != 0`.
    """
    x, edges = np.asarray(inputs[0]), np.asarray(inputs[1])
    edge_features = None if len(inputs) < 3 else np.asarray(inputs[2])
    if np.issubdtype(edges.dtype, np.integer):
        out, coefficients = one_graph(layer, x, edges, edge_features)
        rows = edges.shape[1] + (x.shape[0] if layer.add_self_loops else 0)
        alpha = np.zeros((rows, layer.num_heads))
        for row, a in coefficients.items():
            alpha[row] = a
        return (out, alpha) if return_coefficients else out
    unbatched = x.ndim == 2
    xs = x[None] if unbatched else x
    adjacency = edges if edges.ndim == 3 else edges[None]
    adjacency = np.broadcast_to(adjacency, (xs.shape[0],) + adjacency.shape[1:])
    if edge_features is not None:
        edge_features = edge_features if edge_features.ndim == 4 else edge_features[None]
        edge_features = np.broadcast_to(
            edge_features, (xs.shape[0],) + edge_features.shape[1:]
        )
    outs, alphas = [], []
    n = xs.shape[1]
    for b in range(xs.shape[0]):
        targets, sources = np.nonzero(adjacency[b])
        ef = None if edge_features is None else edge_features[b][targets, sources]
        out, coefficients = one_graph(layer, xs[b], np.stack([sources, targets]), ef)
        alpha = np.zeros((layer.num_heads, n, n))
        for row, a in coefficients.items():
            if row < len(targets):
                alpha[:, targets[row], sources[row]] = a
            else:
                node = row - len(targets)
                alpha[:, node, node] = a
        outs.append(out)
        alphas.append(alpha)
    out, alpha = np.stack(outs), np.stack(alphas)
    if unbatched:
        out, alpha = out[0], alpha[0]
    return (out, alpha) if return_coefficients else out


def random_graph(rng, num_nodes=7, num_edges=16, features=5, edge_dim=None):
    """Node features and an edge list with a self loop, a duplicate edge and
    a node without incoming edges (node `num_nodes - 1`)."""
    x = rng.normal(size=(num_nodes, features)).astype("float32")
    source = rng.integers(0, num_nodes, size=num_edges)
    target = rng.integers(0, num_nodes - 1, size=num_edges)
    source[0], target[0] = 2, 2  # an existing self loop
    source[1], target[1] = source[2], target[2]  # a duplicate edge
    edges = np.stack([source, target]).astype("int32")
    if edge_dim is None:
        return [x, edges]
    return [x, edges, rng.normal(size=(num_edges, edge_dim)).astype("float32")]


def incoming_sums(weights, inputs):
    """Each node's incoming coefficients summed, `(N, H)`: the edge list
    with one self loop per node appended (`with_self_loops`)."""
    x, edges = inputs[0], np.asarray(inputs[1])
    n = x.shape[0]
    targets = np.concatenate([edges[1], np.arange(n)])
    return np.stack(
        [np.bincount(targets, weights=weights[:, h], minlength=n)
         for h in range(weights.shape[1])], -1,
    )


CASES = {
    # The edge-list (sparse) path on one graph: the node axis is the batch
    # axis of the harness's inputs, and the whole graph is one fit step.
    "graph": LayerCase(
        kwargs=dict(units=3, num_heads=2, activation="elu"),
        make_inputs=random_graph,
        reference=graph_reference,
        # (E + N, H): the edges, then one self loop per node.
        scores=ScoreContract(
            shapes=lambda g: [(g[1].shape[1] + g[0].shape[0], 2)],
            sums=incoming_sums,
            dropout={"dropout": 0.5, "seed": 1},
        ),
    ),
}
