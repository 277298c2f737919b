"""The explorer's data: one pass of the model, the layers picked, and the
packing of weights, images and maps into the page (quantised, base64)."""

import base64
import collections

import keras
import numpy as np

from keras_attention.visualization import _grid
from keras_attention.visualization import maps as maps_lib


def shapes(inputs):
    return keras.tree.map_structure(lambda x: tuple(np.shape(x)), inputs)


def check_index(index, count):
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


class Context:
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
                f"shape {shapes(inputs)}: {brief(error)}"
            ) from error
        except Exception as error:  # backend errors (InvalidArgumentError)
            if type(error).__module__.startswith(("tensorflow", "jax", "torch")):
                raise ValueError(
                    f"The model {self.model.name!r} cannot be called on "
                    f"inputs of shape {shapes(inputs)}: {brief(error)}"
                ) from error
            raise
        return pick_layers(weights, layers)


def pick_layers(weights, layers):
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


def brief(error, limit=600):
    """An error's own message without the call's arguments, which Keras
    appends (whole input arrays), cut to `limit` characters."""
    text = str(error).split("Arguments received by")[0].strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def is_text(inputs):
    return isinstance(inputs, str) or (
        isinstance(inputs, (list, tuple))
        and bool(inputs)
        and all(isinstance(t, str) for t in inputs)
    )


def take(inputs, index):
    """Example `index` of a batch (arrays, lists or dicts of arrays)."""
    counts = {len(x) for x in keras.tree.flatten(inputs) if np.ndim(x) > 0}
    if len(counts) != 1:
        raise ValueError(
            "Received inputs whose parts have different batch sizes "
            f"{sorted(counts)} or no batch axis. Received: inputs of shape "
            f"{shapes(inputs)}"
        )
    index = check_index(index, counts.pop())
    return keras.tree.map_structure(
        lambda x: np.asarray(x)[index : index + 1], inputs
    )


def calls(value):
    """A layer's weights as one array: a list of one-query calls joined."""
    if not isinstance(value, list):
        return value
    arrays = [np.asarray(v) for v in value if not isinstance(v, tuple)]
    if arrays and all(a.ndim in (3, 4) and a.shape[-2] == 1 for a in arrays):
        return np.concatenate(arrays, axis=-2)  # one decoding step per call
    return value[0]


def each_call(weights):
    """`(name, weights)` of every call of every layer: the calls of a layer
    called more than once (shared, as a model reusing one attention layer)
    each their own entry, `"name (call k)"` from the second on (only the
    first was shown); one-query decoding calls joined as by `calls`."""
    for name, value in weights.items():
        joined = calls(value)
        if isinstance(value, list) and len(value) > 1 and joined is value[0]:
            for k, call in enumerate(value):
                yield (name if k == 0 else f"{name} (call {k + 1})"), call
        else:
            yield name, joined


def b64(array):
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def quantised_rows(weights):
    """`{"data", "scale"}` of `(..., S)` rows: uint8 of each row over its max."""
    weights = np.nan_to_num(np.asarray(weights, "float32"))
    weights = np.maximum(weights, 0.0)
    top = weights.max(axis=-1, keepdims=True)
    codes = np.rint(255.0 * weights / np.where(top > 0, top, 1.0))
    return {
        "data": b64(codes.astype("uint8")),
        "scale": b64(top[..., 0].astype("<f4")),
    }


def matrix_layer(name, weights, **extra):
    """A layer entry for `(H, T, S)` weights; `"below_zero"`, the lowest
    weight, where some are negative, and `"not_finite"`, how many are NaN
    or infinite (both shown as 0: `weight_notes`)."""
    heads, rows, cols = weights.shape
    entry = {"name": name, "heads": heads, "rows": rows, "cols": cols}
    entry.update(quantised_rows(weights))
    finite = np.isfinite(weights)
    lowest = float(np.min(weights, where=finite, initial=0.0))
    if lowest < 0:
        entry["below_zero"] = lowest
    if not finite.all():
        entry["not_finite"] = int(np.size(weights) - finite.sum())
    entry.update(extra)
    return entry


def weight_notes(payload):
    """A note per layer of `payload` whose weights go below 0 (the
    non-local block's `"dot"` mode: dot products over N, no softmax): the
    page draws weights from 0, so those read as 0 there; and one per layer
    with NaN or infinite weights (a NaN input), also drawn as 0."""
    notes = []
    for entry in payload.get("layers", []):
        if isinstance(entry, dict) and "below_zero" in entry:
            notes.append(
                f"{entry['name']}: some weights are negative (down to "
                f"{entry['below_zero']:.3g}); the page shows them as 0."
            )
        if isinstance(entry, dict) and "not_finite" in entry:
            notes.append(
                f"{entry['name']}: {entry['not_finite']} weights are NaN or "
                "infinite (the input or the model gave them); the page "
                "shows them as 0."
            )
    return notes


def fit_budget(context, entries):
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


def image_bytes(image):
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
        "pixels": b64(pixels),
    }


def map_bytes(values):
    """A map `(h, w)` scaled to [0, 255] (min to 0) as base64 uint8."""
    values = _grid.normalize_maps(np.asarray(values, "float32")[None])[0]
    return b64(np.rint(values * 255).astype("uint8"))


def colormaps():
    from matplotlib import colormaps

    out = {}
    for name in ("viridis", "jet"):
        table = colormaps[name](np.linspace(0, 1, 256))[:, :3]
        out[name] = b64(np.rint(table * 255).astype("uint8"))
    return out


def class_name(class_names, k):
    if class_names is not None and 0 <= k < len(class_names):
        return str(class_names[k])
    return f"class {k}"


def one_image(inputs, index):
    """The `index`-th image of a `(B, H, W, C)` batch, as a batch of one."""
    try:
        images = np.asarray(inputs)
    except ValueError:  # arrays of several shapes (a graph's)
        images = np.empty(0)
    if images.ndim != 4:
        raise ValueError(
            "Received an invalid value for argument `inputs`, expected images "
            "(B, height, width, channels). Received: "
            f"inputs of shape {shapes(inputs)}"
        )
    index = check_index(index, len(images))
    return images[index : index + 1].astype("float32")
