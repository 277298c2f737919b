"""Node-classification graphs: Zachary's karate club and Planetoid files.

`load_karate_club` is the embedded default (networkx ships the graph, no
download). `load_planetoid` reads the Planetoid citation graphs (Cora,
CiteSeer, PubMed) from the `ind.<name>.*` files of Yang et al. (2016), as
GCN and GAT use them, from a path given by the user.

Both return a `GraphData` whose `edges` is an int32 array `(2, E)` of
directed edges, row 0 the source node and row 1 the target node, with both
directions of every undirected edge, no duplicates and no self loops, sorted
by target then source (so edges into one node are contiguous).
"""

import collections
import io
import numbers
import os
import pickle

import numpy as np

from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention.datasets._files import missing_file_error
from keras_attention.datasets.sampling import sorted_unique

GraphData = collections.namedtuple(
    "GraphData",
    [
        "features",
        "edges",
        "labels",
        "train_mask",
        "val_mask",
        "test_mask",
        "num_classes",
    ],
)
GraphData.__doc__ = """A node-classification graph.

Fields:
    features: float32 `(N, F)`.
    edges: int32 `(2, E)`; row 0 source, row 1 target, both directions,
        no duplicates, no self loops, sorted by target then source (as
        the loaders give them; `load_graph_files(undirected=False)` keeps
        a file's edges as they are).
    labels: int32 `(N,)`; -1 for nodes without a label.
    train_mask, val_mask, test_mask: bool `(N,)`, disjoint.
    num_classes: int.
"""


def _edges_from_pairs(pairs, num_nodes):
    """Symmetric, deduplicated, loop-free edge array `(2, E)`, sorted."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    both = np.concatenate([pairs, pairs[:, ::-1]], axis=0)
    both = both[both[:, 0] != both[:, 1]]
    # One int64 key per pair, target-major, to dedupe and sort at once.
    keys = sorted_unique(both[:, 1] * num_nodes + both[:, 0])
    return np.stack([keys % num_nodes, keys // num_nodes]).astype("int32")


def load_karate_club(seed=0, num_train_per_class=2, val_fraction=0.5):
    """Loads Zachary's karate club from networkx for node classification.

    The 34 members are labelled by the club they joined after the split
    (0: Mr. Hi, 1: Officer). Features are the identity (one-hot node ids),
    as in the GCN paper's karate example. `num_train_per_class` members of
    each club, drawn from `seed`, form the training set; the others are
    split into validation (`val_fraction` of them) and test.

    Args:
        seed: seed of the split.
        num_train_per_class: labelled training nodes per class.
        val_fraction: share of the non-training nodes used for validation.

    Returns:
        A `GraphData` with 34 nodes, 156 directed edges (78 undirected) and
        2 classes.

    Example:

    >>> graph = load_karate_club()
    >>> graph.features.shape, graph.edges.shape, int(graph.train_mask.sum())
    ((34, 34), (2, 156), 4)
    """
    import networkx

    num_train_per_class = check_positive_int(
        "num_train_per_class", num_train_per_class
    )
    if isinstance(val_fraction, (bool, np.bool_)) or not isinstance(
        val_fraction, numbers.Real
    ) or not 0.0 <= val_fraction <= 1.0:
        raise ValueError(
            "Received an invalid value for argument `val_fraction`, expected "
            f"a float in [0, 1]. Received: val_fraction={val_fraction!r}"
        )
    graph = networkx.karate_club_graph()
    nodes = sorted(graph.nodes())
    num_nodes = len(nodes)
    labels = np.array(
        [0 if graph.nodes[n]["club"] == "Mr. Hi" else 1 for n in nodes],
        dtype="int32",
    )
    edges = _edges_from_pairs(list(graph.edges()), num_nodes)

    rng = np.random.default_rng(seed)
    train_mask = np.zeros(num_nodes, bool)
    for label in (0, 1):
        members = np.flatnonzero(labels == label)
        if num_train_per_class >= len(members):
            raise ValueError(
                "Received an invalid value for argument `num_train_per_class`"
                f", expected fewer than the {len(members)} members of class "
                f"{label}. Received: num_train_per_class={num_train_per_class}"
            )
        chosen = rng.choice(members, num_train_per_class, replace=False)
        train_mask[chosen] = True
    rest = rng.permutation(np.flatnonzero(~train_mask))
    num_val = int(round(val_fraction * len(rest)))
    val_mask = np.zeros(num_nodes, bool)
    val_mask[rest[:num_val]] = True
    test_mask = ~(train_mask | val_mask)
    return GraphData(
        features=np.eye(num_nodes, dtype="float32"),
        edges=edges,
        labels=labels,
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=2,
    )


# (module, name) the Planetoid pickles may reference -> how to resolve it.
# The files are Python-2 pickles from 2016 naming `numpy.core.multiarray`,
# `scipy.sparse.csr` and `__builtin__`; the modern spellings are accepted
# too, and `_codecs.encode` because Python 3 writes bytes with it under
# protocol 2.
def _allowed_globals():
    import codecs

    import scipy.sparse

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    allowed = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = _reconstruct
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    for module in ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse"):
        allowed[(module, "csr_matrix")] = scipy.sparse.csr_matrix
    allowed[("collections", "defaultdict")] = collections.defaultdict
    for module in ("__builtin__", "builtins"):
        allowed[(module, "list")] = list
    allowed[("_codecs", "encode")] = codecs.encode
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals the Planetoid files need.

    Unpickling can call any importable function a file names (for example
    `os.system`); this one refuses every global outside a short list
    (NumPy arrays and dtypes, SciPy CSR matrices, `collections.defaultdict`,
    `list`) with a `pickle.UnpicklingError`.
    """

    def __init__(self, file, **kwargs):
        super().__init__(file, **kwargs)
        self._allowed = _allowed_globals()

    def find_class(self, module, name):
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"Refusing to load the global {module}.{name}: only "
                f"{sorted('.'.join(k) for k in self._allowed)} are allowed."
            ) from None


