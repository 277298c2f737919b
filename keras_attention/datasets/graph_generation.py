"""Generated node-classification graphs of any size, for tests and scale.

`make_graph` draws a degree-corrected stochastic block model: every node
has a class, and with `kind="power_law"` a Pareto weight that makes its
expected degree heavy-tailed (a Chung-Lu graph inside and across blocks);
an edge's first end is drawn in proportion to the weights, its second end
within the same class with probability `homophily`, else anywhere, again
in proportion to the weights. Features are the class's mean vector plus
Gaussian noise, so both the features and the neighbourhood carry the
class. Vectorised NumPy: a million nodes and twenty million edges take
about 14 s on two cores (`benchmarks/bench_graph_scale.py`).
"""

import numpy as np

from keras_attention._validation import invalid
from keras_attention.datasets.graphs import GraphData
from keras_attention.datasets.graphs import _edges_from_pairs


def _positive_int(argument, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
        value <= 0
    ):
        raise invalid(argument, "a positive integer", value)
    return int(value)


def _fraction(argument, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        0.0 <= value <= 1.0
    ):
        raise invalid(argument, "a float in [0, 1]", value)
    return float(value)


def split_masks(num_nodes, train_fraction, val_fraction, rng):
    """Disjoint random train/validation/test masks (test: the rest)."""
    order = rng.permutation(num_nodes)
    num_train = int(round(train_fraction * num_nodes))
    num_val = int(round(val_fraction * num_nodes))
    masks = []
    for ids in (
        order[:num_train],
        order[num_train : num_train + num_val],
        order[num_train + num_val :],
    ):
        mask = np.zeros(num_nodes, bool)
        mask[ids] = True
        masks.append(mask)
    return masks


def make_graph(
    num_nodes=10_000,
    avg_degree=20,
    feature_dim=128,
    num_classes=8,
    kind="sbm",
    homophily=0.8,
    feature_noise=1.0,
    train_fraction=0.6,
    val_fraction=0.2,
    seed=0,
):
    """A random graph with class-correlated structure and features.

    Args:
        num_nodes: number of nodes `N`.
        avg_degree: target mean in-degree: about `N * avg_degree` directed
            edges (`N * avg_degree / 2` undirected ones drawn, both
            directions kept; the few duplicates and self loops drawn are
            dropped, so the count is slightly lower).
        feature_dim: feature size `F`.
        num_classes: number of classes (uniform).
        kind: `"sbm"` (stochastic block model, Poisson-like degrees) or
            `"power_law"` (degree-corrected, Pareto weights with tail
            exponent 2.5, as in web and citation graphs).
        homophily: the chance an edge's second end is drawn in its first
            end's class, else anywhere (`h + (1 - h) / C` stay in class).
        feature_noise: standard deviation of the noise added to the class
            means (which are standard normal).
        train_fraction, val_fraction: sizes of the random splits (test:
            the remaining nodes).
        seed: the same seed gives the same graph.

    Returns:
        A `GraphData`: float32 features `(N, F)`, int32 edges `(2, E)`
        (symmetric, deduplicated, no self loops, sorted by target), int32
        labels `(N,)`, disjoint masks.

    Example:

    >>> graph = make_graph(num_nodes=1000, avg_degree=10, feature_dim=16, seed=0)
    >>> graph.features.shape, graph.num_classes
    ((1000, 16), 8)
    """
    num_nodes = _positive_int("num_nodes", num_nodes)
    feature_dim = _positive_int("feature_dim", feature_dim)
    num_classes = _positive_int("num_classes", num_classes)
    if num_classes > num_nodes:
        raise invalid(
            "num_classes", f"at most num_nodes={num_nodes}", num_classes
        )
    if isinstance(avg_degree, bool) or not isinstance(
        avg_degree, (int, float, np.integer)
    ) or not 0 < avg_degree < num_nodes:
        raise invalid(
            "avg_degree", f"a number in (0, num_nodes={num_nodes})", avg_degree
        )
    if kind not in ("sbm", "power_law"):
        raise invalid("kind", "one of 'sbm', 'power_law'", kind)
    homophily = _fraction("homophily", homophily)
    train_fraction = _fraction("train_fraction", train_fraction)
    val_fraction = _fraction("val_fraction", val_fraction)
    if train_fraction + val_fraction > 1.0:
        raise invalid(
            "val_fraction",
            f"at most 1 - train_fraction = {1.0 - train_fraction}",
            val_fraction,
        )
    if isinstance(feature_noise, bool) or not isinstance(
        feature_noise, (int, float)
    ) or feature_noise < 0:
        raise invalid("feature_noise", "a non-negative float", feature_noise)

    rng = np.random.default_rng(seed)
    labels = rng.integers(num_classes, size=num_nodes).astype(np.int32)
    if kind == "power_law":
        weights = rng.pareto(1.5, size=num_nodes) + 1.0  # P(w > x) ~ x^-1.5
    else:
        weights = np.ones(num_nodes)

    # Nodes sorted by class: one cumulative weight serves every class.
    order = np.argsort(labels, kind="stable")
    cumulative = np.cumsum(weights[order])
    class_end = np.cumsum(np.bincount(labels, minlength=num_classes))
    # The weight up to each class's end and start (0 before the first).
    class_high = np.concatenate([[0.0], cumulative])[class_end]
    class_low, total = np.concatenate([[0.0], class_high[:-1]]), cumulative[-1]

    def draw(low, mass):
        position = np.searchsorted(cumulative, low + rng.random(len(low)) * mass, "right")
        return order[np.minimum(position, num_nodes - 1)]

    num_pairs = int(round(num_nodes * avg_degree / 2))
    first = draw(np.zeros(num_pairs), total)
    same = rng.random(num_pairs) < homophily
    c = labels[first]
    second = np.where(
        same,
        draw(class_low[c], class_high[c] - class_low[c]),
        draw(np.zeros(num_pairs), total),
    )
    edges = _edges_from_pairs(np.stack([first, second], axis=1), num_nodes)
    del first, second, same, c

    means = rng.standard_normal((num_classes, feature_dim), dtype=np.float32)
    features = rng.standard_normal((num_nodes, feature_dim), dtype=np.float32)
    features *= np.float32(feature_noise)
    for start in range(0, num_nodes, 65536):  # no (N, F) temporary
        features[start : start + 65536] += means[labels[start : start + 65536]]
    train_mask, val_mask, test_mask = split_masks(
        num_nodes, train_fraction, val_fraction, rng
    )
    return GraphData(
        features=features, edges=edges, labels=labels, train_mask=train_mask,
        val_mask=val_mask, test_mask=test_mask, num_classes=num_classes,
    )
