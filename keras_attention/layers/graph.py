"""GraphAttention: GAT and GATv2 on an edge list or a dense adjacency.

This file holds the layer (arguments, weights, shapes, the call's checks);
its two paths are in `_graph_paths.py` (`edge_list_path`, `adjacency_path`,
and `with_self_loops`, re-exported here) and its input checks in
`_graph_inputs.py`.

Dropout on the coefficients is the counter-based `keras_attention.ops.
hash_dropout` (`keras_attention.layers.HashDropout` for the inputs): under
TensorFlow's XLA on CPU, a GAT epoch on Cora with it takes about as long as
without dropout, and some 80 times longer with `keras.random.dropout`
(`benchmarks/bench_gat.py`).
"""

import keras
from keras import ops

from keras_attention._validation import check_bool
from keras_attention._validation import check_positive_int
from keras_attention._validation import check_rate
from keras_attention._validation import invalid
from keras_attention.layers import base
from keras_attention.layers._graph_inputs import check_graph_inputs
from keras_attention.layers._graph_inputs import shape_or_none
from keras_attention.layers._graph_inputs import split_graph_shapes
from keras_attention.layers._graph_paths import adjacency_path
from keras_attention.layers._graph_paths import edge_list_path
from keras_attention.layers._graph_paths import with_self_loops  # noqa: F401
from keras_attention.ops import hash_dropout
from keras_attention.registry import register


def _kernel_of(sublayer):
    return None if sublayer is None else sublayer.kernel


