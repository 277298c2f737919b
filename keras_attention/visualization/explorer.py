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
`uint8` (with the maximum as float32), so a 12-layer x 12-head model on 197
tokens takes about 8 MB; larger inputs are cut (tokens to `max_tokens`,
graphs to `max_nodes`, layers to fit `max_megabytes`) and the page says so.
"""

import base64
import collections
import html
import json
import os
import tempfile
import warnings

import keras
import numpy as np

from keras_attention.visualization import _grid
from keras_attention.visualization import maps as maps_lib

KINDS = ("auto", "sequence", "image", "detection", "graph")
CAM_METHODS = ("gradcam", "gradcam++", "scorecam")
_CAM_TITLES = {"gradcam": "Grad-CAM", "gradcam++": "Grad-CAM++", "scorecam": "Score-CAM"}


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
            model has `GraphAttention` layers, image for 4-D float inputs,
            sequence otherwise.
        index: which example of the batch to show.
        layers: optional attention layers to show: paths or names, or
            indices into the layers in the order they run.
        tokens: labels of the (source) tokens, default their positions.
        target_tokens: labels of the target tokens of cross-attention
            layers whose query length differs from the source's.
        node_labels: graphs: the `N` node classes (node colours).
        class_names: optional names of the classes (images, detection).
        cam_methods: images: which of `"gradcam"`, `"gradcam++"`,
            `"scorecam"` to compute (empty for none).
        score_threshold: detection: the initial score threshold of the
            boxes shown (a slider on the page changes it).
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
    model = keras.Sequential([
        keras.Input((6, 8)),
        keras_attention.layers.MultiHeadAttention(2, 4, name="mha_1"),
        keras_attention.layers.MultiHeadAttention(2, 4, name="mha_2"),
    ])
    explore(model, np.random.rand(1, 6, 8), "attention.html",
            tokens=["the", "cat", "sat", "on", "the", "mat"])
    ```
    """
    target = _check_path(path)
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
    found = maps_lib.attention_layers(model)
    if not found and not getattr(model, "built", True) and not _is_text(inputs):
        _build(model, inputs, index)  # subclassed models make layers in build
        found = maps_lib.attention_layers(model)
    if not found:
        raise ValueError(
            "Received a model with no attention layer of the registry "
            f"(known: {', '.join(maps_lib.registry.names())}); `explore` "
            f"shows the attention of those. Received: "
            f"model={getattr(model, 'name', model)!r}"
        )
    context = _Context(model, max_tokens, max_nodes, max_megabytes)
    if kind == "auto":
        kind = _infer_kind(model, inputs, found)
    if kind == "detection":
        payload = _detection_payload(
            context, inputs, index, class_names, score_threshold
        )
    elif kind == "graph":
        payload = _graph_payload(context, inputs, layers, node_labels)
    elif kind == "image":
        payload = _image_payload(
            context, inputs, index, layers, class_names, cam_methods
        )
    else:
        payload = _sequence_payload(
            context, inputs, index, layers, tokens, target_tokens
        )
    payload["kind"] = kind
    payload["model"] = getattr(model, "name", type(model).__name__)
    payload["title"] = title or f"Attention of {payload['model']}"
    payload["notes"] = context.notes
    payload["colormaps"] = _colormaps()
    _write_atomically(target, render_page(payload))
    return target


# Checks -----------------------------------------------------------------------


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


def _check_index(index, count):
    if (
        isinstance(index, bool)
        or not isinstance(index, (int, np.integer))
        or not 0 <= index < count
    ):
        raise ValueError(
            "Received an invalid value for argument `index`, expected an "
            f"example of the batch, 0 <= index < {count}. Received: "
            f"index={index!r}"
        )
    return int(index)


def _shapes(inputs):
    return keras.tree.map_structure(lambda x: tuple(np.shape(x)), inputs)


