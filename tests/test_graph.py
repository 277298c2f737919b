"""GraphAttention (GAT, GATv2) against the papers' equations, and its dropout."""

import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attention
from keras_attention.layers import graph
from keras_attention import ops as attention_ops
from keras_attention.layers import HashDropout
from keras_attention.layers.graph import GraphAttention
from tests.cases_graph import graph_reference, random_graph


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def compiled(fn):
    """`fn` compiled with XLA on TensorFlow (other backends: eager)."""
    if keras.backend.backend() == "tensorflow":
        return tf.function(fn, jit_compile=True)
    return fn


def layer_for(inputs, seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    layer = GraphAttention(**{"units": 3, "num_heads": 2, **kwargs})
    layer(inputs)
    # Non-zero biases, so the reference checks where the bias goes.
    if layer.bias is not None:
        layer.bias.assign(np.linspace(-0.5, 0.5, layer.bias.shape[0]))
    return layer


def simple_graph(rng, num_nodes=6, edge_dim=None):
    """A graph without duplicate edges (so an adjacency can hold it)."""
    pairs = [(j, i) for i in range(num_nodes - 1) for j in range(num_nodes) if rng.random() < 0.4]
    pairs.append((3, 3))  # an existing self loop
    pairs = sorted(set(pairs))
    edges = np.array(pairs, "int32").T
    x = rng.normal(size=(num_nodes, 4)).astype("float32")
    if edge_dim is None:
        return [x, edges]
    return [x, edges, rng.normal(size=(edges.shape[1], edge_dim)).astype("float32")]


def to_dense(inputs):
    x, edges = inputs[0], inputs[1]
    n = x.shape[0]
    adjacency = np.zeros((n, n), "float32")
    adjacency[edges[1], edges[0]] = 1.0  # [target, source]
    dense = [x, adjacency]
    if len(inputs) == 3:
        ef = np.zeros((n, n, inputs[2].shape[-1]), "float32")
        ef[edges[1], edges[0]] = inputs[2]
        dense.append(ef)
    return dense


COMBOS = list(itertools.product(["v1", "v2"], [True, False], [True, False], [None, 3]))


@pytest.mark.parametrize("version,concat,loops,edge_dim", COMBOS)
def test_edge_list_matches_the_papers(version, concat, loops, edge_dim):
    inputs = random_graph(np.random.default_rng(0), edge_dim=edge_dim)
    layer = layer_for(
        inputs, version=version, concat_heads=concat, add_self_loops=loops,
        activation="elu", negative_slope=0.3,
    )
    out, alpha = layer(inputs, return_attention_scores=True)
    expected, expected_alpha = graph_reference(layer, inputs, return_coefficients=True)
    width = 6 if concat else 3
    assert out.shape == (7, width)
    assert alpha.shape == (16 + 7 * loops, 2)
    np.testing.assert_allclose(numpy(out), expected, atol=2e-5)
    np.testing.assert_allclose(numpy(alpha), expected_alpha, atol=2e-6)


@pytest.mark.parametrize("version,edge_dim", [("v1", None), ("v2", 2), ("v1", 2)])
def test_dense_adjacency_matches_the_papers_and_the_edge_list(version, edge_dim):
    inputs = simple_graph(np.random.default_rng(1), edge_dim=edge_dim)
    dense = to_dense(inputs)
    layer = layer_for(inputs, version=version, num_heads=3)
    out, alpha = layer(dense, return_attention_scores=True)
    expected, expected_alpha = graph_reference(layer, dense, return_coefficients=True)
    assert alpha.shape == (3, 6, 6)
    np.testing.assert_allclose(numpy(out), expected, atol=2e-5)
    np.testing.assert_allclose(numpy(alpha), expected_alpha, atol=2e-6)
    # The same graph as an edge list gives the same nodes and coefficients.
    sparse_out, sparse_alpha = layer(inputs, return_attention_scores=True)
    np.testing.assert_allclose(numpy(sparse_out), numpy(out), atol=2e-5)
    full = numpy(graph.with_self_loops(inputs[1], 6))
    sparse_alpha = numpy(sparse_alpha)
    keep = full[0] != full[1]
    keep[inputs[1].shape[1]:] = True  # the appended loops, not the old one
    gathered = numpy(alpha)[:, full[1], full[0]].T  # (E', H)
    np.testing.assert_allclose(sparse_alpha[keep], gathered[keep], atol=2e-6)
    assert np.all(sparse_alpha[~keep] == 0)


def test_batched_adjacency_and_shared_adjacency():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 5, 4)).astype("float32")
    adjacency = (rng.random((3, 5, 5)) < 0.4).astype("float32")
    adjacency[0, 4] = 0  # node 4 of graph 0 has no neighbour
    layer = layer_for([x, adjacency], version="v2", add_self_loops=False)
    out, alpha = layer([x, adjacency], return_attention_scores=True)
    expected, expected_alpha = graph_reference(layer, [x, adjacency], return_coefficients=True)
    np.testing.assert_allclose(numpy(out), expected, atol=2e-5)
    np.testing.assert_allclose(numpy(alpha), expected_alpha, atol=2e-6)
    # Without neighbours and self loops a node outputs only the bias.
    np.testing.assert_allclose(numpy(out)[0, 4], numpy(layer.bias), atol=1e-6)
    # One (N, N) adjacency (bool) for a batch of feature sets.
    shared = adjacency[1] > 0
    out = layer([x, shared])
    expected = graph_reference(layer, [x, shared.astype("float32")])
    np.testing.assert_allclose(numpy(out), expected, atol=2e-5)


