"""Node classification with graph attention networks (Veličković et al., 2018).

The GAT paper's transductive model: dropout on the node features, a
`GraphAttention` layer of 8 heads x 8 units with ELU (heads concatenated),
dropout, and an output `GraphAttention` layer with one head (8 averaged heads
on PubMed) giving the class logits of every node; dropout 0.6 on the inputs
of both layers, on the attention coefficients and on each node's projected
features before they are summed (the paper's reference code), L2
regularization 5e-4.

A graph is one sample: the model takes a batch of **one** graph,
`[features (1, N, F), edges (1, 2, E)]`, and returns `(1, N, num_classes)`
logits, so plain `fit` works on NumPy arrays; the training, validation and
test nodes are chosen with per-node sample weights
(`node_classification_data` prepares all of it from a `GraphData`).
"""

import collections
import warnings

import keras
import numpy as np
from keras import ops

from keras_attention import registry
from keras_attention.applications import base as app_base
from keras_attention.applications import compiling
from keras_attention.applications import presets
from keras_attention.applications.input_checks import bind
from keras_attention._config import FunctionalConfig
from keras_attention import _validation as base
from keras_attention.layers.dropout import HashDropout
from keras_attention.applications.node_sampling import check_graph_labels

NodeClassificationData = collections.namedtuple(
    "NodeClassificationData",
    ["inputs", "labels", "train_weights", "val_weights", "test_weights"],
)
NodeClassificationData.__doc__ = """One graph as a batch for `GATNodeClassifier`.

Fields:
    inputs: `[features (1, N, F) float32, edges (1, 2, E) int32]`.
    labels: int32 `(1, N)`; nodes without a label get 0 (and weight 0).
    train_weights, val_weights, test_weights: float32 `(1, N)`: the split's
        mask scaled to mean 1 over the nodes, so that the mean loss keras
        computes is the mean over the split's nodes.
"""


def _split_weights(mask):
    mask = np.asarray(mask, dtype="float32")
    count = mask.sum()
    scale = mask.size / count if count else 0.0
    return (mask * scale)[None]


def _graph_nodes(x):
    """The static node count `N` of inputs `[features (1, N, F), edges]`."""
    if isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape"):
        if len(x[0].shape) == 3:
            return base.known_dim(x[0].shape[1])
    return None


def _warn_without_split(method, does, x, given):
    """Warn when a whole graph comes without a split's weights: every
    node counts then, the validation and test nodes' labels too (and an
    unlabelled node's 0)."""
    if isinstance(x, (list, tuple)) and given.get("sample_weight") is None:
        warnings.warn(
            f"GATNodeClassifier.{method} without `sample_weight` {does} "
            "every node of the graph, the validation and test nodes too; "
            f"pass a split's weights, e.g. `{method}(data.inputs, "
            "data.labels, sample_weight=data.train_weights)`.",
            stacklevel=3,
        )


def _check_split(argument, weights, nodes=None):
    """A ValueError unless the split weights `weights` are one per node,
    `(1, N)` (`nodes`: `N` where known), and (values known here) select a
    node: all 0 is an empty split (a mask with no True, or no labelled node
    in it), which keras would score 0, not an error."""
    shape = getattr(weights, "shape", None)
    if shape is not None and not base.shape_fits(tuple(shape), (1, nodes)):
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"one weight per node of the graph, shape (1, {nodes}). "
            f"Received: {argument}.shape={tuple(shape)}"
        )
    if weights is None or not (
        isinstance(weights, np.ndarray)
        or (ops.is_tensor(weights) and not base.is_symbolic(weights))
    ):
        return
    if not np.any(ops.convert_to_numpy(weights)):
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            "the weights of a split with at least one labelled node. "
            f"Received: {argument} with every weight 0 (an empty split: its "
            "mask has no True, or no node of it has a label)"
        )


