"""`GraphAttention` against PyTorch Geometric's `GATConv` and `GATv2Conv`
(the peers its docstring names), weights copied: outputs, coefficients and
input gradients on a graph with what PyG users meet (duplicate edges, a
self loop already present, a node without incoming edges, directed edges
in no order, edge features and their self loops' "mean" fill)."""

import keras
import numpy as np
import pytest

from keras_attention.layers import GraphAttention

torch = pytest.importorskip("torch")
pyg = pytest.importorskip("torch_geometric.nn")

RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 4)).astype("float32")
# j -> i as (source, target) rows; (1, 2) twice, (3, 3) a self loop, node 5
# receives nothing.
EDGES = np.array([[2, 1, 0, 3, 1, 4, 0, 5], [1, 2, 1, 3, 2, 0, 4, 3]], "int32")
EDGE_FEATURES = RNG.normal(size=(EDGES.shape[1], 3)).astype("float32")


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def peer(layer, edge_dim):
    """PyG's layer with `layer`'s weights (float64)."""
    t = lambda v: torch.tensor(numpy(v).astype("float64"))  # noqa: E731
    common = dict(
        heads=layer.num_heads, concat=layer.concat_heads,
        negative_slope=layer.negative_slope, add_self_loops=layer.add_self_loops,
        edge_dim=edge_dim, fill_value="mean", dropout=0.0,
    )
    if layer.version == "v1":
        conv = pyg.GATConv(X.shape[1], layer.units, **common).double()
        weights = {"lin.weight": t(layer.projection.kernel).T,
                   "att_src": t(layer.attention_source)[None],
                   "att_dst": t(layer.attention_target)[None]}
        if edge_dim:
            weights["att_edge"] = t(layer.attention_edge)[None]
    else:
        conv = pyg.GATv2Conv(
            X.shape[1], layer.units, share_weights=False, **common
        ).double()
        # Ours has no projection biases (its docstring says so).
        weights = {"lin_l.weight": t(layer.source.kernel).T,
                   "lin_l.bias": torch.zeros(conv.lin_l.bias.shape, dtype=torch.float64),
                   "lin_r.weight": t(layer.target.kernel).T,
                   "lin_r.bias": torch.zeros(conv.lin_r.bias.shape, dtype=torch.float64),
                   "att": t(layer.attention_kernel)[None]}
    if edge_dim:
        weights["lin_edge.weight"] = t(layer.edge_projection.kernel).T
    weights["bias"] = t(layer.bias)
    state = conv.state_dict()
    assert set(weights) <= set(state), set(weights) - set(state)
    conv.load_state_dict({**state, **weights})
    return conv


def ours_with_gradient(layer, inputs, weights_out):
    if keras.backend.backend() != "tensorflow":
        out, alpha = layer(inputs, return_attention_scores=True)
        return numpy(out), numpy(alpha), None
    import tensorflow as tf

    x = tf.constant(inputs[0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        out, alpha = layer([x] + inputs[1:], return_attention_scores=True)
        loss = tf.reduce_sum(out * weights_out)
    return numpy(out), numpy(alpha), numpy(tape.gradient(loss, x))


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("edge_features", [False, True])
@pytest.mark.parametrize("concat", [True, False])
def test_agrees_with_pytorch_geometric(version, self_loops, edge_features, concat):
    keras.utils.set_random_seed(1)
    layer = GraphAttention(
        units=3, num_heads=2, version=version, concat_heads=concat,
        add_self_loops=self_loops, negative_slope=0.3,
    )
    inputs = [X, EDGES] + ([EDGE_FEATURES] if edge_features else [])
    layer(inputs)
    layer.bias.assign(np.linspace(-0.5, 0.5, layer.bias.shape[0]).astype("float32"))
    width = layer.bias.shape[0]
    weights_out = RNG.normal(size=(X.shape[0], width)).astype("float32")
    out, alpha, grad = ours_with_gradient(layer, inputs, weights_out)

    conv = peer(layer, EDGE_FEATURES.shape[1] if edge_features else None)
    x = torch.tensor(X.astype("float64"), requires_grad=True)
    edge_attr = torch.tensor(EDGE_FEATURES.astype("float64")) if edge_features else None
    expected, (peer_edges, peer_alpha) = conv(
        x, torch.tensor(EDGES.astype("int64")), edge_attr=edge_attr,
        return_attention_weights=True,
    )
    (expected * torch.tensor(weights_out.astype("float64"))).sum().backward()
    np.testing.assert_allclose(out, expected.detach().numpy(), atol=1e-5)
    if grad is not None:
        np.testing.assert_allclose(grad, x.grad.numpy(), atol=1e-5)
    # PyG drops the self loop already given and appends one per node after
    # the other edges; ours keeps its row (0) and appends after all edges.
    if self_loops:
        given = EDGES[0] != EDGES[1]
        np.testing.assert_array_equal(alpha[: EDGES.shape[1]][~given], 0.0)
        alpha = np.concatenate([alpha[: EDGES.shape[1]][given], alpha[EDGES.shape[1]:]])
        ours_edges = np.concatenate(
            [EDGES[:, given], np.stack([np.arange(X.shape[0])] * 2)], axis=1
        )
    else:
        ours_edges = EDGES
    np.testing.assert_array_equal(ours_edges, peer_edges.numpy())
    np.testing.assert_allclose(alpha, peer_alpha.detach().numpy(), atol=1e-5)
