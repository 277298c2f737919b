"""Pictures of attention: heatmaps, image overlays, detections, graphs.

Every function builds a `matplotlib.figure.Figure` on the Agg canvas (no
`pyplot`, no window, no global backend change), returns it, and saves it
when `path` is given, in the format its extension names (PNG without one).
"""

import os

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from keras_attention._writing import write_atomically
from keras_attention.visualization import _grid


def plot_attention_heatmap(
    weights,
    source_tokens=None,
    target_tokens=None,
    head=None,
    title=None,
    cmap="viridis",
    path=None,
    xlabel="source",
    ylabel="target",
):
    """The attention of target tokens over source tokens, as a heatmap.

    Rows are the target (query) tokens, columns the source (key) tokens,
    as in the alignment pictures of Bahdanau et al. (2015).

    Args:
        weights: `(T, S)`, or `(H, T, S)` for several heads (averaged,
            unless `head` picks one).
        source_tokens: `S` labels of the columns (fewer crop the weights,
            e.g. to leave out padding); default positions.
        target_tokens: `T` labels of the rows (fewer crop the weights).
        head: the head to show, for `(H, T, S)` weights.
        title: title of the picture.
        cmap: Matplotlib colour map.
        path: where to save a PNG.
        xlabel, ylabel: names of the columns' and the rows' axes (for
            self-attention, e.g. `"key"` and `"query"`).

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    fig = plot_attention_heatmap(
        np.eye(3), ["a", "b", "c"], ["x", "y", "z"], path="alignment.png"
    )
    ```
    """
    weights = _grid.as_numpy(weights, "float32")
    if weights.ndim == 3:
        weights = _pick_head(weights, head, axis=0)
    if weights.ndim != 2:
        raise ValueError(
            "Received an invalid value for argument `weights`, expected "
            f"(T, S) or (H, T, S). Received: weights.shape={weights.shape}"
        )
    source_tokens = _labels("source_tokens", source_tokens, weights.shape[1])
    target_tokens = _labels("target_tokens", target_tokens, weights.shape[0])
    weights = weights[: len(target_tokens), : len(source_tokens)]
    rows, cols = weights.shape
    fig = _figure((max(3.0, 0.45 * cols + 1.8), max(2.5, 0.4 * rows + 1.2)))
    ax = fig.add_subplot()
    image = ax.imshow(weights, cmap=cmap, aspect="auto", vmin=0.0)
    ax.set_xticks(range(cols), source_tokens, rotation=90)
    ax.set_yticks(range(rows), target_tokens)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return _finish(fig, path)