def node_classification_data(graph):
    """A `NodeClassificationData` from a `keras_attention.datasets.GraphData`.

    Example:

    ```python
    data = node_classification_data(load_karate_club())
    model = GATNodeClassifier(num_features=34, num_classes=2)
    model.compile()
    model.fit(data.inputs, data.labels, sample_weight=data.train_weights,
              epochs=50, verbose=0)
    ```
    """
    num_nodes = len(graph.features)
    masks = {}
    for name in ("train_mask", "val_mask", "test_mask"):
        mask = np.asarray(getattr(graph, name))
        if mask.dtype != bool or mask.shape != (num_nodes,):
            raise base.invalid(
                f"graph.{name}", f"a boolean mask of shape ({num_nodes},)",
                f"an array of shape {mask.shape} and dtype {mask.dtype}",
            )
        masks[name] = mask
    labels = check_graph_labels(
        graph, num_nodes, np.flatnonzero(masks["train_mask"]),
        "graph.train_mask",
    )
    known = labels >= 0

    def weights(mask):
        return _split_weights(mask & known)

    return NodeClassificationData(
        inputs=[
            np.asarray(graph.features, "float32")[None],
            np.asarray(graph.edges, "int32")[None],
        ],
        labels=np.where(known, labels, 0).astype("int32")[None],
        train_weights=weights(masks["train_mask"]),
        val_weights=weights(masks["val_mask"]),
        test_weights=weights(masks["test_mask"]),
    )


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class GraphUnbatch(keras.layers.Layer):
    """`(1, ...) -> (...)`: the one graph of a batch of one."""

    def call(self, inputs):
        return inputs[0]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[1:])

    def compute_output_spec(self, inputs):
        # The input's dtype: integer edge ids must stay integers (the
        # default spec has the layer's float dtype, which would make the
        # graph layers read the edges as a dense adjacency).
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=inputs.dtype
        )


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class GraphBatch(keras.layers.Layer):
    """`(...) -> (1, ...)`: one graph's outputs as a batch of one."""

    def call(self, inputs):
        return inputs[None]

    def compute_output_shape(self, input_shape):
        return (1,) + tuple(input_shape)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=inputs.dtype
        )


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class GATNodeClassifier(
    FunctionalConfig,
    app_base.PresetMixin,
    compiling.CompileDefaults,
    app_base.InputChecks,
    app_base.QuickQuantize,
    keras.Model,
):
    """The two-layer graph attention network of Veličković et al. (2018).

    `Dropout -> GraphAttention(hidden_units, num_heads, ELU, concat) ->
    Dropout -> GraphAttention(num_classes, output_heads, mean)`, the
    attention layers being the registry's `attention` (`"graph"`: GAT, or
    GATv2 with `version="v2"`). Dropout (`HashDropout`, fast under XLA) with
    rate `dropout` acts on both layers' inputs, with rate
    `attention_dropout` on the coefficients, and with rate
    `feature_dropout` on each node's projected features `W h_j` before
    they are summed (the reference code's dropout of `seq_fts`, at the
    input rate; given to attention layers that take it). `weight_decay`
    is the paper's
    L2 coefficient: `weight_decay / 2 * ||W||^2` is added to the loss for
    every kernel and attention vector (`tf.nn.l2_loss` in the paper's code,
    `weight_decay` in PyTorch's Adam).

    Args:
        num_features: size `F` of the node features.
        num_classes: number of classes.
        hidden_units: units per head of the first layer (8).
        num_heads: heads of the first layer (8).
        output_heads: heads of the output layer, averaged (1; 8 for PubMed).
        dropout: dropout rate of the layers' inputs (0.6).
        attention_dropout: dropout rate of the coefficients; defaults to
            `dropout`.
        feature_dropout: dropout rate of the projected features before
            the sum; defaults to `dropout` (0 leaves them undropped, as
            PyTorch Geometric's `GATConv` does).
        weight_decay: L2 coefficient (5e-4; 1e-3 for PubMed).
        activation: activation of the first layer (`"elu"`).
        version: `"v1"` (GAT) or `"v2"` (GATv2), for layers that take it.
        attention: registry name of the graph attention layer; it must take
            `[features (N, F), edges (2, E)]`.
        attention_kwargs: extra constructor arguments of both layers.

    Call arguments:
        inputs: `[features (1, N, F), edges (1, 2, E)]`, edges as int
            `(source, target)` rows, node ids in `[0, N)`.

    Returns:
        Logits `(1, N, num_classes)`.

    Under a `tf.distribute` strategy with `R` replicas, feed each replica
    its own copy of the graph: a `tf.data.Dataset` of batches of `R` copies
    (`Dataset.from_tensors(((features[0], edges[0]), labels[0],
    weights[0])).repeat(R).batch(R)`); a batch of one graph cannot be split
    over replicas. Training then matches one device
    (`tests/test_distributed.py`).

    Raises:
        ValueError: naming the argument: `num_features`,
            `num_classes`, `hidden_units`, `num_heads` or `output_heads`
            not positive integers; a dropout rate outside `[0, 1)`;
            `weight_decay` negative; an `attention` the registry lacks or
            that is not a graph layer; features of another width than
            `num_features`, edges that are not integer node ids in
            `[0, N)`, or a batch of more than one graph; in `fit` and
            `evaluate`, labels outside `[0, num_classes)` or a
            `sample_weight` (a split's mask) of another length than the
            nodes.

    Example:

    ```python
    graph = keras_attention.datasets.load_karate_club()
    data = node_classification_data(graph)
    model = GATNodeClassifier(num_features=34, num_classes=2)
    model.compile()  # Adam(0.005), cross-entropy from logits, accuracy
    model.fit(data.inputs, data.labels, sample_weight=data.train_weights,
              validation_data=(data.inputs, data.labels, data.val_weights),
              epochs=200, callbacks=[GATEarlyStopping(patience=100)])
    ```

    References:
        - Veličković et al., Graph Attention Networks, ICLR 2018.
          https://arxiv.org/abs/1710.10903
    """

    def __init__(
        self,
        num_features,
        num_classes,
        hidden_units=8,
        num_heads=8,
        output_heads=1,
        dropout=0.6,
        attention_dropout=None,
        weight_decay=5e-4,
        activation="elu",
        version="v1",
        attention="graph",
        attention_kwargs=None,
        feature_dropout=None,
        **kwargs,
    ):
        base.check_positive_int("num_features", num_features)
        base.check_positive_int("num_classes", num_classes)
        base.check_positive_int("hidden_units", hidden_units)
        base.check_positive_int("num_heads", num_heads)
        base.check_positive_int("output_heads", output_heads)
        base.check_rate("dropout", dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        base.check_rate("attention_dropout", attention_dropout)
        feature_dropout = dropout if feature_dropout is None else feature_dropout
        base.check_rate("feature_dropout", feature_dropout)
        if isinstance(weight_decay, bool) or not (
            isinstance(weight_decay, (int, float)) and weight_decay >= 0
        ):
            raise base.invalid("weight_decay", "a non-negative float", weight_decay)
        attention = registry.check_name(attention, kinds=("graph",))
        regularizer = keras.regularizers.L2(weight_decay / 2) if weight_decay else None

        def graph_layer(units, heads, concat, layer_activation, name):
            return registry.build(
                attention,
                {
                    "units": units,
                    "num_heads": heads,
                    "concat_heads": concat,
                    "dropout": attention_dropout,
                    "feature_dropout": feature_dropout,
                    "activation": layer_activation,
                    "version": version,
                    "kernel_regularizer": regularizer,
                },
                attention_kwargs,
                name=name,
            )

        features = keras.Input(shape=(None, num_features), batch_size=1, name="features")
        edges = keras.Input(shape=(2, None), batch_size=1, dtype="int32", name="edges")
        x = GraphUnbatch(name="unbatch_features")(features)
        edge_list = GraphUnbatch(name="unbatch_edges")(edges)
        x = HashDropout(dropout, name="input_dropout")(x)
        x = graph_layer(hidden_units, num_heads, True, activation, "graph_attention_1")(
            [x, edge_list]
        )
        x = HashDropout(dropout, name="hidden_dropout")(x)
        x = graph_layer(num_classes, output_heads, False, None, "graph_attention_2")(
            [x, edge_list]
        )
        outputs = GraphBatch(name="logits")(x)
        super().__init__(inputs=[features, edges], outputs=outputs, **kwargs)
        self.input_spec = None

        self.keep_config(locals())

    def call(self, inputs, training=None, mask=None):
        if (
            isinstance(inputs, (list, tuple))
            and len(inputs) == 2
            and base.is_symbolic(inputs[1])
            and "float" in keras.backend.standardize_dtype(inputs[1].dtype)
        ):
            # Under a tf.distribute strategy Keras builds the model on a
            # symbolic batch averaged over the replicas, which makes the
            # edge ids floats; real data is checked by `fit` and eager calls.
            inputs = [inputs[0], ops.cast(inputs[1], "int32")]
        return super().call(inputs, training=training, mask=mask)

    def check_inputs(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(
                "Received an invalid value for argument `inputs`, expected a "
                "list [features (1, N, F), edges (1, 2, E)]. Received: "
                f"inputs={inputs!r}"
            )
        features, edges = inputs
        # Inside an export the sizes are JAX symbols or torch-traced
        # tensors (whose inputs of ones are no user's values): unknown.
        exporting = base.exporting(features.shape, edges.shape)
        f_shape, e_shape = (
            tuple(base.known_dim(d) for d in x.shape) for x in (features, edges)
        )
        if len(f_shape) != 3 or f_shape[0] not in (None, 1) or f_shape[-1] not in (
            None,
            self.num_features,
        ):
            raise ValueError(
                "Received an invalid value for argument `features`, expected "
                f"a batch of one graph (1, N, {self.num_features}). "
                f"Received: features.shape={f_shape}"
            )
        if len(e_shape) != 3 or e_shape[0] not in (None, 1) or e_shape[1] not in (
            None,
            2,
        ):
            raise ValueError(
                "Received an invalid value for argument `edges`, expected "
                "an edge list of one graph (1, 2, E) (source and target "
                f"rows). Received: edges.shape={e_shape}"
            )
        base.check_dtype("edges", edges, "int", "integer node ids")
        num_nodes = f_shape[1]
        known = isinstance(edges, np.ndarray) or (
            ops.is_tensor(edges) and not base.is_symbolic(edges)
        )  # not a dataset's TensorSpec
        if num_nodes is not None and known and not exporting:
            # NumPy arrays and eager tensors: their values are known here,
            # before `fit`, `evaluate` or `predict` trace the model.
            base.check_ids_in_range(
                "edges", ops.convert_to_numpy(edges), num_nodes, "node ids",
                f"the {num_nodes} nodes of features.shape={f_shape}",
            )
        elif num_nodes is not None and base.batch_checks_open():
            # A dataset's batch (`InputChecks`): an assertion in its pipeline.
            base.check_batch_ids(
                "edges", edges, num_nodes, "node ids",
                f"the {num_nodes} nodes of features.shape={f_shape}",
            )

    def export(self, filepath, format="tf_saved_model", verbose=None,
               input_signature=None, **kwargs):
        """Keras's `export`, with a signature of one graph of any size by
        default: `features (1, N, num_features)`, `edges (1, 2, E)` int32
        (Keras's own default opened the batch, and a served batch of two
        graphs returned the first graph's logits only)."""
        if input_signature is None:
            input_signature = [[
                keras.InputSpec(
                    shape=(1, None, self.num_features),
                    dtype=self.inputs[0].dtype, name="features",
                ),
                keras.InputSpec(shape=(1, 2, None), dtype="int32", name="edges"),
            ]]
        return super().export(
            filepath, format=format, verbose=verbose,
            input_signature=input_signature, **kwargs,
        )

    def compile_defaults(self):
        """The paper's: Adam with learning rate 0.005, the sparse categorical
        cross-entropy from logits, and the accuracy **weighted by the
        split's sample weights**: `evaluate(...,
        sample_weight=data.test_weights)` is the accuracy on the test nodes
        only, and `val_accuracy` in `fit` counts the validation nodes only.
        (Keras 3 updates `metrics=` without `sample_weight`, so an accuracy
        there would count every node of the graph.) And the split's mean
        cross-entropy, `cross_entropy`: Keras's `loss` is that mean (the
        split's weights have mean 1 over the nodes) plus the L2 penalty,
        and the paper's early stopping watches the cross-entropy alone, so
        `val_cross_entropy` is its validation loss (`GATEarlyStopping`)."""
        return {
            "optimizer": keras.optimizers.Adam(learning_rate=0.005),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "weighted_metrics": [
                keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                keras.metrics.SparseCategoricalCrossentropy(
                    from_logits=True, name="cross_entropy"
                ),
            ],
        }

    def label_ids(self, x):
        """One class id per node, `(1, N)`."""
        return (1, _graph_nodes(x)), self.num_classes, f"num_classes={self.num_classes}"

    def fit(self, x=None, y=None, *args, **kwargs):
        given = bind(keras.Model.fit, x, y, args, kwargs)
        _check_split("sample_weight", given.get("sample_weight"), _graph_nodes(x))
        _warn_without_split("fit", "trains on", x, given)
        classes = getattr(x, "num_classes", None)  # `sampled_node_dataset`'s
        if classes is not None and classes > self.num_classes:
            raise ValueError(
                "Received an invalid value for argument `x`, expected a "
                f"dataset of at most num_classes={self.num_classes} classes. "
                f"Received: a dataset of a graph of {classes} classes"
            )
        validation = given.get("validation_data")
        if isinstance(validation, (list, tuple)) and len(validation) == 3:
            _check_split(
                "validation_data[2]", validation[2], _graph_nodes(validation[0])
            )
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        given = bind(keras.Model.evaluate, x, y, args, kwargs)
        _check_split("sample_weight", given.get("sample_weight"), _graph_nodes(x))
        _warn_without_split("evaluate", "scores", x, given)
        return super().evaluate(x, y, *args, **kwargs)

    def attention_scores(self, inputs):
        """The coefficients of both layers, run eagerly.

        Args:
            inputs: `[features (1, N, F), edges (1, 2, E)]`.

        Returns:
            A list of two `(E + N, heads)` arrays (one row per edge of
            `keras_attention.layers.graph.with_self_loops(edges, N)` for
            the `"graph"` layer), in layer order.
        """
        self.check_inputs(inputs)
        features = ops.convert_to_tensor(inputs[0][0], dtype="float32")
        edges = ops.convert_to_tensor(inputs[1][0], dtype="int32")
        x, first = self.get_layer("graph_attention_1")(
            [features, edges], return_attention_scores=True
        )
        _, second = self.get_layer("graph_attention_2")(
            [x, edges], return_attention_scores=True
        )
        return [first, second]


class GATEarlyStopping(keras.callbacks.Callback):
    """Early stopping of the GAT paper, on validation loss *and* accuracy.

    Patience restarts whenever the validation accuracy reaches its best or
    the validation loss its lowest; the weights of the last epoch that
    improved both at once are restored at the end (as in the paper's code,
    which checkpoints on that condition). The loss is the paper's: the
    mean cross-entropy of the validation nodes (`val_cross_entropy`, a
    metric of `GATNodeClassifier.compile`), without the L2 penalty that
    Keras's `val_loss` adds.

    Args:
        patience: epochs without improvement before stopping (100).
        monitor_loss, monitor_accuracy: the logged names.
    """

    def __init__(
        self,
        patience=100,
        monitor_loss="val_cross_entropy",
        monitor_accuracy="val_accuracy",
    ):
        super().__init__()
        self.patience = base.check_positive_int("patience", patience)
        self.monitor_loss = monitor_loss
        self.monitor_accuracy = monitor_accuracy

    def on_train_begin(self, logs=None):
        self.best_loss = np.inf
        self.best_accuracy = -np.inf
        self.wait = 0
        self.best_weights = None
        self.best_epoch = None
        self.stopped_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        loss, accuracy = logs.get(self.monitor_loss), logs.get(self.monitor_accuracy)
        if loss is None or accuracy is None:
            raise ValueError(
                "GATEarlyStopping needs validation data and the metrics it "
                f"monitors: expected the logs {self.monitor_loss!r} and "
                f"{self.monitor_accuracy!r} (`GATNodeClassifier.compile`'s "
                "default `weighted_metrics`, or pass `monitor_loss=` / "
                f"`monitor_accuracy=`). Received: {sorted(logs)}"
            )
        if accuracy >= self.best_accuracy or loss <= self.best_loss:
            if accuracy >= self.best_accuracy and loss <= self.best_loss:
                self.best_weights = self.model.get_weights()
                self.best_epoch = epoch
            self.best_accuracy = max(accuracy, self.best_accuracy)
            self.best_loss = min(loss, self.best_loss)
            self.wait = 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = epoch
                self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.best_weights is not None:
            self.model.set_weights(self.best_weights)


for _name, _description, _overrides in (
    (
        "gat_cora",
        "GAT of the paper for Cora (1433 features, 7 classes).",
        dict(num_features=1433, num_classes=7),
    ),
    (
        "gat_citeseer",
        "GAT of the paper for CiteSeer (3703 features, 6 classes).",
        dict(num_features=3703, num_classes=6),
    ),
    (
        "gat_pubmed",
        "GAT of the paper for PubMed (500 features, 3 classes, 8 output "
        "heads, L2 1e-3).",
        dict(num_features=500, num_classes=3, output_heads=8, weight_decay=1e-3),
    ),
    (
        "gat_karate",
        "GAT for Zachary's karate club (34 one-hot features, 2 classes).",
        dict(num_features=34, num_classes=2),
    ),
):
    presets.register_preset(_name, "GATNodeClassifier", _overrides, description=_description)