def _write_atomically(target, text):
    folder = os.path.dirname(target)
    handle, temporary = tempfile.mkstemp(
        prefix=".explore-", suffix=".html.tmp", dir=folder
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


# Running the model ------------------------------------------------------------


class _Context:
    def __init__(self, model, max_tokens, max_nodes, max_megabytes):
        self.model = model
        self.max_tokens = int(max_tokens)
        self.max_nodes = int(max_nodes)
        self.max_bytes = float(max_megabytes) * 1e6
        self.notes = []

    def maps(self, inputs, layers=None):
        """`{name: weights}` of one pass, the layers picked by `layers`."""
        try:
            weights = maps_lib.attention_maps(self.model, inputs)
        except (ValueError, TypeError, IndexError) as error:
            raise ValueError(
                f"The model {self.model.name!r} cannot be called on inputs of "
                f"shape {_shapes(inputs)}: {error}"
            ) from error
        except Exception as error:  # backend errors (InvalidArgumentError)
            if type(error).__module__.startswith(("tensorflow", "jax", "torch")):
                raise ValueError(
                    f"The model {self.model.name!r} cannot be called on "
                    f"inputs of shape {_shapes(inputs)}: {error}"
                ) from error
            raise
        return _pick_layers(weights, layers)


def _pick_layers(weights, layers):
    if layers is None:
        return weights
    names = list(weights)
    wanted = [layers] if isinstance(layers, (str, int, np.integer)) else list(layers)
    picked = collections.OrderedDict()
    for key in wanted:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not -len(names) <= key < len(names):
                raise ValueError(
                    "Received an invalid value for argument `layers`, "
                    f"expected indices below {len(names)} (the attention "
                    f"layers: {', '.join(names)}). Received: layers={layers!r}"
                )
            name = names[key]
            picked[name] = weights[name]
            continue
        matches = [
            n for n in names if n == key or n.rsplit("/", 1)[-1] == key
        ]
        if not matches:
            raise ValueError(
                "Received an invalid value for argument `layers`, expected "
                f"names or indices of attention layers ({', '.join(names)}). "
                f"Received: layers={layers!r}"
            )
        for name in matches:
            picked[name] = weights[name]
    return picked


def _infer_kind(model, inputs, found):
    from keras_attention.applications import DETR
    from keras_attention.layers import GraphAttention

    if isinstance(model, DETR):
        return "detection"
    if any(isinstance(layer, GraphAttention) for layer in found.values()):
        return "graph"
    if not isinstance(inputs, (str, list, tuple, dict)):
        array = np.asarray(inputs)
        if array.ndim == 4 and array.dtype.kind == "f":
            return "image"
    return "sequence"


def _is_text(inputs):
    return isinstance(inputs, str) or (
        isinstance(inputs, (list, tuple))
        and bool(inputs)
        and all(isinstance(t, str) for t in inputs)
    )


def _build(model, inputs, index):
    sample = inputs if isinstance(inputs, (list, tuple)) and len(inputs) == 2 and (
        np.ndim(inputs[1]) in (2, 3) and np.asarray(inputs[1]).dtype.kind in "iu"
    ) else _take(inputs, index)
    try:
        model(sample, training=False)
    except Exception as error:  # noqa: BLE001 - reported as a shape problem
        raise ValueError(
            f"The model {getattr(model, 'name', model)!r} cannot be called on "
            f"inputs of shape {_shapes(inputs)}: {error}"
        ) from error


def _take(inputs, index):
    """Example `index` of a batch (arrays, lists or dicts of arrays)."""
    counts = {len(x) for x in keras.tree.flatten(inputs) if np.ndim(x) > 0}
    if len(counts) != 1:
        raise ValueError(
            "Received inputs whose parts have different batch sizes "
            f"{sorted(counts)} or no batch axis. Received: inputs of shape "
            f"{_shapes(inputs)}"
        )
    index = _check_index(index, counts.pop())
    return keras.tree.map_structure(
        lambda x: np.asarray(x)[index : index + 1], inputs
    )


def _calls(value):
    """A layer's weights as one array: a list of one-query calls joined."""
    if not isinstance(value, list):
        return value
    arrays = [np.asarray(v) for v in value if not isinstance(v, tuple)]
    if arrays and all(a.ndim in (3, 4) and a.shape[-2] == 1 for a in arrays):
        return np.concatenate(arrays, axis=-2)  # one decoding step per call
    return value[0]


# Packing ----------------------------------------------------------------------


def _b64(array):
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def _quantised_rows(weights):
    """`{"data", "scale"}` of `(..., S)` rows: uint8 of each row over its max."""
    weights = np.nan_to_num(np.asarray(weights, "float32"))
    weights = np.maximum(weights, 0.0)
    top = weights.max(axis=-1, keepdims=True)
    codes = np.rint(255.0 * weights / np.where(top > 0, top, 1.0))
    return {
        "data": _b64(codes.astype("uint8")),
        "scale": _b64(top[..., 0].astype("<f4")),
    }


def _matrix_layer(name, weights, **extra):
    """A layer entry for `(H, T, S)` weights."""
    heads, rows, cols = weights.shape
    entry = {"name": name, "heads": heads, "rows": rows, "cols": cols}
    entry.update(_quantised_rows(weights))
    entry.update(extra)
    return entry


def _fit_budget(context, entries):
    """An evenly spaced subset of the layer entries within the byte budget."""
    size = sum(e["heads"] * e["rows"] * (e["cols"] + 4) for e in entries)
    if size * 4 / 3 <= context.max_bytes or len(entries) <= 1:
        return entries
    keep = max(1, int(len(entries) * context.max_bytes / (size * 4 / 3)))
    chosen = np.unique(np.linspace(0, len(entries) - 1, keep).round().astype(int))
    context.notes.append(
        f"{len(chosen)} of the {len(entries)} attention layers are shown "
        f"(evenly spaced) to keep the page under {context.max_bytes / 1e6:.0f} MB."
    )
    return [entries[i] for i in chosen]


def _image_bytes(image):
    """`{"width", "height", "pixels"}`: the image as RGB uint8, scaled to [0, 255]."""
    picture = np.asarray(image, "float32")
    if picture.ndim == 2:
        picture = picture[..., None]
    if picture.shape[-1] == 1:
        picture = np.repeat(picture, 3, axis=-1)
    picture = picture[..., :3]
    low, high = float(picture.min()), float(picture.max())
    if low < 0.0 or high > 1.0:
        picture = (picture - low) / (high - low) if high > low else picture * 0
    pixels = np.rint(np.clip(picture, 0.0, 1.0) * 255).astype("uint8")
    return {
        "height": int(pixels.shape[0]),
        "width": int(pixels.shape[1]),
        "pixels": _b64(pixels),
    }


def _map_bytes(values):
    """A map `(h, w)` scaled to [0, 255] (min to 0) as base64 uint8."""
    values = _grid.normalize_maps(np.asarray(values, "float32")[None])[0]
    return _b64(np.rint(values * 255).astype("uint8"))


def _colormaps():
    from matplotlib import colormaps

    out = {}
    for name in ("viridis", "jet"):
        table = colormaps[name](np.linspace(0, 1, 256))[:, :3]
        out[name] = _b64(np.rint(table * 255).astype("uint8"))
    return out


def _class_name(class_names, k):
    if class_names is not None and 0 <= k < len(class_names):
        return str(class_names[k])
    return f"class {k}"


# Sequences --------------------------------------------------------------------


def _text_inputs(model, inputs, index, tokens, target_tokens):
    """`(inputs, tokens, target_tokens, notes)` for text given to a text model."""
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None:
        raise ValueError(
            "Received text, but the model has no `preprocessor` to turn it "
            "into token ids; pass token ids (B, T). Received: "
            f"inputs={inputs!r}"
        )
    text = inputs if isinstance(inputs, str) else inputs[_check_index(index, len(inputs))]
    notes = []
    if hasattr(model, "translate"):
        # One sentence: eager decoding beats compiling a decoder for it.
        translation = model.translate([text], jit_compile=False)[0]
        source_ids = preprocessor.encode_sources([text])
        with warnings.catch_warnings():  # a translation as long as allowed
            warnings.simplefilter("ignore", UserWarning)
            decoder_inputs, labels = preprocessor.encode_targets([translation])
        generated = [int(i) for i in labels[0] if i != preprocessor.pad_id]
        shown_inputs = [int(i) for i in decoder_inputs[0][: len(generated)]]
        model_inputs = {"source_ids": source_ids, "target_ids": decoder_inputs}
        tokens = tokens or preprocessor.token_strings(source_ids[0], source=True)
        outputs = preprocessor.token_strings(generated, source=False)
        notes.append(
            f"Translation of {text!r}: {translation!r} (greedy). The "
            "decoder's rows are the tokens it writes; where it has "
            "self-attention, its keys are the tokens it reads ([START] first)."
        )
        context_labels = {
            "target_rows": target_tokens or outputs,
            "target_keys": preprocessor.token_strings(shown_inputs, source=False),
            "source_length": int(source_ids.shape[1]),
            "target_length": int(decoder_inputs.shape[1]),
        }
        return model_inputs, tokens, context_labels, notes
    ids = np.asarray(preprocessor([text]))
    if tokens is None and hasattr(preprocessor, "vocabulary"):
        vocabulary = preprocessor.vocabulary
        tokens = [str(vocabulary[i]) for i in ids[0] if i != 0]
    return ids, tokens, target_tokens, notes


def _sequence_payload(context, inputs, index, layers, tokens, target_tokens):
    labels = {}
    if _is_text(inputs):
        inputs, tokens, target_tokens, notes = _text_inputs(
            context.model, inputs, index, tokens, target_tokens
        )
        context.notes.extend(notes)
        if isinstance(target_tokens, dict):
            labels = target_tokens
            target_tokens = labels["target_rows"]
    else:
        inputs = _take(inputs, index)
    weights = context.maps(inputs, layers)
    entries = []
    for name, value in weights.items():
        value = _calls(value)
        if isinstance(value, (tuple, list)):
            context.notes.append(f"{name}: not a token attention; not shown.")
            continue
        value = np.asarray(value)
        if value.ndim == 3:
            value = value[:, None]
        if value.ndim != 4:
            context.notes.append(
                f"{name}: weights of shape {value.shape} are not (B, H, T, S) "
                "token attention; not shown."
            )
            continue
        matrix = value[0]
        rows = _row_labels(matrix.shape[1], tokens, target_tokens, labels)
        cols = _col_labels(matrix.shape[2], tokens, target_tokens, labels)
        rows_kept = min(len(rows), context.max_tokens)
        cols_kept = min(len(cols), context.max_tokens)
        if max(len(rows), len(cols)) > context.max_tokens:
            context.notes.append(
                f"{name}: the first {context.max_tokens} of "
                f"{max(len(rows), len(cols))} tokens are shown."
            )
        matrix = matrix[:, :rows_kept, :cols_kept]
        entries.append(
            _matrix_layer(
                name, matrix, queries=rows[:rows_kept], keys=cols[:cols_kept]
            )
        )
    if not entries:
        raise ValueError(
            "None of the attention layers of the model returns token "
            f"attention (B, H, T, S) for inputs of shape {_shapes(inputs)}; "
            "pass `kind=` ('image', 'graph', 'detection')."
        )
    return {"layers": _fit_budget(context, entries)}


def _row_labels(count, tokens, target_tokens, labels):
    """The query labels of a layer with `count` rows (fewer crop the rows)."""
    if labels:  # a translator: decoder rows are as long as its inputs
        if count == labels["target_length"] != labels["source_length"]:
            return [str(t) for t in labels["target_rows"]]
        return [str(t) for t in tokens]
    if tokens is not None and len(tokens) == count:
        return [str(t) for t in tokens]
    for candidate in (target_tokens, tokens):
        if candidate is not None and len(candidate) <= count:
            return [str(t) for t in candidate]
    return [str(i) for i in range(count)]


def _col_labels(count, tokens, target_tokens, labels):
    """The key labels of a layer with `count` columns."""
    if labels:
        if count == labels["target_length"] != labels["source_length"]:
            return [str(t) for t in labels["target_keys"]]
        return [str(t) for t in tokens]
    for candidate in (tokens, target_tokens):
        if candidate is not None and len(candidate) <= count:
            return [str(t) for t in candidate]
    return [str(i) for i in range(count)]


# Images -----------------------------------------------------------------------


def _image_payload(context, inputs, index, layers, class_names, cam_methods):
    from keras_attention.visualization import cam as cam_lib
    from keras_attention.visualization import rollout as rollout_lib

    image = _one_image(inputs, index)
    weights = context.maps(image, layers)
    size = image.shape[1:3]
    entries, spatial, self_attention = [], [], []
    for name, value in weights.items():
        value = _calls(value)
        if isinstance(value, tuple):  # CBAM: (channel weights, spatial map)
            value = next(
                (np.asarray(v) for v in value if v is not None and np.ndim(v) == 4),
                None,
            )
            if value is None:
                continue
        value = np.asarray(value)
        if value.ndim == 4 and value.shape[-1] == 1 and value.shape[2] != 1:
            spatial.append(
                {"name": name, "rows": value.shape[1], "cols": value.shape[2],
                 "data": _map_bytes(value[0, ..., 0])}
            )
            continue
        if value.ndim == 3:
            value = value[:, None]
        if value.ndim != 4 or value.shape[2] != value.shape[3]:
            context.notes.append(
                f"{name}: weights of shape {value.shape} are not self-attention "
                "over the image; not shown."
            )
            continue
        try:
            (h, w), has_class = _grid.token_grid(value.shape[-1], size)
        except ValueError:
            context.notes.append(
                f"{name}: {value.shape[-1]} tokens do not form a patch grid of "
                "the image; not shown."
            )
            continue
        entries.append(
            _matrix_layer(name, value[0], grid=[h, w], classToken=has_class)
        )
        self_attention.append(value)
    entries = _fit_budget(context, entries)
    payload = {"image": _image_bytes(image[0]), "layers": entries, "spatial": spatial}
    sizes = {v.shape[-1] for v in self_attention}
    if self_attention and len(sizes) == 1:
        rolled = rollout_lib.rollout_matrices(self_attention)  # (1, N, N)
        first = entries[0]
        payload["rollout"] = _matrix_layer(
            "attention rollout (mean of heads, all layers)",
            rolled.astype("float32"), grid=first["grid"],
            classToken=first["classToken"],
        )
    payload.update(_predictions(context, image, class_names))
    cams = []
    if cam_methods and "predicted" in payload:
        for method in cam_methods:
            try:
                values = cam_lib.grad_cam(
                    context.model, image, method=method,
                    max_channels=None if method != "scorecam" else 64,
                )
            except ValueError as error:
                context.notes.append(f"{_CAM_TITLES[method]} not computed: {error}")
                continue
            cams.append(
                {"name": _CAM_TITLES[method], "rows": size[0], "cols": size[1],
                 "data": _map_bytes(values[0])}
            )
        if "scorecam" in cam_methods and cams:
            context.notes.append(
                "Score-CAM uses at most the 64 channels with the largest "
                "spread (Faster Score-CAM)."
            )
    payload["cams"] = cams
    return payload


def _predictions(context, image, class_names):
    """`{"predicted": ..., "probability": ...}` for a classifier, else `{}`."""
    try:
        outputs = context.model(image, training=False)
    except Exception:  # noqa: BLE001 - a model that is no plain classifier
        return {}
    if not keras.ops.is_tensor(outputs) or len(outputs.shape) != 2:
        return {}
    logits = np.asarray(keras.ops.convert_to_numpy(outputs), "float64")[0]
    if logits.min() >= 0 and abs(logits.sum() - 1) < 1e-3:
        probabilities = logits
    else:
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
    k = int(np.argmax(probabilities))
    return {
        "predicted": _class_name(class_names, k),
        "probability": round(float(probabilities[k]), 4),
    }


# Detection --------------------------------------------------------------------


def _one_image(inputs, index):
    """The `index`-th image of a `(B, H, W, C)` batch, as a batch of one."""
    images = np.asarray(inputs)
    if images.ndim != 4:
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected images "
            "(B, height, width, channels). Received: "
            f"inputs.shape={images.shape}"
        )
    index = _check_index(index, len(images))
    return images[index : index + 1].astype("float32")