def plot_image_overlay(
    image, heatmap, alpha=0.5, title=None, cmap="jet", path=None
):
    """An image with a heatmap laid over it (CBAM map, rollout, Grad-CAM).

    The heatmap is resized (bilinear) to the image and scaled to `[0, 1]`.
    Several heatmaps (a dict `{name: map}`) give one panel each, after the
    image itself.

    Args:
        image: `(height, width)`, `(height, width, 1)` or
            `(height, width, 3)`, any range (shown scaled to `[0, 1]`).
        heatmap: `(h, w)` (or `(h, w, 1)`), or a dict of them.
        alpha: opacity of the heatmap in `[0, 1]`.
        title: title of the picture (of the panel, for one heatmap).
        cmap: Matplotlib colour map of the heatmap.
        path: where to save a PNG.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    cam = grad_cam(model, images)
    fig = plot_image_overlay(images[0], cam[0], alpha=0.4, path="cam.png")
    ```
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (
        0.0 <= alpha <= 1.0
    ):
        raise ValueError(
            "Received an invalid value for argument `alpha`, expected a "
            f"float in [0, 1]. Received: alpha={alpha!r}"
        )
    picture, gray = _display_image(image)
    heatmaps = heatmap if isinstance(heatmap, dict) else {title or "": heatmap}
    panels = len(heatmaps) + (1 if isinstance(heatmap, dict) else 0)
    fig = _figure((3.2 * panels + 0.6, 3.4))
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    if isinstance(heatmap, dict):
        _show_image(axes[0], picture, gray)
        axes[0].set_title("image")
        axes = axes[1:]
        if title:
            fig.suptitle(title)
    for ax, (name, values) in zip(axes, heatmaps.items()):
        values = _heatmap("heatmap", values, picture.shape[:2])
        _show_image(ax, picture, gray)
        shown = ax.imshow(values, cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
        if name:
            ax.set_title(name)
    fig.colorbar(shown, ax=axes, fraction=0.046, pad=0.04)
    return _finish(fig, path)


def plot_detections(
    image,
    boxes,
    labels,
    scores=None,
    attention_maps=None,
    class_names=None,
    box_format="cxcywh",
    normalized=True,
    grid_shape=None,
    alpha=0.5,
    title=None,
    path=None,
):
    """Detected boxes on an image, and each object's attention beside it.

    The first panel shows the image with every box and its label (and
    score); with `attention_maps`, one more panel per object shows where
    its query looked (DETR's decoder cross-attention over the encoder's
    feature map) with its box.

    Args:
        image: `(height, width)` or `(height, width, channels)`.
        boxes: `(K, 4)`: `(cx, cy, w, h)` (DETR's training format) or
            `(x0, y0, x1, y1)` with `box_format="xyxy"`; normalised to
            `[0, 1]`, or in pixels with `normalized=False` (what
            `DETR.predict_boxes` returns: `box_format="xyxy",
            normalized=False`).
        labels: `K` class indices (or names).
        scores: optional `K` confidences.
        attention_maps: optional per-object maps: `(K, h, w)`, or `(K, S)`
            over the `S = h * w` feature-map positions (laid out with the
            image's aspect ratio, or `grid_shape`).
        class_names: optional names of the class indices.
        box_format: `"cxcywh"` or `"xyxy"`.
        normalized: whether the boxes are fractions of the image size
            (then a coordinate beyond 1.5 in size raises a `ValueError`:
            those are pixel boxes).
        grid_shape: `(h, w)` of `(K, S)` attention maps.
        alpha: opacity of the attention maps.
        title: title of the picture.
        path: where to save a PNG.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:

    ```python
    found = detr.predict_boxes(images[:1], return_attention=True)[0]
    fig = plot_detections(
        images[0], found["boxes"], found["labels"], found["scores"],
        attention_maps=found["attention"], box_format="xyxy",
        normalized=False, path="detections.png",
    )
    ```
    """
    if box_format not in ("cxcywh", "xyxy"):
        raise ValueError(
            "Received an invalid value for argument `box_format`, expected "
            f"'cxcywh' or 'xyxy'. Received: box_format={box_format!r}"
        )
    picture, gray = _display_image(image)
    height, width = picture.shape[:2]
    boxes = _grid.as_numpy(boxes, "float32")
    if boxes.size and (boxes.ndim not in (1, 2) or boxes.shape[-1] != 4):
        raise ValueError(
            "Received an invalid value for argument `boxes`, expected shape "
            f"(K, 4) (or (4,) for one box). Received: boxes.shape={boxes.shape}"
        )
    boxes = boxes.reshape(-1, 4)
    count = len(boxes)
    names = _box_names(labels, scores, class_names, count)
    if box_format == "cxcywh":
        corners = np.concatenate(
            [boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2],
            axis=-1,
        )
    else:
        corners = boxes
    if normalized:
        if np.any(np.abs(boxes) > 1.5):
            # Pixel boxes (`predict_boxes`'s) read as fractions of the image
            # would be drawn far outside it.
            raise ValueError(
                "Received an invalid value for argument `boxes`, expected "
                "fractions of the image size with `normalized=True` (pass "
                "`normalized=False` for pixel boxes, and "
                "`box_format=\"xyxy\"` for `DETR.predict_boxes`'s). Received: "
                f"boxes with values up to {float(np.abs(boxes).max()):g}"
            )
        corners = corners * np.array([width, height, width, height], "float32")
    if attention_maps is not None:
        attention_maps = _object_maps(
            attention_maps, count, (height, width), grid_shape
        )
    panels = 1 + (count if attention_maps is not None else 0)
    fig = _figure((3.2 * panels, 3.4))
    colours = [_colour(k) for k in range(count)]
    ax = fig.add_subplot(1, panels, 1)
    _show_image(ax, picture, gray)
    for k in range(count):
        _draw_box(ax, corners[k], colours[k], names[k])
    ax.set_title(title or "detections")
    for k in range(panels - 1):
        ax = fig.add_subplot(1, panels, k + 2)
        _show_image(ax, picture, gray)
        values = _heatmap("attention_maps", attention_maps[k], (height, width))
        ax.imshow(values, cmap="inferno", alpha=alpha, vmin=0.0, vmax=1.0)
        _draw_box(ax, corners[k], colours[k], None)
        ax.set_title(names[k])
    return _finish(fig, path)


def plot_graph_attention(
    edges,
    coefficients,
    labels=None,
    num_nodes=None,
    head=None,
    title=None,
    seed=0,
    path=None,
):
    """A graph drawn with each edge's width and colour by its GAT coefficient.

    Args:
        edges: `(2, E)` edge list, row 0 the sources `j` and row 1 the
            targets `i` of the edges `j -> i` (`GraphAttention`'s format),
            or `(E, 2)`.
        coefficients: what `GraphAttention` returns as scores: `(E', H)` or
            `(E',)` per edge, where `E' = E`, or `E + N` with the self loops
            appended (`add_self_loops=True`); or a dense `(N, N)` /
            `(H, N, N)` matrix, `[i, j]` for the edge `j -> i`.
        labels: optional `N` node classes (the node colours).
        num_nodes: `N`; default `len(labels)` or the largest index + 1.
        head: the head to show; default the mean over heads.
        title: title of the picture.
        seed: seed of the spring layout.
        path: where to save a PNG.

    Returns:
        The `matplotlib.figure.Figure`. Self loops are not drawn (their
        coefficient is each node's attention to itself).

    Example:

    ```python
    _, alpha = gat_layer([features, edges], return_attention_scores=True)
    fig = plot_graph_attention(edges, alpha, labels=classes, path="gat.png")
    ```
    """
    import networkx as nx

    edges = _grid.as_numpy(edges)
    if edges.ndim != 2 or 2 not in edges.shape or edges.dtype.kind not in "iu":
        raise ValueError(
            "Received an invalid value for argument `edges`, expected an "
            f"integer edge list (2, E) or (E, 2). Received: "
            f"edges.shape={edges.shape}, dtype={edges.dtype}"
        )
    if edges.shape[0] != 2:
        edges = edges.T
    if num_nodes is None:
        if labels is None and not edges.size:
            raise ValueError(
                "Received an invalid value for argument `edges`, expected at "
                "least one edge (or `num_nodes` or `labels` to draw nodes "
                f"without edges). Received: edges.shape={edges.shape}"
            )
        num_nodes = len(labels) if labels is not None else int(edges.max()) + 1
    edges, values = _edge_values(edges, coefficients, num_nodes, head)
    keep = edges[0] != edges[1]
    edges, values = edges[:, keep], values[keep]
    graph = nx.DiGraph()
    graph.add_nodes_from(range(num_nodes))
    pairs = [(int(j), int(i)) for j, i in edges.T]
    graph.add_edges_from(pairs)
    position = nx.spring_layout(graph, seed=seed)
    fig = _figure((6.4, 5.6))
    ax = fig.add_subplot()
    if labels is not None:
        node_colour = _grid.as_numpy(labels).reshape(-1)
        node_options = dict(node_color=node_colour, cmap="tab10", vmin=0, vmax=9)
    else:
        node_options = dict(node_color="#9ecae1")
    nx.draw_networkx_nodes(
        graph, position, ax=ax, node_size=180, edgecolors="black",
        linewidths=0.5, **node_options,
    )
    if num_nodes <= 60:
        nx.draw_networkx_labels(graph, position, ax=ax, font_size=7)
    top = float(values.max()) if len(values) and values.max() > 0 else 1.0
    nx.draw_networkx_edges(
        graph,
        position,
        edgelist=pairs,
        width=list(0.3 + 4.0 * values / top),
        edge_color=list(values),
        edge_cmap=_colormap("viridis"),
        edge_vmin=0.0,
        edge_vmax=top,
        arrows=True,
        arrowsize=8,
        connectionstyle="arc3,rad=0.12",
        ax=ax,
    )
    mappable = ScalarMappable(Normalize(0.0, top), _colormap("viridis"))
    fig.colorbar(mappable, ax=ax, fraction=0.046, pad=0.04, label="attention")
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return _finish(fig, path)


def _box_names(labels, scores, class_names, count):
    """Each box's caption: its class name (and score), checked per box."""
    labels = list(_grid.as_numpy(labels).reshape(-1))
    if len(labels) != count:
        raise ValueError(
            "Received an invalid value for argument `labels`, expected one "
            f"label per box ({count}). Received: {len(labels)} labels"
        )
    if scores is not None:
        scores = _grid.as_numpy(scores, "float32").reshape(-1)
        if len(scores) != count:
            raise ValueError(
                "Received an invalid value for argument `scores`, expected "
                f"one score per box ({count}). Received: {len(scores)} scores"
            )
    names = []
    for k, label in enumerate(labels):
        name = (
            class_names[int(label)]
            if class_names is not None and np.issubdtype(type(label), np.integer)
            else str(label)
        )
        if scores is not None:
            name = f"{name} {scores[k]:.2f}"
        names.append(name)
    return names


def _object_maps(attention_maps, count, size, grid_shape):
    """Per-object maps `(K, h, w)` from `(K, h, w)` or `(K, S)`, checked."""
    attention_maps = _grid.as_numpy(attention_maps, "float32")
    if len(attention_maps) != count or attention_maps.ndim not in (2, 3):
        raise ValueError(
            "Received an invalid value for argument `attention_maps`, "
            f"expected (K, S) or (K, h, w) with K={count} boxes. "
            f"Received: attention_maps.shape={attention_maps.shape}"
        )
    if attention_maps.ndim == 2:
        (h, w), _ = _grid.token_grid(attention_maps.shape[1], size, grid_shape, False)
        attention_maps = attention_maps.reshape(count, h, w)
    return attention_maps


def _edge_values(edges, coefficients, num_nodes, head):
    """`(edges, one coefficient per edge)`, self loops appended when the
    coefficients have them; from per-edge rows or a dense matrix."""
    coefficients = _grid.as_numpy(coefficients, "float32")
    per_edge_rows = (edges.shape[1], edges.shape[1] + num_nodes)
    # A dense (N, N) / (H, N, N) matrix, unless its rows are one per edge.
    dense = coefficients.ndim == 3 or (
        coefficients.shape == (num_nodes, num_nodes)
        and coefficients.shape[0] not in per_edge_rows
    )
    if dense:
        if coefficients.ndim == 3:
            coefficients = _pick_head(coefficients, head, axis=0)
        values = coefficients[edges[1], edges[0]]
    else:
        if coefficients.ndim == 2:
            coefficients = _pick_head(coefficients, head, axis=1)
        if coefficients.ndim != 1:
            raise ValueError(
                "Received an invalid value for argument `coefficients`, "
                "expected (E, H), (E,), (N, N) or (H, N, N). Received: "
                f"coefficients.shape={coefficients.shape}"
            )
        if len(coefficients) == edges.shape[1] + num_nodes:
            loops = np.arange(num_nodes)
            edges = np.concatenate([edges, np.stack([loops, loops])], axis=1)
        if len(coefficients) != edges.shape[1]:
            raise ValueError(
                "Received an invalid value for argument `coefficients`, "
                f"expected one per edge ({edges.shape[1]}, or "
                f"{edges.shape[1] + num_nodes} with self loops). Received: "
                f"coefficients.shape={coefficients.shape}"
            )
        values = coefficients
    return edges, values


def _figure(size):
    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _finish(fig, path):
    """`fig`, saved to `path` (if any) in the format its extension names
    (`.png`, `.pdf`, `.svg`, `.jpg`, ...; PNG without one)."""
    if path is not None:
        extension = os.path.splitext(os.fspath(path))[1][1:].lower()
        formats = fig.canvas.get_supported_filetypes()
        if extension and extension not in formats:
            raise ValueError(
                "Received an invalid value for argument `path`, expected a "
                f"file name ending in one of {', '.join('.' + f for f in sorted(formats))} "
                f"(or none, for PNG). Received: path={os.fspath(path)!r}"
            )
        if os.path.isdir(path):
            raise ValueError(
                "Received an invalid value for argument `path`, expected a "
                f"file name, not a folder. Received: path={os.fspath(path)!r}"
            )
        folder = os.path.dirname(os.fspath(path))
        try:
            if folder:
                os.makedirs(folder, exist_ok=True)
        except OSError as error:  # a file in the way of the folder
            raise ValueError(
                "Received an invalid value for argument `path`, expected a "
                f"file in a folder that can be made ({error.strerror}: "
                f"{folder}). Received: path={os.fspath(path)!r}"
            ) from None
        write_atomically(
            path,
            lambda temporary: fig.savefig(
                temporary, format=extension or "png", bbox_inches="tight"
            ),
        )
    return fig


def _labels(argument, tokens, size):
    if tokens is None:
        return [str(i) for i in range(size)]
    tokens = [str(t) for t in tokens]
    if len(tokens) > size:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"at most {size} tokens (the weights' size). Received: "
            f"{len(tokens)} tokens"
        )
    return tokens


def _display_image(image):
    """`(picture in [0, 1], is_gray)` from `(H, W)`, `(H, W, 1)`, `(H, W, 3)`."""
    picture = _grid.as_numpy(image, "float32")
    if picture.ndim == 3 and picture.shape[-1] == 1:
        picture = picture[..., 0]
    if picture.ndim not in (2, 3) or (
        picture.ndim == 3 and picture.shape[-1] not in (3, 4)
    ):
        raise ValueError(
            "Received an invalid value for argument `image`, expected "
            "(height, width), (height, width, 1) or (height, width, 3). "
            f"Received: image.shape={np.shape(image)}"
        )
    low, high = float(picture.min()), float(picture.max())
    if low < 0.0 or high > 1.0:
        picture = (picture - low) / (high - low) if high > low else picture * 0
    return picture, picture.ndim == 2


def _show_image(ax, picture, gray):
    ax.imshow(picture, cmap="gray" if gray else None, vmin=0.0, vmax=1.0)
    ax.set_xticks([])
    ax.set_yticks([])


def _heatmap(argument, values, size):
    values = _grid.as_numpy(values, "float32")
    if values.ndim == 3 and values.shape[-1] == 1:
        values = values[..., 0]
    if values.ndim != 2:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a map (h, w). Received: shape={values.shape}"
        )
    return _grid.normalize_maps(_grid.resize_maps(values, size)[None])[0]


def _pick_head(values, head, axis):
    """The mean over the heads on `axis`, or the head `head` (an integer
    index, negative from the end)."""
    if head is None:
        return values.mean(axis=axis)
    count = values.shape[axis]
    if (
        isinstance(head, (bool, np.bool_))
        or not isinstance(head, (int, np.integer))
        or not -count <= head < count
    ):
        raise ValueError(
            "Received an invalid value for argument `head`, expected an "
            f"integer index below {count}. Received: head={head!r}"
        )
    return np.take(values, int(head), axis=axis)


def _colormap(name):
    return colormaps[name]


def _colour(k):
    return _colormap("tab10")(k % 10)


def _draw_box(ax, corners, colour, name):
    x0, y0, x1, y1 = (float(v) for v in corners)
    ax.add_patch(
        Rectangle(
            (x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0,
            fill=False, edgecolor=colour, linewidth=2,
        )
    )
    if name:
        ax.text(
            x0 - 0.5, y0 - 1.0, name, color="white", fontsize=8,
            bbox=dict(facecolor=colour, alpha=0.8, pad=1, edgecolor="none"),
        )
