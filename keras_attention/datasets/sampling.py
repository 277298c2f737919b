"""Neighbour sampling for mini-batch training on graphs that do not fit a batch.

GraphSAGE's sampler (Hamilton et al., 2017), with PyTorch Geometric's
`NeighborLoader` semantics: for a batch of seed nodes, layer `l` samples
for every node added by layer `l - 1` (the seeds for `l = 0`) at most
`fanouts[l]` of its incoming neighbours, **without replacement** (all of
them when it has fewer); the sampled nodes are numbered seeds first, then
the nodes each layer adds in order of first appearance, and the sampled
edges `(2, E_b)` (row 0 source, row 1 target, as everywhere in this
package) are renumbered likewise. A model of `len(fanouts)` message-passing
layers run on the sub-graph computes the seeds' outputs from the sampled
neighbourhood.

The adjacency is held once, as CSR over targets (`indptr`, `indices`: the
sources of the incoming edges of node `i` are
`indices[indptr[i]:indptr[i + 1]]`). Sampling is vectorised over the nodes
of a layer: nodes with at most `fanout` neighbours take all of them, the
others draw `fanout` distinct positions with Floyd's algorithm, one NumPy
step per drawn position (`fanout` steps, not one per node), in
`O(nodes * fanout^2)` whatever the degrees.

Everything here is NumPy; `keras_attention.applications.node_sampling`
turns it into a `tf.data.Dataset` for `fit`.
"""

import collections

import numpy as np

from keras_attention._validation import check_dtype
from keras_attention._validation import check_ids_in_range
from keras_attention._validation import invalid

SampledGraph = collections.namedtuple(
    "SampledGraph", ["nodes", "edges", "num_seeds", "edges_per_layer"]
)
SampledGraph.__doc__ = """A sampled sub-graph.

Fields:
    nodes: int64 `(n,)`: the graph's ids of the sub-graph's nodes, the
        seeds first (in the order given), then the nodes each layer added.
    edges: int64 `(2, E_b)`: sampled edges in the sub-graph's numbering,
        row 0 source, row 1 target, layer by layer.
    num_seeds: number of seeds (the first `num_seeds` nodes).
    edges_per_layer: number of edges each layer sampled.
"""


def class_ids_with_none(labels):
    """`(labels, not_whole)`: float labels with NaN read as -1 (no label,
    as OGB writes it), and the indices of the values that are not whole
    class ids (empty for integer labels)."""
    labels = np.asarray(labels)
    if labels.dtype.kind != "f":
        return labels, np.zeros(0, "int64")
    labels = np.where(np.isnan(labels), -1, labels)
    return labels, np.flatnonzero(labels != np.round(labels))


def check_fanouts(fanouts):
    """`fanouts` as a tuple of positive ints, or a ValueError naming it."""
    if isinstance(fanouts, (int, np.integer)) and not isinstance(fanouts, bool):
        fanouts = [fanouts]
    if not isinstance(fanouts, (list, tuple)) or not fanouts or any(
        isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f <= 0
        for f in fanouts
    ):
        raise invalid(
            "fanouts", "a non-empty list of positive integers (one per layer)", fanouts
        )
    return tuple(int(f) for f in fanouts)


def check_edges(edges, num_nodes, argument="edges"):
    """`edges` as an int64 `(2, E)` array with ids in `[0, num_nodes)`."""
    array = np.asarray(edges)
    if array.ndim != 2 or array.shape[0] != 2:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected an "
            f"edge list of shape (2, E). Received: {argument}.shape={array.shape}"
        )
    if array.size:
        check_dtype(argument, array, "int", "integer node ids")
    array = array.astype(np.int64, copy=False)
    check_ids_in_range(
        argument, array, num_nodes, "node ids", f"num_nodes={num_nodes}"
    )
    return array


def sorted_unique(keys):
    """`np.unique(keys)` of a 1-D integer array, by a sort and a mask:
    NumPy 2.4's `np.unique` was most of `make_graph`'s time at a million
    nodes (BENCHMARKS.md, "Sampled epochs on generated graphs")."""
    keys = np.sort(keys)
    if len(keys) < 2:
        return keys
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])]


