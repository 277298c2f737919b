"""A node-classification graph from plain array files (PubMed / OGB style).

`load_graph_files(path)` reads a folder of NumPy (`.npy`) or CSV
(`.csv`, `.csv.gz`, comma-separated, no header) files:

| what | file names tried (in this order, each `.npy`, `.csv`, `.csv.gz`) | content |
|---|---|---|
| edges | `edges`, `edge`, `raw/edge` | `(E, 2)` rows `source,target` (OGB), or `(2, E)` in `.npy` (a `(2, 2)` `.npy` is read as `(2, E)`, with a warning) |
| features | `features`, `node-feat`, `raw/node-feat` | `(N, F)` floats |
| labels | `labels`, `node-label`, `raw/node-label` | `(N,)` or `(N, 1)` ints, -1 for none |
| splits | `train`/`val`/`test`, `valid` for `val`, also under `split/<any>/` (OGB) | node ids (one per line), or a boolean `.npy` mask |

This is the layout of an unpacked `ogbn-arxiv` / `ogbn-products` folder
(`raw/` and `split/<scheme>/`), and of any graph saved with `numpy.save`
(e.g. PubMed from PyTorch Geometric as `edges.npy`, `features.npy`,
`labels.npy`, `train.npy`, ...). Every error names the file.
"""

import glob
import os
import warnings
import zlib

import numpy as np

from keras_attention.datasets._files import DataFileNotFoundError
from keras_attention.datasets._files import missing_file_error
from keras_attention.datasets.graphs import GraphData
from keras_attention.datasets.graphs import _edges_from_pairs
from keras_attention.datasets.sampling import class_ids_with_none

_EXTENSIONS = (".npy", ".csv", ".csv.gz")
_NAMES = {
    "edges": ("edges", "edge", "raw/edge"),
    "features": ("features", "node-feat", "raw/node-feat"),
    "labels": ("labels", "node-label", "raw/node-label"),
    "train": ("train",),
    "val": ("val", "valid"),
    "test": ("test",),
}


def _find(folder, what):
    stems = list(_NAMES[what])
    if what in ("train", "val", "test"):
        split_dirs = sorted(glob.glob(os.path.join(folder, "split", "*")))
        stems += [
            os.path.relpath(os.path.join(d, stem), folder)
            for d in split_dirs
            for stem in _NAMES[what]
        ]
    tried = []
    for stem in stems:
        for extension in _EXTENSIONS:
            path = os.path.join(folder, stem + extension)
            tried.append(path)
            if os.path.isfile(path):
                return path
    names = ", ".join(os.path.relpath(t, folder) for t in tried)
    raise DataFileNotFoundError(
        2, f"Missing {what} file in {folder} (tried {names})", tried[0]
    )


def _read(path, dtype, ndmin=1):
    """`ndmin=2` reads a CSV file's rows as rows (one column, one row).

    An empty CSV file (a split without nodes, a graph without edges) is
    an empty array, without NumPy's warning; "utf-8-sig" drops the
    byte-order mark that spreadsheet programs write first.
    """
    try:
        if path.endswith(".npy"):
            array = np.load(path, allow_pickle=False)
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", "loadtxt: input contained no data"
                )
                array = np.loadtxt(
                    path, delimiter=",", dtype=dtype, ndmin=ndmin,
                    encoding="utf-8-sig",
                )
    except (ValueError, OSError, EOFError, zlib.error) as e:
        raise ValueError(f"Cannot read {path}: {e}") from e
    return array


def _check_node_ids(path, ids, num_nodes, expected="integer node ids"):
    """Raise a ValueError naming the file `path` unless the array `ids`
    holds integer node ids in `[0, num_nodes)`; `expected`: what the
    file should hold, said when its dtype is not an integer."""
    if not ids.size:
        return
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"{path} should hold {expected}. Received: "
            f"dtype={ids.dtype}"
        )
    if ids.min() < 0 or ids.max() >= num_nodes:
        raise ValueError(
            f"{path} lists node ids outside [0, {num_nodes}): values in "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )


def _ids_or_mask(path, num_nodes):
    array = _read(path, np.int64)
    if array.dtype == bool:
        if array.shape != (num_nodes,):
            raise ValueError(
                f"The mask in {path} should have shape ({num_nodes},). "
                f"Received: shape={array.shape}"
            )
        return array
    array = np.asarray(array).reshape(-1)
    _check_node_ids(
        path, array, num_nodes, "integer node ids or a boolean mask"
    )
    if len(np.unique(array)) != len(array):
        # A 0/1 mask saved as integers reads as the node ids 0 and 1.
        hint = (
            " It looks like a 0/1 mask: save it as booleans "
            "(`mask.astype(bool)`)."
            if array.shape == (num_nodes,) and np.isin(array, (0, 1)).all()
            else ""
        )
        raise ValueError(
            f"{path} should hold distinct node ids (or a boolean mask). "
            f"Received: {len(array)} ids, {len(np.unique(array))} distinct."
            + hint
        )
    mask = np.zeros(num_nodes, bool)
    mask[array] = True
    return mask