def _detection_payload(context, inputs, index, class_names, score_threshold):
    image = _one_image(inputs, index)
    model = context.model
    try:
        outputs = model(image, training=False, return_attention_scores=True)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"The model {model.name!r} cannot be called on inputs of shape "
            f"{image.shape}: {error}"
        ) from error
    logits = np.asarray(keras.ops.convert_to_numpy(outputs["logits"]), "float64")[0]
    boxes = np.asarray(keras.ops.convert_to_numpy(outputs["boxes"]), "float32")[0]
    cross = np.asarray(
        keras.ops.convert_to_numpy(outputs["cross_attention"]), "float32"
    )[0]  # H, N, h, w
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    labels = probabilities[:, :-1].argmax(-1)
    scores = probabilities[:, :-1].max(-1)
    height, width = image.shape[1:3]
    centre, extent = boxes[:, :2], boxes[:, 2:]
    corners = np.clip(np.concatenate([centre - extent / 2, centre + extent / 2], -1), 0, 1)
    corners = corners * np.array([width, height, width, height], "float32")
    heads, queries, h, w = cross.shape
    objects = [
        {
            "query": q,
            "box": [round(float(v), 2) for v in corners[q]],
            "label": _class_name(class_names, int(labels[q])),
            "score": round(float(scores[q]), 4),
        }
        for q in np.argsort(-scores, kind="stable").tolist()
    ]
    layer = _matrix_layer(
        "last decoder layer: cross-attention", cross.reshape(heads, queries, h * w),
        grid=[h, w], classToken=False,
    )
    return {
        "image": _image_bytes(image[0]),
        "layers": [layer],
        "objects": objects,
        "threshold": float(score_threshold),
    }