@pytest.mark.parametrize("loops", [True, False])
def test_coefficients_sum_to_one_per_target(loops):
    inputs = random_graph(np.random.default_rng(3), num_nodes=9, num_edges=30)
    layer = layer_for(inputs, num_heads=4, add_self_loops=loops)
    _, alpha = layer(inputs, return_attention_scores=True)
    edges = numpy(graph.with_self_loops(inputs[1], 9)) if loops else inputs[1]
    sums = np.zeros((9, 4))
    np.add.at(sums, edges[1], numpy(alpha))
    has_incoming = np.isin(np.arange(9), inputs[1][1]) | loops
    np.testing.assert_allclose(sums[has_incoming], 1.0, atol=1e-5)
    np.testing.assert_allclose(sums[~has_incoming], 0.0)
    _, dense_alpha = layer(to_dense(inputs), return_attention_scores=True)
    row_sums = numpy(dense_alpha).sum(-1)  # (H, N)
    np.testing.assert_allclose(row_sums[:, has_incoming], 1.0, atol=1e-5)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_invariant_to_edge_order(version):
    rng = np.random.default_rng(4)
    inputs = random_graph(rng, edge_dim=2)
    layer = layer_for(inputs, version=version)
    out, alpha = layer(inputs, return_attention_scores=True)
    order = rng.permutation(inputs[1].shape[1])
    permuted = [inputs[0], inputs[1][:, order], inputs[2][order]]
    out2, alpha2 = layer(permuted, return_attention_scores=True)
    np.testing.assert_allclose(numpy(out2), numpy(out), atol=1e-5)
    e = len(order)
    np.testing.assert_allclose(numpy(alpha2)[:e], numpy(alpha)[:e][order], atol=1e-6)
    np.testing.assert_allclose(numpy(alpha2)[e:], numpy(alpha)[e:], atol=1e-6)



@pytest.mark.parametrize("dtype", ["int8", "int16", "uint8", "uint16", "uint32", "int64"])
def test_any_integer_edge_list_dtype(dtype):
    # Every integer dtype is an edge list (the docstring), not only int32.
    inputs = simple_graph(np.random.default_rng(5), edge_dim=2)
    layer = layer_for(inputs)
    out, alpha = layer(inputs, return_attention_scores=True)
    cast = [inputs[0], inputs[1].astype(dtype), inputs[2]]
    out2, alpha2 = layer(cast, return_attention_scores=True)
    np.testing.assert_allclose(numpy(out2), numpy(out), atol=1e-6)
    np.testing.assert_allclose(numpy(alpha2), numpy(alpha), atol=1e-6)

def test_registry_and_config():
    layer = keras_attention.get("graph", units=4, num_heads=2, version="v2", dropout=0.1, seed=3)
    assert isinstance(layer, GraphAttention)
    clone = GraphAttention.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    assert layer.compute_output_shape([(7, 5), (2, 9)]) == (7, 8)
    assert layer.compute_output_shape([(3, 7, 5), (3, 7, 7)]) == (3, 7, 8)
    mean = GraphAttention(4, num_heads=2, concat_heads=False)
    assert mean.compute_output_shape([(7, 5), (2, 9)]) == (7, 4)