def _check_disjoint(found, masks):
    """Raise a ValueError naming both files if two splits share a node (a
    test node seen in training would inflate the test accuracy)."""
    names = list(masks)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = np.flatnonzero(masks[first] & masks[second])
            if shared.size:
                raise ValueError(
                    f"The {first} and {second} splits overlap: "
                    f"{shared.size} node(s) in both {found[first]} and "
                    f"{found[second]} "
                    f"(first node ids: {shared[:5].tolist()}); expected "
                    "disjoint train, val and test splits"
                )


def load_graph_files(path, undirected=True, normalize_features=False):
    """Loads a node-classification graph from array files in a folder.

    Args:
        path: the folder (see the module docstring for the file names).
        undirected: add the reverse of every edge, drop duplicates and self
            loops (as `load_planetoid`); `False` keeps the edges as given
            (directed, e.g. `ogbn-arxiv`'s citations source -> target).
        normalize_features: divide each feature row by its sum.

    Returns:
        A `GraphData`; `num_classes` is `max(label) + 1`.

    Raises:
        FileNotFoundError (also a ValueError): a file is missing; the
            message names the files tried.
        ValueError: a file is malformed, or its edges or ids point outside
            the node range, or two splits share nodes, or a split lists a
            node without a label; the message names the file(s).
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise missing_file_error(folder, "graph folder")
    found = {what: _find(folder, what) for what in _NAMES}

    features = _read(found["features"], np.float32, ndmin=2)
    if features.ndim != 2:
        raise ValueError(
            f"{found['features']} should hold a (N, F) matrix. Received: "
            f"shape={features.shape}"
        )
    features = np.asarray(features, np.float32)
    num_nodes = len(features)
    if not num_nodes:
        raise ValueError(
            f"{found['features']} should hold a (N, F) matrix with a row per "
            "node. Received: no rows"
        )

    # As floats: OGB's CSV files write NaN for unlabelled nodes.
    labels = np.asarray(_read(found["labels"], np.float64))
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.shape != (num_nodes,):
        raise ValueError(
            f"{found['labels']} should hold one label per node ({num_nodes}, "
            f"the rows of {found['features']}). Received: shape={labels.shape}"
        )
    if labels.dtype.kind == "f":  # OGB writes NaN for unlabelled nodes
        labels, bad = class_ids_with_none(labels)
        if len(bad):
            raise ValueError(
                f"{found['labels']} should hold integer class ids (NaN or "
                f"-1 for none). Received: {labels[bad[:3]].tolist()}"
            )
    elif labels.dtype.kind not in "iu":
        raise ValueError(
            f"{found['labels']} should hold integer class ids. Received: "
            f"dtype={labels.dtype}"
        )
    labels = labels.astype(np.int32)

    edges = _read(found["edges"], np.int64, ndmin=2)
    edges = np.asarray(edges)
    if not edges.size:  # a graph without edges: every node isolated
        edges = np.zeros((2, 0), np.int64)
    elif edges.ndim == 2 and edges.shape[0] == 2 and found["edges"].endswith(".npy"):
        if edges.shape[1] == 2:  # two edges: either layout
            warnings.warn(
                f"{found['edges']} holds a (2, 2) array, read as (2, E): "
                f"sources {edges[0].tolist()}, targets {edges[1].tolist()}. "
                "Two edges as (E, 2) rows are its transpose; save it as "
                "(2, E) or as a .csv of rows to be read that way.",
                stacklevel=2,
            )
        # (2, E)
    elif edges.ndim == 2 and edges.shape[1] == 2:
        edges = edges.T
    else:
        raise ValueError(
            f"{found['edges']} should hold an edge list (E, 2) (or (2, E) in "
            f".npy). Received: shape={edges.shape}"
        )
    _check_node_ids(found["edges"], edges, num_nodes)
    edges = edges.astype(np.int64)
    if undirected:
        edges = _edges_from_pairs(edges.T, num_nodes)
    else:
        edges = edges.astype(np.int32)

    splits = ("train", "val", "test")
    masks = [_ids_or_mask(found[what], num_nodes) for what in splits]
    _check_disjoint(found, dict(zip(splits, masks)))
    for what, mask in zip(splits, masks):
        unlabelled = np.flatnonzero(mask & (labels < 0))
        if unlabelled.size:
            raise ValueError(
                f"The {what} split of {found[what]} lists {unlabelled.size} "
                f"node(s) without a label (-1 in {found['labels']}; first "
                f"node ids: {unlabelled[:5].tolist()}); expected labelled "
                "nodes only"
            )
    if normalize_features:
        from keras_attention.datasets.graphs import normalize_rows

        features = normalize_rows(features)
    known = labels[labels >= 0]
    return GraphData(
        features=features,
        edges=edges,
        labels=labels,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=int(known.max()) + 1 if known.size else 0,
    )