def check_seeds(seeds, num_nodes):
    """`seeds` as distinct int64 node ids in `[0, num_nodes)`."""
    array = np.asarray(seeds)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            "Received an invalid value for argument `seeds`, expected a 1-D "
            f"array of integer node ids. Received: seeds.shape={array.shape}, "
            f"seeds.dtype={array.dtype}"
        )
    array = array.astype(np.int64, copy=False)
    check_ids_in_range(
        "seeds", array, num_nodes, "node ids", f"num_nodes={num_nodes}"
    )
    distinct = len(sorted_unique(array))
    if distinct != len(array):
        raise ValueError(
            "Received an invalid value for argument `seeds`, expected "
            f"distinct node ids. Received: {len(array)} seeds of which "
            f"{len(array) - distinct} repeat an earlier one"
        )
    return array


def csr_by_target(edges, num_nodes):
    """`(indptr, indices)`: the sources of each node's incoming edges."""
    source, target = edges
    order = np.argsort(target, kind="stable")
    counts = np.bincount(target, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    index_dtype = np.int32 if num_nodes < 2**31 else np.int64
    return indptr, source[order].astype(index_dtype)


def _segment_arange(counts):
    """`concatenate([arange(c) for c in counts])`, without the loop."""
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def _floyd_positions(degrees, k, rng):
    """`(m, k)` distinct positions in `[0, degree)` per row (degree >= k).

    Floyd's algorithm: for `j = d - k, ..., d - 1` draw `t` in `[0, j]` and
    keep `t`, or `j` if `t` was kept already. Every `k`-subset is equally
    likely.
    """
    m = len(degrees)
    chosen = np.empty((m, k), np.int64)
    for column in range(k):
        j = degrees - k + column
        t = rng.integers(0, j + 1)
        taken = (chosen[:, :column] == t[:, None]).any(axis=1)
        chosen[:, column] = np.where(taken, j, t)
    return chosen


class NeighborSampler:
    """Samples sub-graphs around seed nodes with per-layer fan-outs.

    PyTorch Geometric's `NeighborLoader` semantics (see the module
    docstring): layer `l` samples, without replacement, at most
    `fanouts[l]` incoming neighbours of every node the previous layer added.

    Args:
        edges: int `(2, E)` edge list, row 0 source, row 1 target; an
            undirected graph lists both directions.
        num_nodes: number of nodes `N`.
        fanouts: neighbours per node for each layer, e.g. `[10, 10]`
            (first entry: the seeds' neighbours).

    Example:

    >>> from keras_attention.datasets import load_karate_club
    >>> graph = load_karate_club()
    >>> sampler = NeighborSampler(graph.edges, 34, fanouts=[3, 2])
    >>> sub = sampler.sample([0, 5], seed=0)
    >>> sub.nodes[:2].tolist(), sub.num_seeds
    ([0, 5], 2)
    """

    def __init__(self, edges, num_nodes, fanouts):
        if isinstance(num_nodes, bool) or not isinstance(
            num_nodes, (int, np.integer)
        ) or num_nodes <= 0:
            raise invalid("num_nodes", "a positive integer", num_nodes)
        self.num_nodes = int(num_nodes)
        self.fanouts = check_fanouts(fanouts)
        edges = check_edges(edges, self.num_nodes)
        self.num_edges = edges.shape[1]
        self.indptr, self.indices = csr_by_target(edges, self.num_nodes)

    def degrees(self, nodes=None):
        """In-degrees of `nodes` (all nodes by default)."""
        degrees = np.diff(self.indptr)
        return degrees if nodes is None else degrees[nodes]

    def sample_neighbours(self, targets, fanout, rng):
        """`(sources, targets)` of at most `fanout` sampled edges per target."""
        targets = np.asarray(targets, np.int64)
        start = self.indptr[targets]
        degree = self.indptr[targets + 1] - start
        take = np.minimum(degree, fanout)
        offsets = np.cumsum(take) - take
        positions = _segment_arange(take)  # every neighbour, for small degrees
        large = np.flatnonzero(degree > fanout)
        if len(large):
            chosen = _floyd_positions(degree[large], fanout, rng)
            slots = offsets[large][:, None] + np.arange(fanout)
            positions[slots.ravel()] = chosen.ravel()
        sources = self.indices[np.repeat(start, take) + positions].astype(np.int64)
        return sources, np.repeat(targets, take)

    def sample(self, seeds, seed=None):
        """A `SampledGraph` around `seeds` (distinct node ids).

        Args:
            seeds: int `(S,)` distinct node ids.
            seed: an int, a sequence of ints, or a `numpy.random.Generator`;
                the same seed gives the same sub-graph.
        """
        seeds = check_seeds(seeds, self.num_nodes)
        rng = seed if isinstance(seed, np.random.Generator) else (
            np.random.default_rng(seed)
        )
        nodes, frontier = seeds, seeds
        sources, targets, counts = [], [], []
        for fanout in self.fanouts:
            source, target = self.sample_neighbours(frontier, fanout, rng)
            sources.append(source)
            targets.append(target)
            counts.append(len(source))
            unique, first = np.unique(source, return_index=True)
            unique = unique[np.argsort(first, kind="stable")]  # first appearance
            frontier = unique[~np.isin(unique, nodes)]
            nodes = np.concatenate([nodes, frontier])
        order = np.argsort(nodes, kind="stable")
        ordered = nodes[order]

        def local(ids):
            return order[np.searchsorted(ordered, ids)]

        edges = np.stack(
            [local(np.concatenate(sources)), local(np.concatenate(targets))]
        )
        return SampledGraph(nodes, edges, len(seeds), tuple(counts))

    def max_sizes(self, batch_size):
        """`(max_nodes, max_edges)` of a sub-graph of `batch_size` seeds."""
        nodes, edges, layer = batch_size, 0, batch_size
        for fanout in self.fanouts:
            layer *= fanout
            nodes += layer
            edges += layer
        return min(nodes, self.num_nodes), min(edges, self.num_edges)

    def batch_arrays(
        self, seeds, features, labels, batch_size, seed=None, pad=True
    ):
        """The padded arrays of one batch for `GATNodeClassifier`.

        Returns `(features (1, n, F), edges (1, 2, e), labels (1, n),
        weights (1, n))`. With `pad=True`, `n = max_nodes + 1` and
        `e = max_edges` for every batch (one compiled step for all):
        padding nodes have zero features, padding edges are self loops of
        the last (padding) node. Seeds are the first nodes and the only
        ones with a weight: `n / batch_size` each, so that Keras's mean
        loss over the `n` nodes is the sum of the seeds' losses over
        `batch_size` (the convention of `tf.nn.compute_average_loss`: a
        short last batch is not scaled up) and a weighted accuracy counts
        seeds only, exactly as a hand count over the epoch.
        """
        if len(seeds) > batch_size:
            raise ValueError(
                "Received an invalid value for argument `seeds`, expected at "
                f"most batch_size={batch_size} seeds. Received: {len(seeds)} seeds"
            )
        sub = self.sample(seeds, seed)
        n, e = len(sub.nodes), sub.edges.shape[1]
        if pad:
            max_nodes, max_edges = self.max_sizes(batch_size)
            size, num_edges = max_nodes + 1, max_edges
        else:
            size, num_edges = n, e
        x = np.zeros((size, features.shape[1]), np.float32)
        x[:n] = features[sub.nodes]
        edge_array = np.full((2, num_edges), size - 1, np.int32)
        edge_array[:, :e] = sub.edges
        y = np.zeros(size, np.int32)
        y[: sub.num_seeds] = labels[sub.nodes[: sub.num_seeds]]
        w = np.zeros(size, np.float32)
        w[: sub.num_seeds] = size / batch_size
        return x[None], edge_array[None], y[None], w[None]