def test_seeded_initializer_gives_distinct_weights():
    inputs = random_graph(np.random.default_rng(0))
    layer = GraphAttention(3, num_heads=2, kernel_initializer=keras.initializers.GlorotUniform(seed=5))
    layer(inputs)
    assert not np.allclose(numpy(layer.attention_source), numpy(layer.attention_target))
    again = GraphAttention(3, num_heads=2, kernel_initializer=keras.initializers.GlorotUniform(seed=5))
    again(inputs)
    for a, b in zip(layer.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)


def cora_like(rng, n=40, f=12, classes=3):
    """A small graph whose labels follow the features and the edges."""
    labels = rng.integers(0, classes, size=n)
    x = (rng.normal(size=(n, f)) + np.eye(classes, f)[labels] * 2).astype("float32")
    same = labels[:, None] == labels[None, :]
    adjacency = rng.random((n, n)) < np.where(same, 0.3, 0.02)
    adjacency = np.triu(adjacency, 1)
    adjacency = adjacency | adjacency.T
    targets, sources = np.nonzero(adjacency)
    return x, np.stack([sources, targets]).astype("int32"), labels.astype("int32")


def gat_model(num_nodes, num_features, num_edges, num_classes):
    """The GAT paper's model, with a GATv2 first layer to fit both versions."""
    features = keras.Input(shape=(num_features,), batch_size=num_nodes)
    edges = keras.Input(shape=(num_edges,), batch_size=2, dtype="int32")
    x = HashDropout(0.6, seed=1)(features)
    x = GraphAttention(
        8, num_heads=4, activation="elu", dropout=0.6, version="v2", seed=2
    )([x, edges])
    x = HashDropout(0.6, seed=3)(x)
    logits = GraphAttention(num_classes, concat_heads=False, dropout=0.6, seed=4)(
        [x, edges]
    )
    return keras.Model([features, edges], logits)


