"""An attention explorer: one self-contained HTML page per model and input.

`explore(model, inputs)` runs the model once (with `attention_maps`, and
`attention_rollout` / `grad_cam` for images), packs the weights into the
page as quantised bytes, and writes one HTML file with inline JavaScript
and CSS: it opens from disk and makes no network request of any kind (its
Content-Security-Policy forbids them).

Four views, chosen from the model and the inputs:

- `"sequence"`: a bertviz-style head view (lines from each query token to
  the key tokens, one colour per head, hover a token to see only its
  lines), a heat map, and every head of every layer as small multiples.
- `"image"`: the attention of a patch (hover the image to choose it) over
  the patch grid, per layer and head; attention rollout; Grad-CAM,
  Grad-CAM++ and Score-CAM side by side; the spatial maps of `CBAM` /
  `SpatialAttention` layers.
- `"detection"` (`DETR`): the predicted boxes; hovering one shows its
  object query's cross-attention (mean of heads, or one head).
- `"graph"` (`GraphAttention`): nodes and edges, each edge's width and
  colour by its coefficient, a node's neighbourhood highlighted on hover.

Storage: each attention row is scaled to its own maximum and stored as
`uint8` (with the maximum as float32; a graph's coefficients, a node's
row spread over edges, as float32), so a 12-layer x 12-head model on 197
tokens takes about 8 MB; larger inputs are cut (tokens to `max_tokens`,
graphs to `max_nodes`, layers to fit `max_megabytes`) and the page says so.
"""

import html
import importlib.resources
import json
import os
import re

import numpy as np

from keras_attention._writing import write_text_atomically
from keras_attention.visualization import _explorer_data as data
from keras_attention.visualization import _explorer_graph as graph_view
from keras_attention.visualization import _explorer_views as views
from keras_attention.visualization import maps as maps_lib

KINDS = ("auto", "sequence", "image", "detection", "graph")
CAM_METHODS = ("gradcam", "gradcam++", "scorecam")


def explore(
    model,
    inputs,
    path="attention.html",
    kind="auto",
    index=0,
    layers=None,
    tokens=None,
    target_tokens=None,
    node_labels=None,
    class_names=None,
    cam_methods=CAM_METHODS,
    score_threshold=0.5,
    pixel_mask=None,
    title=None,
    max_tokens=256,
    max_nodes=400,
    max_megabytes=20.0,
):
    """Writes an interactive attention explorer for `model` on `inputs`.

    Args:
        model: a Keras model containing registry attention layers (any
            `Sequential`, functional, nested or subclassed model, or an
            application: `VisionTransformer`, `CBAMResNet`, `DETR`,
            `GATNodeClassifier`, `TextClassifier`, a `Translator`).
        inputs: what the model is called on: token ids `(B, T)` or
            features `(B, T, C)`, images `(B, height, width, channels)`,
            `[features, edges]` for a graph model. A string (or a list of
            strings) for a model with a `preprocessor` (`TextClassifier`,
            `Seq2SeqTranslator`, `TransformerTranslator`): it is tokenised,
            and a translator first translates it, then shows the attention
            of the teacher-forced pass over its own translation.
        path: the HTML file to write (its folder must exist). It is written
            to a temporary file in the same folder first and renamed, so no
            half-written page is left behind.
        kind: `"auto"`, `"sequence"`, `"image"`, `"detection"` or
            `"graph"`; `"auto"` picks detection for `DETR`, graph when the
            model has `GraphAttention` layers, image for 4-D inputs (float
            or integer pixels: a uint8 batch too), sequence otherwise.
        index: which example of the batch to show.
        layers: optional attention layers to show: paths or names, or
            indices into the layers in the order they run.
        tokens: labels of the (source) tokens, default their positions;
            fewer than the positions crop the weights (padding), more are
            an error.
        target_tokens: labels of the target tokens of cross-attention
            layers whose query length differs from the source's.
        node_labels: graphs: the `N` node classes (node colours).
        class_names: optional names of the classes (images, detection).
        cam_methods: images: which of `"gradcam"`, `"gradcam++"`,
            `"scorecam"` to compute (empty for none).
        score_threshold: detection: the initial score threshold of the
            boxes shown (a slider on the page changes it).
        pixel_mask: detection: `(B, height, width)` of a padded batch, 1 on
            the image and 0 on padding (as `DETR.predict_boxes`): the
            padding is not attended, the boxes are in the image's pixels.
        title: the page title; default the model's name.
        max_tokens: sequences longer than this are cut to their first
            `max_tokens` tokens.
        max_nodes: graphs with more nodes are cut to the `max_nodes` nodes
            nearest node 0 (breadth first).
        max_megabytes: the budget of the attention data; over it, an evenly
            spaced subset of the layers is kept.

    Returns:
        The absolute path of the written page.

    Example:

    ```python
    inputs = keras.Input((6, 8))
    x = keras_attention.layers.ScaledDotProductAttention(use_causal_mask=True)(
        inputs
    )
    model = keras.Model(inputs, keras_attention.layers.MultiHeadAttention(2, 4)(x))
    explore(model, np.random.rand(1, 6, 8), "attention.html",
            tokens=["the", "cat", "sat", "on", "the", "mat"])
    ```
    """
    target = _check_path(path)
    _check_arguments(kind, cam_methods, max_tokens, max_nodes, max_megabytes)
    found = _attention_layers(model, inputs, index)
    context = data.Context(model, max_tokens, max_nodes, max_megabytes)
    if kind == "auto":
        kind = _infer_kind(model, inputs, found)
    if kind == "detection":
        payload = views.detection_payload(
            context, inputs, index, class_names, score_threshold, pixel_mask
        )
    elif kind == "graph":
        payload = graph_view.graph_payload(context, inputs, layers, node_labels)
    elif kind == "image":
        payload = views.image_payload(
            context, inputs, index, layers, class_names, cam_methods
        )
    else:
        payload = views.sequence_payload(
            context, inputs, index, layers, tokens, target_tokens
        )
    payload["kind"] = kind
    payload["model"] = getattr(model, "name", type(model).__name__)
    payload["title"] = title or f"Attention of {payload['model']}"
    payload["notes"] = context.notes + data.weight_notes(payload)
    payload["colormaps"] = data.colormaps()
    write_text_atomically(target, render_page(payload))
    return target


