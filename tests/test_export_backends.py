"""`model.export` of the graph, window and feature-map layers on JAX
(`format="tf_saved_model"`, unknown sizes as symbols) and torch
(`format="onnx"`: every size traced as a tensor, unknown ones as 1).

The exported models are run at sizes other than the traced ones. CI runs
this file with `KERAS_BACKEND=jax` and `KERAS_BACKEND=torch`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_attention.layers import GraphAttention  # noqa: E402
from keras_attention.layers import LocalWindowAttention  # noqa: E402

BACKEND = keras.backend.backend()
on_torch = pytest.mark.skipif(BACKEND != "torch", reason="torch's ONNX export")
on_jax = pytest.mark.skipif(BACKEND != "jax", reason="JAX's export")
RNG = np.random.default_rng(0)


def _edges(num_nodes, num_edges):
    return RNG.integers(0, num_nodes, (2, num_edges)).astype("int32")


def _graph(num_nodes, num_edges, features=5, edge_features=4):
    return [
        RNG.random((num_nodes, features), "float32"),
        _edges(num_nodes, num_edges),
        RNG.random((num_edges, edge_features), "float32"),
    ]


def _edge_list_model(version):
    nodes = keras.Input((5,))
    edges = keras.Input((None,), batch_size=2, dtype="int32")
    edge_features = keras.Input((4,))
    layer = GraphAttention(3, num_heads=2, version=version)
    model = keras.Model(
        [nodes, edges, edge_features], layer([nodes, edges, edge_features])
    )
    model(_graph(7, 12))
    return model


EDGE_LIST_SIGNATURE = [
    [
        keras.InputSpec(shape=(None, 5), dtype="float32"),
        keras.InputSpec(shape=(2, None), dtype="int32"),
        keras.InputSpec(shape=(None, 4), dtype="float32"),
    ]
]


def _onnx_outputs(model, tmp_path, feeds, **kwargs):
    import onnxruntime

    path = str(tmp_path / "model.onnx")
    model.export(path, format="onnx", verbose=False, **kwargs)
    session = onnxruntime.InferenceSession(path)
    names = [i.name for i in session.get_inputs()]
    return [session.run(None, dict(zip(names, x)))[0] for x in feeds]


def _assert_same(model, feeds, outputs):
    for x, got in zip(feeds, outputs):
        want = keras.ops.convert_to_numpy(model(x))
        np.testing.assert_allclose(got, want, atol=1e-5)


# ------------------------------------------------------------------ torch


@on_torch
def test_local_window_attention_exports_to_onnx_with_an_unknown_batch(tmp_path):
    # The trace gives the height and width as 0-d tensors: the layer took
    # them for unknown and refused to build its windows.
    pytest.importorskip("onnxruntime")
    inputs = keras.Input((9, 10, 8))
    layer = LocalWindowAttention(num_heads=2, window_size=4, shift_size=2)
    model = keras.Model(inputs, layer(inputs))
    model(np.zeros((1, 9, 10, 8), "float32"))
    feeds = [[RNG.random((b, 9, 10, 8), "float32")] for b in (1, 3)]
    _assert_same(model, feeds, _onnx_outputs(model, tmp_path, feeds))


@on_torch
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_graph_edge_list_exports_to_onnx_with_unknown_nodes_and_edges(
    tmp_path, version
):
    # GATv2's messages were gathered from a rank-3 tensor (keras's `take`
    # then writes `ravel`, which the exporter refuses), and the trace's
    # inputs of ones (one node, the edge 1 -> 1) failed the gathers.
    pytest.importorskip("onnxruntime")
    model = _edge_list_model(version)
    feeds = [_graph(7, 12), _graph(3, 4)]
    outputs = _onnx_outputs(
        model, tmp_path, feeds, input_signature=EDGE_LIST_SIGNATURE
    )
    _assert_same(model, feeds, outputs)


@on_torch
def test_graph_edge_list_export_without_a_signature_says_what_to_pass(tmp_path):
    # keras's default signature gives the edges an unknown first dimension,
    # traced as 1: the layer said "expected shape (2, E)", not how to export.
    model = _edge_list_model("v1")
    with pytest.raises(ValueError, match="input_signature"):
        model.export(str(tmp_path / "model.onnx"), format="onnx", verbose=False)


@on_torch
def test_graph_adjacency_exports_to_onnx_with_unknown_nodes(tmp_path):
    # Traced with one node, `masked_softmax`'s one-key branch was written
    # into the file as `exp(x - x)`: every coefficient 1 at other sizes
    # (fixed in `ops/masks.py`; this guards the graph layer's use of it).
    pytest.importorskip("onnxruntime")
    nodes, adjacency = keras.Input((None, 5)), keras.Input((None, None))
    model = keras.Model(
        [nodes, adjacency], GraphAttention(3, num_heads=2)([nodes, adjacency])
    )

    def graph(batch, n):
        adjacency = (RNG.random((batch, n, n)) > 0.5).astype("float32")
        return [RNG.random((batch, n, 5), "float32"), adjacency]

    model(graph(2, 6))
    feeds = [graph(2, 6), graph(3, 4)]
    _assert_same(model, feeds, _onnx_outputs(model, tmp_path, feeds))


# ------------------------------------------------------------------ JAX


def _trace_with_symbols(layer, inputs, shapes):
    """Trace `layer` with JAX's export on inputs of symbolic `shapes`, as
    `model.export` does (`"(batch, a)"`: keras's default names)."""
    import jax
    from jax import export

    layer.build([x.shape for x in inputs])
    variables = [v.value for v in layer.trainable_variables]
    scope = export.SymbolicScope()
    specs = [
        jax.ShapeDtypeStruct(export.symbolic_shape(shape, scope=scope), x.dtype)
        for shape, x in zip(shapes, inputs)
    ]

    def forward(variables, *inputs):
        return layer.stateless_call(variables, [], list(inputs))[0]

    return export.export(jax.jit(forward))(variables, *specs)


@on_jax
def test_graph_export_without_a_signature_says_what_to_pass():
    # keras's default signature: the edge list's first dimension and an
    # adjacency's N are symbols there. The check rejected `(batch, E)`
    # without saying how to export; an adjacency's N named apart from the
    # features' failed inside the layer with a broadcasting TypeError.
    with pytest.raises(ValueError, match="input_signature"):
        _trace_with_symbols(
            GraphAttention(3), _graph(7, 12)[:2], ["batch, 5", "batch, a"]
        )
    adjacency = [RNG.random((2, 6, 5), "float32"), np.ones((2, 6, 6), "float32")]
    with pytest.raises(ValueError, match="polymorphic_shapes"):
        _trace_with_symbols(
            GraphAttention(3), adjacency, ["batch, a, 5", "batch, b, c"]
        )


@pytest.mark.large  # TensorFlow's SavedModel writer and loader
@on_jax
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_graph_edge_list_exports_as_a_saved_model_on_jax(tmp_path, version):
    import tensorflow as tf

    model = _edge_list_model(version)
    model.export(
        tmp_path / "saved",
        format="tf_saved_model",
        verbose=False,
        input_signature=EDGE_LIST_SIGNATURE,
        jax2tf_kwargs={"polymorphic_shapes": [["(n, 5)", "(2, e)", "(e, 4)"]]},
    )
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    feeds = [_graph(7, 12), _graph(3, 4)]
    outputs = [
        loaded.serve([tf.constant(t) for t in x]).numpy() for x in feeds
    ]
    _assert_same(model, feeds, outputs)


@on_jax
def test_a_transformer_block_exports_as_a_servable_saved_model_on_jax(tmp_path):
    # The blocks' GELU once used `ops.erf`, which JAX lowers to a StableHLO
    # composite TensorFlow cannot load: the export wrote, `serve` failed.
    import tensorflow as tf

    from keras_attention.applications.blocks import TransformerEncoderBlock

    model = keras.Sequential(
        [keras.Input((6, 8)), TransformerEncoderBlock(num_heads=2, mlp_dim=16)]
    )
    x = RNG.random((3, 6, 8), "float32")
    model.export(tmp_path / "saved", format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    served = loaded.serve(tf.constant(x))
    np.testing.assert_allclose(
        served.numpy(), keras.ops.convert_to_numpy(model(x)), atol=1e-5
    )


@on_torch
def test_the_gat_application_exports_to_onnx_and_runs_other_graphs(tmp_path):
    # Its input check read torch's traced inputs of ones as the user's
    # edges and refused them ("node ids in [0, 1) ... values in [1, 1]").
    pytest.importorskip("onnxruntime")
    from keras_attention.applications import GATNodeClassifier

    keras.utils.set_random_seed(0)
    model = GATNodeClassifier(num_features=5, num_classes=2, hidden_units=4, num_heads=2)
    feeds = [[RNG.random((1, n, 5), "float32"), _edges(n, e)[None]]
             for n, e in ((7, 12), (3, 4))]
    model(feeds[0])
    signature = [[keras.InputSpec(shape=(1, None, 5), dtype="float32"),
                  keras.InputSpec(shape=(1, 2, None), dtype="int32")]]
    outputs = _onnx_outputs(model, tmp_path, feeds, input_signature=signature)
    _assert_same(model, feeds, outputs)