def test_fit_with_xla_and_keras_file(tmp_path):
    rng = np.random.default_rng(5)
    x, edges, labels = cora_like(rng)
    keras.utils.set_random_seed(0)
    model = gat_model(40, 12, edges.shape[1], 3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss=loss, jit_compile=True)
    before = float(loss(labels, model((x, edges))))
    # The whole graph is one batch: features (N, F) and edges (2, E) do not
    # share a batch axis, so fit takes a dataset of one element.
    train = (np.arange(40) % 2 == 0).astype("float32")
    data = tf.data.Dataset.from_tensors(((x, edges), labels, train)).repeat(60)
    history = model.fit(data, epochs=1, verbose=0, shuffle=False)
    assert np.all(np.isfinite(history.history["loss"]))
    logits = model((x, edges))
    assert float(loss(labels, logits)) < before
    accuracy = np.mean(numpy(logits).argmax(-1) == labels)
    assert accuracy > 0.8, accuracy
    path = str(tmp_path / "gat.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded((x, edges))), numpy(logits))


def test_scores_output_in_a_functional_model_and_keras_file(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 5, 4)).astype("float32")
    adjacency = (rng.random((2, 5, 5)) < 0.5).astype("float32")
    features = keras.Input(shape=(5, 4))
    adj = keras.Input(shape=(5, 5))
    out, scores = GraphAttention(3, num_heads=2, version="v2")(
        [features, adj], return_attention_scores=True
    )
    assert tuple(out.shape) == (None, 5, 6)
    assert tuple(scores.shape) == (None, 2, 5, 5)
    model = keras.Model([features, adj], [out, scores])
    path = str(tmp_path / "dense.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    for a, b in zip(loaded([x, adjacency]), model([x, adjacency])):
        np.testing.assert_array_equal(numpy(a), numpy(b))
    # Edge list with an unknown number of nodes and edges.
    nodes = keras.Input(shape=(4,))
    edge_list = keras.Input(shape=(None,), batch_size=2, dtype="int32")
    out, scores = GraphAttention(3, num_heads=2)([nodes, edge_list], return_attention_scores=True)
    model = keras.Model([nodes, edge_list], [out, scores])
    inputs = random_graph(rng, features=4)
    result = model(inputs)
    assert result[0].shape == (7, 6) and result[1].shape == (23, 2)


def test_dense_path_compiles_with_xla_and_mixed_precision():
    rng = np.random.default_rng(7)
    inputs = simple_graph(rng, edge_dim=2)
    dense = to_dense(inputs)
    layer = layer_for(inputs, version="v2", dropout=0.5, seed=1)
    step = compiled(lambda d: layer(d, training=True))
    out = numpy(step(dense))
    assert np.all(np.isfinite(out)) and out.shape == (6, 6)
    low = GraphAttention(3, num_heads=2, version="v2", dtype="mixed_bfloat16")
    low(dense)
    low.set_weights(layer.get_weights())
    result = low(dense)
    assert keras.backend.standardize_dtype(result.dtype) == "bfloat16"
    expected = numpy(layer(dense))
    np.testing.assert_allclose(numpy(result).astype("float32"), expected, atol=5e-2 * max(1, np.abs(expected).max()))


def test_dropout_on_coefficients():
    inputs = random_graph(np.random.default_rng(8), num_nodes=30, num_edges=200)
    layer = layer_for(inputs, num_heads=4, dropout=0.5, seed=3)
    out = numpy(layer(inputs))
    np.testing.assert_array_equal(numpy(layer(inputs, training=False)), out)
    first, second = numpy(layer(inputs, training=True)), numpy(layer(inputs, training=True))
    assert not np.allclose(first, out) and not np.allclose(first, second)
    # Dropped coefficients are exactly zero, kept ones scaled by 1/(1-rate):
    # the expectation of the output is the output without dropout.
    step = compiled(lambda: layer(inputs, training=True))
    runs = np.mean([numpy(step()) for _ in range(200)], axis=0)
    assert np.abs(runs - out).mean() < 0.1 * np.abs(out).mean()


def numpy_lowbias32(x):
    x = np.array(x, "uint32")  # a copy: the steps below are in place
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def numpy_hash_bits(shape, seed):
    """`hash_bits` for an int seed, in NumPy uint32 arithmetic."""
    s0, s1 = np.uint32(seed), np.uint32(0)
    multiplier = numpy_lowbias32(s0 ^ numpy_lowbias32(s1)) | np.uint32(1)
    offset = numpy_lowbias32(multiplier + s1)
    counter = np.arange(np.prod(shape), dtype="uint32").reshape(shape)
    return numpy_lowbias32(counter * multiplier + offset).view("int32")


def test_hash_bits_match_numpy_and_look_uniform():
    words = np.array([0, 1, 2, 12345, 2**31 - 1, -(2**31), -1], "int32")
    expected = numpy_lowbias32(words.view("uint32")).view("int32")
    np.testing.assert_array_equal(numpy(attention_ops.random._mix32(words)), expected)
    bits = numpy(attention_ops.hash_bits((200, 500), 7))
    np.testing.assert_array_equal(bits, numpy_hash_bits((200, 500), 7))
    u = (bits.astype("float64") + 2.0**31) / 2.0**32
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.005
    # Neighbouring elements are uncorrelated; the same seed repeats.
    assert abs(np.corrcoef(u.ravel()[:-1], u.ravel()[1:])[0, 1]) < 0.01
    assert abs(np.corrcoef(u.ravel()[:-500], u.ravel()[500:])[0, 1]) < 0.01
    np.testing.assert_array_equal(numpy(attention_ops.hash_bits((200, 500), 7)), bits)
    other = (numpy(attention_ops.hash_bits((200, 500), 8)) + 2.0**31) / 2.0**32
    assert abs(np.corrcoef(u.ravel(), other.ravel())[0, 1]) < 0.01


def test_hash_dropout_keeps_the_expected_share_and_changes_per_step():
    x = np.ones((100, 1000), "float32")
    generator = keras.random.SeedGenerator(0)
    a = numpy(attention_ops.hash_dropout(x, 0.6, generator))
    b = numpy(attention_ops.hash_dropout(x, 0.6, generator))
    assert abs((a > 0).mean() - 0.4) < 0.005
    np.testing.assert_allclose(a[a > 0], 1 / 0.4, rtol=1e-6)
    agree = ((a > 0) == (b > 0)).mean()
    assert abs(agree - (0.4**2 + 0.6**2)) < 0.01  # independent masks
    # ... also up to a shift (two steps are not shifted copies of one stream).
    flat_a, flat_b = a.ravel() > 0, b.ravel() > 0
    for shift in range(1, 64):
        agree = (flat_a[shift:] == flat_b[:-shift]).mean()
        assert abs(agree - 0.52) < 0.01, shift
    layer = HashDropout(0.3, seed=1)
    np.testing.assert_array_equal(numpy(layer(x)), x)
    assert abs((numpy(layer(x, training=True)) > 0).mean() - 0.7) < 0.01
    assert HashDropout.from_config(layer.get_config()).rate == 0.3
    # NumPy's floats are rates too ("expected a float ... rate=np.float32(0.5)").
    np.testing.assert_array_equal(
        numpy(attention_ops.hash_dropout(x, np.float32(0.6), 5)),
        numpy(attention_ops.hash_dropout(x, float(np.float32(0.6)), 5)),
    )
    for rate in (True, 1.0, -0.1, "0.5"):
        with pytest.raises(ValueError, match="`rate`"):
            attention_ops.hash_dropout(x, rate, 5)


BAD_ARGUMENTS = [
    (dict(units=0), "units"),
    (dict(units=2, num_heads=-1), "num_heads"),
    (dict(units=2, concat_heads="yes"), "concat_heads"),
    (dict(units=2, negative_slope=-0.1), "negative_slope"),
    (dict(units=2, dropout=1.0), "dropout"),
    (dict(units=2, add_self_loops=1), "add_self_loops"),
    (dict(units=2, version="v3"), "version"),
]


@pytest.mark.parametrize("kwargs,argument", BAD_ARGUMENTS)
def test_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=f"`{argument}`.*Received: {argument}="):
        GraphAttention(**kwargs)