def _check_arguments(kind, cam_methods, max_tokens, max_nodes, max_megabytes):
    if kind not in KINDS:
        raise ValueError(
            f"Received an invalid value for argument `kind`, expected one of "
            f"{KINDS}. Received: kind={kind!r}"
        )
    for method in cam_methods:
        if method not in CAM_METHODS:
            raise ValueError(
                "Received an invalid value for argument `cam_methods`, "
                f"expected a subset of {CAM_METHODS}. Received: "
                f"cam_methods={cam_methods!r}"
            )
    _check_positive("max_tokens", max_tokens)
    _check_positive("max_nodes", max_nodes)
    _check_positive("max_megabytes", max_megabytes)


def _attention_layers(model, inputs, index):
    """`{path: layer}` of the model's attention layers (built if need be)."""
    found = maps_lib.attention_layers(model)
    if not found and not getattr(model, "built", True) and not data.is_text(inputs):
        _build(model, inputs, index)  # subclassed models make layers in build
        found = maps_lib.attention_layers(model)
    if not found:
        raise ValueError(
            "Received a model with no attention layer of the registry "
            f"(known: {', '.join(maps_lib.registry.names())}); `explore` "
            f"shows the attention of those. Received: "
            f"model={getattr(model, 'name', model)!r}"
        )
    return found


def _check_path(path):
    try:
        target = os.path.abspath(os.fspath(path))
    except TypeError:
        raise ValueError(
            "Received an invalid value for argument `path`, expected a file "
            f"path. Received: path={path!r}"
        ) from None
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise ValueError(
            "Received an invalid value for argument `path`, expected a file, "
            f"not a folder. Received: path={path!r}"
        )
    if not os.path.isdir(folder):
        raise ValueError(
            "Received an invalid value for argument `path`, expected a file "
            f"in an existing folder (no folder {folder!r}). Received: "
            f"path={path!r}"
        )
    if not os.access(folder, os.W_OK) or (
        os.path.exists(target) and not os.access(target, os.W_OK)
    ):
        raise ValueError(
            "Received an invalid value for argument `path`, expected a "
            f"writable file (no permission to write there). Received: "
            f"path={path!r}"
        )
    return target


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected a "
            f"positive number. Received: {name}={value!r}"
        )


def _infer_kind(model, inputs, found):
    from keras_attention.applications import DETR
    from keras_attention.layers import GraphAttention

    if isinstance(model, DETR):
        return "detection"
    if any(isinstance(layer, GraphAttention) for layer in found.values()):
        return "graph"
    if not isinstance(inputs, (str, list, tuple, dict)):
        array = np.asarray(inputs)
        if array.ndim == 4 and array.dtype.kind in "fiu":  # uint8 pixels too
            return "image"
    return "sequence"


def _build(model, inputs, index):
    sample = inputs if isinstance(inputs, (list, tuple)) and len(inputs) == 2 and (
        np.ndim(inputs[1]) in (2, 3) and np.asarray(inputs[1]).dtype.kind in "iu"
    ) else data.take(inputs, index)
    try:
        model(sample, training=False)
    except Exception as error:  # noqa: BLE001 - reported as a shape problem
        raise ValueError(
            f"The model {getattr(model, 'name', model)!r} cannot be called on "
            f"inputs of shape {data.shapes(inputs)}: {error}"
        ) from error


def render_page(payload):
    """The HTML text of the explorer for a payload (see `explore`)."""
    # "<" only occurs inside the JSON's strings: as the escape \u003c no
    # "</script>" or "<!--" can end or unsettle the script element ("<\!--"
    # was no JSON escape: JSON.parse failed and the page stayed blank).
    data_text = json.dumps(payload, separators=(",", ":")).replace("<", "\\u003c")
    parts = {
        "TITLE": html.escape(payload["title"]),
        "STYLE": _page_file("css"),
        "SCRIPT": _page_file("js"),
        "DATA": data_text,
    }
    # One pass: a title holding "__SCRIPT__" stays text.
    return re.sub(
        r"__(TITLE|STYLE|SCRIPT|DATA)__", lambda m: parts[m.group(1)],
        _page_file("html"),
    )


def _page_file(extension):
    """The page's HTML template, CSS or JavaScript (package data).

    Everything is inline in the written page; its Content-Security-Policy
    forbids every request (scripts, styles, images, fonts, connections)
    except the page's own inline code and `data:` images, so the page works
    offline and leaks nothing.
    """
    resource = importlib.resources.files(__package__) / f"explorer_page.{extension}"
    return resource.read_text(encoding="utf-8")