# Graphs -----------------------------------------------------------------------


def _graph_payload(context, inputs, layers, node_labels):
    import networkx as nx

    from keras_attention.layers import GraphAttention

    if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected "
            "[features (N, F) or (1, N, F), edges (2, E) or (1, 2, E)] for a "
            f"graph model. Received: inputs of shape {_shapes(inputs)}"
        )
    features, edges = (np.asarray(x) for x in inputs)
    flat_edges = edges.reshape(edges.shape[-2:]) if edges.ndim == 3 else edges
    if flat_edges.ndim != 2 or flat_edges.shape[0] != 2 or edges.ndim not in (2, 3):
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected edges "
            f"(2, E) or (1, 2, E). Received: edges.shape={edges.shape}"
        )
    num_nodes = features.shape[-2]
    graph_layers = {
        path for path, layer in maps_lib.attention_layers(context.model).items()
        if isinstance(layer, GraphAttention)
    }
    weights = context.maps(list(inputs), layers)
    flat_edges = flat_edges.astype("int64")
    coefficient_sets = []
    for name, value in weights.items():
        value = _calls(value)
        if name not in graph_layers or isinstance(value, tuple):
            continue
        value = np.asarray(value, "float32")
        if value.ndim == 3 and value.shape[0] == 1:
            value = value[0]
        if value.ndim == 1:
            value = value[:, None]
        if value.ndim != 2 or value.shape[0] not in (
            flat_edges.shape[1], flat_edges.shape[1] + num_nodes
        ):
            context.notes.append(
                f"{name}: coefficients of shape {value.shape} are not one per "
                "edge; not shown."
            )
            continue
        coefficient_sets.append((name, value))
    if not coefficient_sets:
        raise ValueError(
            "The model's GraphAttention layers returned no per-edge "
            "coefficients for these inputs; explore graphs given as an edge "
            f"list. Received: inputs of shape {_shapes(inputs)}"
        )
    all_edges = flat_edges
    if coefficient_sets[0][1].shape[0] == flat_edges.shape[1] + num_nodes:
        loops = np.arange(num_nodes)
        all_edges = np.concatenate([flat_edges, np.stack([loops, loops])], axis=1)
    # Keep at most max_nodes nodes: breadth first from node 0.
    keep_nodes = np.arange(num_nodes)
    if num_nodes > context.max_nodes:
        graph = nx.Graph()
        graph.add_nodes_from(range(num_nodes))
        graph.add_edges_from(flat_edges.T.tolist())
        order, seen = [], set()
        for start in range(num_nodes):  # node 0's component first
            if len(order) >= context.max_nodes:
                break
            if start in seen:
                continue
            for node in nx.bfs_tree(graph, start):
                seen.add(node)
                order.append(node)
        keep_nodes = np.array(sorted(order[: context.max_nodes]))
        context.notes.append(
            f"The {context.max_nodes} nodes nearest node 0 (breadth first) of "
            f"the {num_nodes} are shown, with the edges between them."
        )
    position_of = -np.ones(num_nodes, "int64")
    position_of[keep_nodes] = np.arange(len(keep_nodes))
    inside = (position_of[all_edges[0]] >= 0) & (position_of[all_edges[1]] >= 0)
    kept_edges = position_of[all_edges[:, inside]]
    graph = nx.Graph()
    graph.add_nodes_from(range(len(keep_nodes)))
    graph.add_edges_from(
        (int(a), int(b)) for a, b in kept_edges.T.tolist() if a != b
    )
    layout = nx.spring_layout(graph, seed=0)
    xy = np.array([layout[i] for i in range(len(keep_nodes))], "float32")
    xy = (xy - xy.min(0)) / np.maximum(xy.max(0) - xy.min(0), 1e-6)
    entries = []
    for name, value in coefficient_sets:
        value = value[inside]
        entries.append(
            {
                "name": name,
                "heads": int(value.shape[1]),
                "data": _b64(np.rint(np.clip(value, 0, 1) * 255).astype("uint8")),
            }
        )
    payload = {
        "nodes": {
            "ids": keep_nodes.tolist(),
            "x": np.round(xy[:, 0], 4).tolist(),
            "y": np.round(xy[:, 1], 4).tolist(),
        },
        "edges": {"source": kept_edges[0].tolist(), "target": kept_edges[1].tolist()},
        "layers": entries,
    }
    if node_labels is not None:
        node_labels = np.asarray(node_labels).reshape(-1)
        if len(node_labels) != num_nodes:
            raise ValueError(
                "Received an invalid value for argument `node_labels`, "
                f"expected one label per node ({num_nodes}). Received: "
                f"{len(node_labels)} labels"
            )
        payload["nodes"]["label"] = node_labels[keep_nodes].astype(int).tolist()
    try:
        outputs = context.model(list(inputs), training=False)
        outputs = np.asarray(keras.ops.convert_to_numpy(outputs))
        if outputs.ndim == 3:
            outputs = outputs[0]
        if outputs.ndim == 2 and len(outputs) == num_nodes:
            payload["nodes"]["predicted"] = outputs.argmax(-1)[keep_nodes].tolist()
    except Exception:  # noqa: BLE001 - predictions are extra
        pass
    return payload


# The page ---------------------------------------------------------------------


def render_page(payload):
    """The HTML text of the explorer for a payload (see `explore`)."""
    from keras_attention.visualization import _explorer_page

    data = json.dumps(payload, separators=(",", ":"))
    data = data.replace("</", "<\\/").replace("<!--", "<\\!--")
    return (
        _explorer_page.PAGE.replace("__TITLE__", html.escape(payload["title"]))
        .replace("__STYLE__", _explorer_page.STYLE)
        .replace("__SCRIPT__", _explorer_page.SCRIPT)
        .replace("__DATA__", data)
    )