@register("graph", input_kind="graph")
class GraphAttention(base.ProjectionMixin, keras.layers.Layer):
    """Graph attention (GAT, Veličković et al., 2018; GATv2, Brody et al., 2022).

    Each node `i` attends over its neighbours `j` (the sources of its
    incoming edges `j -> i`, and itself with `add_self_loops`), with `H`
    heads of size `units`:

    - `version="v1"` (GAT): `e_ij = LeakyReLU(a_t . W h_i + a_s . W h_j)`,
      i.e. `LeakyReLU(a^T [W h_i || W h_j])`; messages `W h_j`.
    - `version="v2"` (GATv2): `e_ij = a . LeakyReLU(W_t h_i + W_s h_j)`,
      i.e. `a^T LeakyReLU(W [h_i || h_j])` with `W = [W_t | W_s]`;
      messages `W_s h_j`.

    `alpha_ij = softmax_j(e_ij)` over the neighbours of `i`, dropout on
    `alpha` (and, with `feature_dropout`, on each node's message `m_j`
    before the sum), `h'_i = sum_j alpha_ij m_j`; the heads are concatenated
    (`(N, H * units)`) or averaged (`(N, units)`), then the bias and the
    activation are applied. With edge features `f_ji` (of the edge
    `j -> i`), `W_e f_ji` is added inside the score as in PyTorch
    Geometric's `GATConv`/`GATv2Conv`: `+ a_e . W_e f_ji` inside v1's
    LeakyReLU, `+ W_e f_ji` to v2's `W_t h_i + W_s h_j`.

    **The graph** is given either as

    - an **edge list**: an integer tensor `(2, E)`, row 0 the source `j`
      and row 1 the target `i` of each edge `j -> i` (PyTorch Geometric's
      `edge_index`), for one graph with node features `(N, F)`. Messages
      flow from source to target; node `i` aggregates over its incoming
      edges. Undirected graphs list both directions. This path is sparse:
      gathers and segment sums over the edges, `O(E * H * units)` memory,
      never an `N x N` matrix. Duplicate edges count twice. Edge features
      are `(E, F_e)`.
    - a **dense adjacency**: a bool or float tensor `(N, N)` with node
      features `(N, F)`, or `(B, N, N)` / `(N, N)` with `(B, N, F)`;
      `adjacency[i, j] != 0` means the edge `j -> i` (row = target,
      column = source, as in an attention matrix), so `adjacency[i, j] = 1`
      for every edge `(j, i)` of the edge list gives the same result.
      Values only say whether an edge exists; they are not weights. Edge
      features are `(N, N, F_e)` / `(B, N, N, F_e)`, `[i, j]` for `j -> i`.

    The dtype decides: integer tensors are edge lists, bool and float
    tensors adjacencies (cast an integer adjacency to bool).

    **Self loops** (`add_self_loops=True`, as both papers): every node gets
    exactly one self loop, like PyTorch Geometric's `remove_self_loops`
    followed by `add_self_loops`, with static shapes: self loops already in
    an edge list are masked out (coefficient 0) and `N` loops `(i, i)` are
    appended after the `E` edges; in an adjacency the diagonal is set.
    A self loop's edge features are the mean of the node's incoming
    (non-loop) edge features (zeros without any), PyG's
    `fill_value="mean"`. Without self loops, a node with no incoming edge
    outputs only the bias (its activation).

    Edge indices are checked when their values are known (eager calls); in
    a traced or compiled function they cannot be, and an index outside
    `[0, N)` then raises in TensorFlow on CPU without XLA, but under XLA
    and on accelerators it is not refused: clamped or dropped, and on JAX
    a source past `N` makes its target's output NaN and a negative id
    wraps to `N - 1`. Check the ids before tracing (`fit`, `evaluate` and
    `predict` of `GATNodeClassifier` do).

    **From PyTorch Geometric**: the same scores, self loops, edge features
    and direction as `GATConv`/`GATv2Conv` (tested against them, values and
    gradients); GATv2's projections `W_s`, `W_t` have no bias (PyG's
    `lin_l`/`lin_r` have one by default, inside the LeakyReLU: a trained
    `GATv2Conv` with them has no exact counterpart here) and are never
    shared (`share_weights=False`); the coefficients returned are those
    before dropout (PyG's after), with a 0 row for each self loop already
    in the edges (PyG drops those edges).

    **Export** (`model.export`): keras gives every input of the signature
    an unknown first dimension, which an edge list `(2, E)` cannot have:
    pass `input_signature` with `keras.InputSpec(shape=(2, None),
    dtype="int32")` for the edges (and `(None, F_e)` for edge features).
    On JAX (`format="tf_saved_model"`) each unknown dimension is its own
    symbol: say which are the same with `jax2tf_kwargs={"polymorphic_shapes":
    [["(n, F)", "(2, e)", "(e, F_e)"]]}` with edge features, or
    `[["(b, n, F)", "(b, n, n)"]]` for an adjacency with unknown N. On
    torch (`format="onnx"`) leave the node count unknown: keras traces the
    export with inputs of ones, and edges are clamped into `[0, N)` in the
    exported graph, as under XLA.

    Dropout on the coefficients uses `hash_dropout` (a counter-based mask),
    which is fast under XLA, where `keras.random.dropout` is slow on CPU.

    The node (and edge) projections are keras `Dense` sublayers
    (`projection`, or `source` and `target`; `edge_projection`):
    `enable_lora(rank)` and `model.quantize("int8")` work on them; the
    attention vectors stay plain weights.

    Args:
        units: size of each head's output.
        num_heads: number of attention heads `H`.
        concat_heads: concatenate the heads (`H * units` features) if
            `True`, average them (`units` features) if `False` (the GAT
            paper's output layer).
        negative_slope: slope of the LeakyReLU for negative inputs.
        dropout: dropout rate on the attention coefficients.
        add_self_loops: give every node exactly one self loop.
        version: `"v1"` (GAT) or `"v2"` (GATv2).
        use_bias: add a bias to the output.
        activation: activation of the output (e.g. `"elu"`), applied after
            the heads are combined.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, kernel_constraint, bias_constraint: as for
            `keras.layers.Dense`; the kernel ones apply to every projection
            and attention vector.
        seed: seed of the dropout.
        feature_dropout: dropout rate on the messages `m_j` (one mask per
            node, shared by its outgoing edges), after the scores are
            computed. The GAT paper's reference code drops them with the
            input rate (`seq_fts`), which `GATNodeClassifier` follows;
            PyTorch Geometric's `GATConv` does not (0, the default).

    Call arguments:
        inputs: a list `[node_features, edges]` or
            `[node_features, edges, edge_features]` (see above).
        return_attention_scores: also return the coefficients.
        training: whether dropout is active.

    Returns:
        The node features `(N, H * units)` (or `(N, units)` when the heads
        are averaged), `(B, N, ...)` for batched dense inputs. With
        `return_attention_scores=True`, also the coefficients before
        dropout: `(E', H)` for an edge list, one row per edge of
        `with_self_loops(edges, N)` (`E' = E + N`) or of `edges`
        (`E' = E`) without self loops; `(B, H, N, N)` (`(H, N, N)`
        unbatched) for an adjacency, `[..., i, j]` for `j -> i`. Each
        node's incoming coefficients sum to 1 (to 0 for a node without
        any incoming edge, without self loops).

    Raises:
        ValueError: naming the argument: `units` or `num_heads` not
            positive integers; `negative_slope` negative; a dropout rate
            outside `[0, 1)`; `concat_heads` or `add_self_loops` not a
            boolean; `version` not `"v1"` or `"v2"`; inputs that are not
            `[node_features, edges(, edge_features)]`, edges neither an
            integer edge list `(2, E)` nor a dense adjacency `(N, N)`,
            edge features not one row per edge, or edge features given
            to a layer built without them (or the reverse).

    Example:

    ```python
    features = keras.Input(shape=(1433,), batch_size=2708)
    edges = keras.Input(shape=(10556,), batch_size=2, dtype="int32")
    x = GraphAttention(8, num_heads=8, activation="elu")([features, edges])
    logits = GraphAttention(7, concat_heads=False)([x, edges])
    model = keras.Model([features, edges], logits)
    ```

    References:
        - Veličković et al., Graph Attention Networks, ICLR 2018.
          https://arxiv.org/abs/1710.10903
        - Brody et al., How Attentive are Graph Attention Networks?,
          ICLR 2022. https://arxiv.org/abs/2105.14491
    """

    # The node projections: GAT's `W`, GATv2's `W_s` and `W_t`.
    lora_targets = ("projection", "source", "target")

    def __init__(
        self,
        units,
        num_heads=1,
        concat_heads=True,
        negative_slope=0.2,
        dropout=0.0,
        add_self_loops=True,
        version="v1",
        use_bias=True,
        activation=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        feature_dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.concat_heads = check_bool("concat_heads", concat_heads)
        if (
            isinstance(negative_slope, bool)
            or not isinstance(negative_slope, (int, float))
            or not negative_slope >= 0
        ):
            raise invalid(
                "negative_slope", "a non-negative float", negative_slope
            )
        self.negative_slope = float(negative_slope)
        self.dropout = check_rate("dropout", dropout)
        self.feature_dropout = check_rate("feature_dropout", feature_dropout)
        self.add_self_loops = check_bool("add_self_loops", add_self_loops)
        if version not in ("v1", "v2"):
            raise invalid("version", "one of 'v1', 'v2'", version)
        self.version = version
        base.keep_weight_arguments(self, locals())
        if self.seed_generator is None and self.feature_dropout > 0:
            self.seed_generator = keras.random.SeedGenerator(seed)

    @property
    def output_dim(self):
        return self.units * self.num_heads if self.concat_heads else self.units

    # -------------------------------------------------------------- shapes

    def compute_output_shape(self, input_shape):
        features, _, _ = split_graph_shapes(input_shape)
        return tuple(features[:-1]) + (self.output_dim,)

    def compute_output_spec(
        self, inputs, return_attention_scores=False, training=None
    ):
        shapes = [tuple(x.shape) for x in inputs] if isinstance(
            inputs, (list, tuple)
        ) else inputs
        features, edges, _ = split_graph_shapes(shapes)
        if keras.backend.backend() != "tensorflow" and None in features[:-1]:
            # JAX and torch cannot trace a segment sum over an unknown
            # number of nodes (a functional model over graphs of any size):
            # the specs come from the shapes instead.
            out = keras.KerasTensor(
                self.compute_output_shape(shapes), dtype=self.compute_dtype
            )
            if not return_attention_scores:
                return out
            if len(edges) == 2 and edges[0] == 2 and len(features) == 2:
                scores = (None, self.num_heads)  # (E + N, H)
            else:
                n = features[-2]
                scores = tuple(features[:-2]) + (self.num_heads, n, n)
            return out, keras.KerasTensor(scores, dtype=self.compute_dtype)
        # Trace `call` symbolically: the same checks and the same output
        # structure (with or without scores) as an eager call.
        return base.traced_output_spec(
            self,
            inputs,
            return_attention_scores=return_attention_scores,
            training=training,
        )

    # -------------------------------------------------------------- weights

    def _initializer(self):
        config = self.kernel_initializer.get_config()
        if isinstance(config.get("seed"), int):
            # A seeded initializer draws the same values for every weight of
            # one shape (the two attention vectors): offset the seed.
            config["seed"] += self._initializers_made
        self._initializers_made += 1
        return self.kernel_initializer.__class__.from_config(config)

    def _add_kernel(self, name, shape):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=self._initializer(),
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )

    def _projection(self, name, width, input_dim):
        """A built `keras.layers.Dense` without bias: `(..., F) -> (..., H C)`,
        with LoRA, quantization and keras weight files."""
        dense = keras.layers.Dense(
            width,
            use_bias=False,
            kernel_initializer=self._initializer(),
            kernel_regularizer=self.kernel_regularizer,
            kernel_constraint=self.kernel_constraint,
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build((None, input_dim))
        return dense

    def build(self, input_shape):
        features, _, edge_features = split_graph_shapes(input_shape)
        heads, units = self.num_heads, self.units
        width = heads * units
        self._initializers_made = 0
        self.projection = self.source = self.target = None
        if self.version == "v1":
            self.projection = self._projection("projection", width, features[-1])
            self.attention_source = self._add_kernel(
                "attention_source", (heads, units)
            )
            self.attention_target = self._add_kernel(
                "attention_target", (heads, units)
            )
        else:
            self.source = self._projection("source", width, features[-1])
            self.target = self._projection("target", width, features[-1])
            self.attention_kernel = self._add_kernel(
                "attention_kernel", (heads, units)
            )
        self.edge_projection = None
        self.attention_edge = None
        if edge_features is not None:
            self.edge_projection = self._projection(
                "edge_projection", width, edge_features[-1]
            )
            if self.version == "v1":
                self.attention_edge = self._add_kernel(
                    "attention_edge", (heads, units)
                )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(self.output_dim,),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )
        self.built = True

    # The projection kernels under their former names (NumPy references).
    kernel = property(lambda self: _kernel_of(self.projection))
    source_kernel = property(lambda self: _kernel_of(self.source))
    target_kernel = property(lambda self: _kernel_of(self.target))
    edge_kernel = property(lambda self: _kernel_of(self.edge_projection))

    # -------------------------------------------------------------- math

    def _heads(self, x, projection):
        """`(..., F) -> (..., H, units)`."""
        y = projection(x)
        return ops.reshape(
            y, tuple(ops.shape(y)[:-1]) + (self.num_heads, self.units)
        )

    def _coefficient_dropout(self, alpha, training):
        if training and self.dropout > 0.0:
            return hash_dropout(alpha, self.dropout, self.seed_generator)
        return alpha

    def _message_dropout(self, messages, training):
        if training and self.feature_dropout > 0.0:
            return hash_dropout(messages, self.feature_dropout, self.seed_generator)
        return messages

    def _finish(self, heads):
        """`(..., H, units)` -> the output features, bias and activation."""
        if self.concat_heads:
            out = ops.reshape(
                heads, tuple(ops.shape(heads)[:-2]) + (self.output_dim,)
            )
        else:
            out = ops.mean(heads, axis=-2)
        if self.bias is not None:
            out = out + self.bias
        return self.activation(out)

    def call(self, inputs, return_attention_scores=False, training=None):
        if not isinstance(inputs, (list, tuple)) or not 2 <= len(inputs) <= 3:
            raise ValueError(
                "Expected the inputs to be a list [node_features, edges] or "
                "[node_features, edges, edge_features]. Received: "
                f"inputs={inputs!r}"
            )
        features, edges = inputs[0], inputs[1]
        edge_features = inputs[2] if len(inputs) == 3 else None
        mode = check_graph_inputs(features, edges, edge_features)
        if edge_features is not None:
            # Integer counts or categories: their self loops' mean (and the
            # projection) in the compute dtype (TensorFlow refused the mean).
            edge_features = base.float_inputs(self, edge_features)
        if (edge_features is None) != (self.edge_projection is None):
            raise ValueError(
                "The layer was built "
                + ("with" if self.edge_projection is not None else "without")
                + " edge features and must be called the same way. Received: "
                f"edge_features.shape={shape_or_none(edge_features)}"
            )
        if mode == "edge_list":
            out, alpha = edge_list_path(self, features, edges, edge_features, training)
        else:
            out, alpha = adjacency_path(self, features, edges, edge_features, training)
        if return_attention_scores:
            return out, alpha
        return out

    def legacy_variables(self):
        if self.version == "v1":
            variables = self.projection.weights + [
                self.attention_source,
                self.attention_target,
            ]
        else:
            variables = (
                self.source.weights + self.target.weights + [self.attention_kernel]
            )
        if self.edge_projection is not None:
            variables += self.edge_projection.weights
            if self.attention_edge is not None:
                variables.append(self.attention_edge)
        if self.bias is not None:
            variables.append(self.bias)
        return variables