def test_bad_inputs():
    rng = np.random.default_rng(9)
    x, edges = random_graph(rng)
    layer = GraphAttention(2)
    layer([x, edges])
    bad = [
        ([x, np.array([[0, 1], [2, 7]], "int32")], r"`edges`.*\[0, 7\).*\[0, 7\]"),
        ([x, np.array([[0, -1], [2, 3]], "int32")], r"`edges`.*\[-1, 3\]"),
        ([x, edges.astype("float32")], r"`edges`.*dense adjacency.*edges.shape=\(2, 16\)"),
        ([x, np.zeros((7, 7), "int32")], r"`edges`.*integer tensor is an edge list"),
        ([x, np.zeros((7, 6), "float32")], r"`edges`.*square.*edges.shape=\(7, 6\)"),
        ([x, np.zeros((5, 5), "float32")], r"`edges`.*N=7"),
        ([x, np.zeros((3, 16), "int32")], r"`edges`.*\(2, E\)"),
        ([x, edges.astype("complex64")], r"`edges`.*edges.dtype=complex64"),
        ([x[0], edges], r"`node_features`.*rank 2"),
        ([x[None, None], edges], r"`node_features`.*node_features.shape=\(1, 1, 7, 5\)"),
        ([x[None], edges[None]], r"`edges`"),
        ([x, edges, np.zeros((15, 2), "float32")], r"`edge_features`.*E=16"),
        ([x], r"list \[node_features, edges\]"),
    ]
    for inputs, message in bad:
        with pytest.raises(ValueError, match=message):
            layer(inputs)
    with_edges = GraphAttention(2)
    with_edges([x, edges, np.zeros((16, 2), "float32")])
    with pytest.raises(ValueError, match="edge features"):
        with_edges([x, edges])
    dense = GraphAttention(2)
    adjacency = np.ones((7, 7), "float32")
    with pytest.raises(ValueError, match=r"`edge_features`.*\(7, 7, 'F_e'\)"):
        dense([x, adjacency, np.zeros((7, 6, 2), "float32")])
    # Symbolic inputs fail the same way as eager ones.
    with pytest.raises(ValueError, match=r"`edges`.*square"):
        GraphAttention(2)([keras.Input((5,), batch_size=7), keras.Input((6,), batch_size=7)])