def restricted_load(path):
    """Loads a pickle file with `RestrictedUnpickler` (Python-2 safe).

    Raises:
        FileNotFoundError (also a ValueError): the file is missing.
        ValueError: the file names a forbidden global or is not a pickle;
            the message names the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise missing_file_error(path, "Planetoid file")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, TypeError, AttributeError) as e:
        raise ValueError(f"Cannot load the pickle file {path}: {e}") from e


def _dense(matrix, path):
    """The 2-D float32 array of a Planetoid part, checked: unpickling skips
    scipy's checks of a sparse matrix (an index past its columns crashed
    the interpreter in `toarray`), and a NaN would spread through a row."""
    if hasattr(matrix, "toarray"):
        try:
            if hasattr(matrix, "check_format"):
                matrix.check_format(full_check=True)
            array = np.asarray(matrix.toarray(), dtype="float32")
        except (ValueError, TypeError, IndexError, MemoryError) as error:
            raise ValueError(
                f"The file {path} holds a malformed sparse matrix: {error}"
            ) from None
    else:
        array = np.asarray(matrix)
        if array.ndim != 2 or array.dtype == object:
            raise ValueError(
                f"The file {path} should hold a 2-D matrix. Received: "
                f"type={type(matrix).__name__}, shape={array.shape}"
            )
        array = array.astype("float32")
    if array.ndim != 2:
        raise ValueError(f"The file {path} should hold a 2-D matrix. Received: shape={array.shape}")
    if not np.all(np.isfinite(array)):
        row = int(np.argmax(~np.all(np.isfinite(array), axis=1)))
        raise ValueError(f"The file {path} holds a non-finite value in row {row}.")
    return array


def _check_one_hot(array, path):
    """Raise unless every row of a label matrix is one-hot (or all zero)."""
    bad = ~np.all((array == 0) | (array == 1), axis=1) | (array.sum(axis=1) > 1)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"The file {path} should hold one-hot label rows; row {row} is "
            f"{array[row].tolist()[:12]}"
        )


def normalize_rows(features):
    """Divides each row by its sum (rows summing to 0 stay 0), like GAT."""
    features = np.asarray(features, dtype="float32")
    sums = features.sum(axis=1, keepdims=True)
    return np.divide(
        features, sums, out=np.zeros_like(features), where=sums != 0
    )


def _read_test_index(index_file):
    """The node ids of a Planetoid `ind.<name>.test.index` file."""
    with open(index_file, "rb") as f:
        data = f.read()
    test_ids = []
    for line_number, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            try:
                test_ids.append(int(line.decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                raise ValueError(
                    f"Line {line_number} of {index_file} is not a node "
                    f"id: {line.strip()[:40]!r}"
                ) from None
    test_ids = np.asarray(test_ids, dtype=np.int64)
    unique, counts = np.unique(test_ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(
            f"{index_file} lists the test id {int(unique[counts > 1][0])} "
            "more than once."
        )
    return test_ids


def _check_parts(allx, ally, tx, ty, test_ids, name, folder, file):
    """Raise a ValueError naming the files if the Planetoid parts disagree."""
    index_file = file("test.index")
    for first, second, kind in (
        (allx, ally, "allx/ally"),
        (tx, ty, "tx/ty"),
    ):
        if len(first) != len(second):
            raise ValueError(
                f"{kind} of {name} in {folder} have different row counts: "
                f"{len(first)} and {len(second)}."
            )
    if len(tx) != len(test_ids):
        raise ValueError(
            f"{file('tx')} has {len(tx)} rows but {index_file} lists "
            f"{len(test_ids)} test ids."
        )
    if len(test_ids) and test_ids.min() < len(allx):
        raise ValueError(
            f"{index_file} lists test id {test_ids.min()}, which is a row of "
            f"{file('allx')} ({len(allx)} rows); test ids must follow them."
        )
    # The test ids fill the slots after allx's rows; a span of far more
    # slots than ids (a mistyped id) would make thousands of empty nodes.
    # (CiteSeer: 1,000 ids over 1,015 slots.)
    if len(test_ids) and test_ids.max() - test_ids.min() + 1 > 2 * len(test_ids):
        raise ValueError(
            f"{index_file} lists test ids from {test_ids.min()} to "
            f"{test_ids.max()}: {test_ids.max() - test_ids.min() + 1} node "
            f"slots for {len(test_ids)} test rows (a mistyped id?)."
        )
    if allx.shape[1] != tx.shape[1] or ally.shape[1] != ty.shape[1]:
        raise ValueError(
            f"The feature or label widths of {name} in {folder} disagree: "
            f"allx {allx.shape}, tx {tx.shape}, ally {ally.shape}, "
            f"ty {ty.shape}."
        )


def _check_graph_ids(graph, num_nodes, path):
    """Raise unless the adjacency lists name only the `num_nodes` nodes
    (allx's rows, then the test ids): an id past them made thousands of
    empty nodes, or a bare MemoryError."""
    try:
        graph_ids = [int(k) for k in graph] + [
            int(v) for neighbours in graph.values() for v in neighbours
        ]
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The file {path} should map node ids to lists of node ids: {error}"
        ) from None
    outside = [i for i in graph_ids if not 0 <= i < num_nodes]
    if outside:
        raise ValueError(
            f"The file {path} names node {outside[0]}, but the graph has "
            f"{num_nodes} nodes (the rows of allx, then the test ids)."
        )


def load_planetoid(path, name, normalize_features=False, num_val=500):
    """Loads a Planetoid citation graph with the standard split.

    Assembly as in GCN and GAT: features are `allx` followed by the test
    block, and the i-th row of `tx`/`ty` goes to node `test.index[i]`. When
    the test ids are not contiguous (CiteSeer: 1,000 ids over 1,015 slots,
    15 isolated nodes), the missing nodes get zero features and label -1.
    Train nodes are `0 .. len(y) - 1`, validation the next `num_val` nodes,
    test the ids in `test.index`. Labels are the argmax of the one-hot rows,
    -1 for all-zero rows.

    Args:
        path: folder holding
            `ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}`.
        name: dataset name, e.g. `"cora"`, `"citeseer"`, `"pubmed"`.
        normalize_features: divide each feature row by its sum, as GAT
            does.
        num_val: number of validation nodes (500 in the standard split).

    Returns:
        A `GraphData`; edges are symmetric, deduplicated, without self loops.

    Raises:
        FileNotFoundError (also a ValueError): a file is missing; the
            message names it.
        ValueError: a file is malformed or names a forbidden global.

    Example:

    >>> graph = load_planetoid("shared/data/planetoid", "cora")  # doctest: +SKIP
    >>> graph.features.shape, graph.edges.shape  # doctest: +SKIP
    ((2708, 1433), (2, 10556))
    """
    if isinstance(num_val, bool) or not isinstance(
        num_val, (int, np.integer)
    ) or num_val < 0:
        raise invalid("num_val", "a non-negative integer", num_val)
    folder = os.fspath(path)

    def file(suffix):
        return os.path.join(folder, f"ind.{name}.{suffix}")

    suffixes = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
    # Report a missing file before spending time on the others.
    for suffix in suffixes:
        if not os.path.isfile(file(suffix)):
            raise missing_file_error(file(suffix), "Planetoid file")
    parts = {suffix: restricted_load(file(suffix)) for suffix in suffixes[:-1]}
    index_file = file("test.index")
    test_ids = _read_test_index(index_file)

    allx = _dense(parts["allx"], file("allx"))
    tx = _dense(parts["tx"], file("tx"))
    ally = _dense(parts["ally"], file("ally"))
    ty = _dense(parts["ty"], file("ty"))
    num_train = len(parts["y"])
    graph = parts["graph"]
    if not isinstance(graph, dict):
        raise ValueError(
            f"The file {file('graph')} should hold a dict of adjacency "
            f"lists. Received: type={type(graph).__name__}"
        )
    _check_parts(allx, ally, tx, ty, test_ids, name, folder, file)
    _check_one_hot(ally, file("ally"))
    _check_one_hot(ty, file("ty"))
    num_nodes = max(
        len(allx) + len(tx),
        int(test_ids.max()) + 1 if len(test_ids) else 0,
    )
    _check_graph_ids(graph, num_nodes, file("graph"))
    features = np.zeros((num_nodes, allx.shape[1]), "float32")
    features[: len(allx)] = allx
    features[test_ids] = tx
    one_hot = np.zeros((num_nodes, ally.shape[1]), "float32")
    one_hot[: len(ally)] = ally
    one_hot[test_ids] = ty
    labels = np.where(one_hot.any(axis=1), one_hot.argmax(axis=1), -1)
    if normalize_features:
        features = normalize_rows(features)

    pairs = [
        (int(source), int(target))
        for source, neighbours in graph.items()
        for target in neighbours
    ]
    edges = _edges_from_pairs(pairs, num_nodes)

    train_mask = np.zeros(num_nodes, bool)
    train_mask[:num_train] = True
    val_mask = np.zeros(num_nodes, bool)
    val_mask[num_train : num_train + num_val] = True
    test_mask = np.zeros(num_nodes, bool)
    test_mask[test_ids] = True
    if (val_mask & test_mask).any() or (train_mask & test_mask).any():
        raise ValueError(
            f"The test ids of {index_file} overlap the train or validation "
            f"nodes (0 .. {num_train + num_val - 1}); lower `num_val`. "
            f"Received: num_val={num_val}"
        )
    return GraphData(
        features=features,
        edges=edges,
        labels=labels.astype("int32"),
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=int(ally.shape[1]),
    )
