"""The explorer's sequence, image and detection views: their payloads."""

import warnings

import keras
import numpy as np

from keras_attention.visualization import _explorer_data as data
from keras_attention.visualization import maps as maps_lib
from keras_attention.visualization import _grid

CAM_TITLES = {"gradcam": "Grad-CAM", "gradcam++": "Grad-CAM++", "scorecam": "Score-CAM"}


def text_inputs(model, inputs, index, tokens, target_tokens):
    """`(inputs, tokens, target_tokens, notes)` for text given to a text model."""
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None:
        raise ValueError(
            "Received text, but the model has no `preprocessor` to turn it "
            "into token ids; pass token ids (B, T). Received: "
            f"inputs={inputs!r}"
        )
    # One string is a batch of one: `index` 0.
    batch = [inputs] if isinstance(inputs, str) else inputs
    text = batch[data.check_index(index, len(batch))]
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
    if not callable(preprocessor) and hasattr(preprocessor, "encode"):
        # A causal LM's characters: the ids of the text itself, no padding.
        ids = np.asarray(preprocessor.encode(text), "int32")[None]
        tokens = tokens or [preprocessor.decode(ids[0, i:i + 1]) for i in range(ids.shape[1])]
        return ids, tokens, target_tokens, notes
    ids = preprocessor([text])
    first = np.asarray(ids["token_ids"] if isinstance(ids, dict) else ids)
    if tokens is None and hasattr(preprocessor, "vocabulary"):
        vocabulary = preprocessor.vocabulary
        tokens = [str(vocabulary[i]) for i in first[0] if i != 0]
    return with_mask_positions(model, ids), tokens, target_tokens, notes


def with_mask_positions(model, ids):
    """`ids` as a masked language model takes them: a dict with
    `"mask_positions"` (all 0: the attention does not depend on which
    positions its head predicts); other models' ids as they are."""
    length = getattr(model, "mask_length", None)
    if length is None or not isinstance(getattr(model, "input", None), dict):
        return np.asarray(ids) if not isinstance(ids, dict) else ids
    ids = dict(ids) if isinstance(ids, dict) else {"token_ids": ids}
    batch = np.asarray(ids["token_ids"]).shape[0]
    return {**ids, "mask_positions": np.zeros((batch, length), "int32")}


def sequence_payload(context, inputs, index, layers, tokens, target_tokens):
    labels = {}
    if data.is_text(inputs):
        inputs, tokens, target_tokens, notes = text_inputs(
            context.model, inputs, index, tokens, target_tokens
        )
        context.notes.extend(notes)
        if isinstance(target_tokens, dict):
            labels = target_tokens
            target_tokens = labels["target_rows"]
    else:
        inputs = data.take(inputs, index)
    weights = context.maps(inputs, layers)
    if labels:
        labels["sides"] = decoder_sides(context, inputs, layers, weights)
    entries, longest = [], 0
    for name, value in data.each_call(weights):
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
        longest = max(longest, *matrix.shape[1:])
        side = labels.get("sides", {}).get(name) if labels else None
        rows = row_labels(matrix.shape[1], tokens, target_tokens, labels, side)
        cols = col_labels(matrix.shape[2], tokens, target_tokens, labels, side)
        rows_kept = min(len(rows), context.max_tokens)
        cols_kept = min(len(cols), context.max_tokens)
        if max(len(rows), len(cols)) > context.max_tokens:
            context.notes.append(
                f"{name}: the first {context.max_tokens} of "
                f"{max(len(rows), len(cols))} tokens are shown."
            )
        matrix = matrix[:, :rows_kept, :cols_kept]
        entries.append(
            data.matrix_layer(
                name, matrix, queries=rows[:rows_kept], keys=cols[:cols_kept]
            )
        )
    if not entries:
        raise ValueError(
            "None of the attention layers of the model returns token "
            f"attention (B, H, T, S) for inputs of shape {data.shapes(inputs)}; "
            "pass `kind=` ('image', 'graph', 'detection')."
        )
    for argument, given in (("tokens", tokens), ("target_tokens", target_tokens)):
        if given is not None and len(given) > longest:
            raise ValueError(
                f"Received an invalid value for argument `{argument}`, "
                f"expected at most {longest} labels (the longest token axis "
                f"of the attention layers). Received: {len(given)} labels"
            )
    return {"layers": data.fit_budget(context, entries)}


def decoder_sides(context, inputs, layers, weights):
    """A translator's `{layer: (rows, keys)}`, each true where that axis is
    the decoder's: the axes that shrink in a second pass with one decoder
    position fewer (shapes alone cannot tell when the source and target
    lengths are equal)."""
    target = np.asarray(inputs["target_ids"])
    if target.shape[1] < 2:
        return {}
    try:
        shorter = context.maps({**inputs, "target_ids": target[:, :-1]}, layers)
    except ValueError:  # a decoder of one fixed length: shapes decide
        return {}
    sides = {}
    for name, value in weights.items():
        full, short = data.calls(value), data.calls(shorter.get(name))
        if isinstance(full, (tuple, list)) or isinstance(short, (tuple, list)):
            continue
        full, short = np.shape(full), np.shape(short)
        if len(full) == len(short) >= 3:
            sides[name] = (full[-2] != short[-2], full[-1] != short[-1])
    return sides


def row_labels(count, tokens, target_tokens, labels, side=None):
    """The query labels of a layer with `count` rows (fewer crop the rows);
    `side`: a translator layer's `decoder_sides` entry."""
    if labels:  # a translator: decoder rows are as long as its inputs
        if side is not None:
            return [str(t) for t in (labels["target_rows"] if side[0] else tokens)]
        if count == labels["target_length"] != labels["source_length"]:
            return [str(t) for t in labels["target_rows"]]
        return [str(t) for t in tokens]
    if tokens is not None and len(tokens) == count:
        return [str(t) for t in tokens]
    for candidate in (target_tokens, tokens):
        if candidate is not None and len(candidate) <= count:
            return [str(t) for t in candidate]
    return [str(i) for i in range(count)]


def col_labels(count, tokens, target_tokens, labels, side=None):
    """The key labels of a layer with `count` columns."""
    if labels:
        if side is not None:
            return [str(t) for t in (labels["target_keys"] if side[1] else tokens)]
        if count == labels["target_length"] != labels["source_length"]:
            return [str(t) for t in labels["target_keys"]]
        return [str(t) for t in tokens]
    for candidate in (tokens, target_tokens):
        if candidate is not None and len(candidate) <= count:
            return [str(t) for t in candidate]
    return [str(i) for i in range(count)]


def image_payload(context, inputs, index, layers, class_names, cam_methods):
    from keras_attention.visualization import cam as cam_lib
    from keras_attention.visualization import rollout as rollout_lib

    image = data.one_image(inputs, index)
    weights = context.maps(image, layers)
    size = image.shape[1:3]
    grids = _grid.model_grids(context.model)  # the model's own patch grids
    entries, spatial, self_attention = [], [], []
    windowed = False
    for name, value in data.each_call(weights):
        if isinstance(value, tuple):  # CBAM: (channel weights, spatial map)
            value = next(
                (np.asarray(v) for v in value if v is not None and np.ndim(v) == 4),
                None,
            )
            if value is None:
                continue
        value = np.asarray(value)
        if value.ndim == 5:  # LocalWindowAttention: (B, nW, H, T, T)
            windowed = True
            value = windows_on_grid(context, name, value)
            if value is None:
                continue
        if value.ndim == 4 and value.shape[-1] == 1 and value.shape[2] != 1:
            spatial.append(
                {"name": name, "rows": value.shape[1], "cols": value.shape[2],
                 "data": data.map_bytes(value[0, ..., 0])}
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
            (h, w), has_class = _grid.token_grid(
                value.shape[-1], size, known_grids=grids
            )
        except ValueError:
            context.notes.append(
                f"{name}: {value.shape[-1]} tokens do not form a patch grid of "
                "the image; not shown."
            )
            continue
        entries.append(
            data.matrix_layer(name, value[0], grid=[h, w], classToken=has_class)
        )
        self_attention.append(value)
    entries = data.fit_budget(context, entries)
    payload = {"image": data.image_bytes(image[0]), "layers": entries, "spatial": spatial}
    sizes = {v.shape[-1] for v in self_attention}
    # As `attention_rollout`: none through window attention (its maps
    # zero outside each window, not a flow between all patches).
    if self_attention and len(sizes) == 1 and not windowed:
        rolled = rollout_lib.rollout_matrices(self_attention)  # (1, N, N)
        first = entries[0]
        through = "all layers" if layers is None else (
            f"the {len(self_attention)} chosen layer"
            + "s" * (len(self_attention) > 1)
        )
        payload["rollout"] = data.matrix_layer(
            f"attention rollout (mean of heads, {through})",
            rolled.astype("float32"), grid=first["grid"],
            classToken=first["classToken"], through=through,
        )
    payload.update(predictions(context, image, class_names))
    cams = []
    if cam_methods and "predicted" in payload:
        for method in cam_methods:
            try:
                values = cam_lib.grad_cam(
                    context.model, image, method=method,
                    max_channels=None if method != "scorecam" else 64,
                )
            except ValueError as error:
                context.notes.append(f"{CAM_TITLES[method]} not computed: {error}")
                continue
            cams.append(
                {"name": CAM_TITLES[method], "rows": size[0], "cols": size[1],
                 "data": data.map_bytes(values[0])}
            )
        if any(c["name"] == CAM_TITLES["scorecam"] for c in cams):
            context.notes.append(
                "Score-CAM uses at most the 64 channels with the largest "
                "spread (Faster Score-CAM)."
            )
    payload["cams"] = cams
    return payload


def windows_on_grid(context, name, value):
    """A window attention's maps over its input's grid `(B, H, N, N)`
    (`maps.window_attention_on_grid`), or `None` with a note."""
    layer = maps_lib.attention_layers(context.model).get(name)
    shape = getattr(layer, "_build_shapes_dict", None) or {}
    shape = next(iter(shape.values()), None) or (None,) * 3
    size = tuple(shape[1:3])
    if None in size or not hasattr(layer, "shift_size"):
        context.notes.append(
            f"{name}: window attention of shape {value.shape} on an input of "
            "unknown height and width; not shown."
        )
        return None
    if not any("outside its window" in note for note in context.notes):
        context.notes.append(
            "Window attention (Swin) is shown over the whole patch grid: a "
            "patch attends only inside its window (for a shifted layer, the "
            "window it fell in after the cyclic shift), zero outside its window."
        )
    return maps_lib.window_attention_on_grid(
        value, *size, layer.window_size, layer.shift_size
    )


def predictions(context, image, class_names):
    """`{"predicted": ..., "probability": ...}` for a classifier, else `{}`."""
    try:
        outputs = context.model(image, training=False)
    except Exception:  # noqa: BLE001 - a model that is no plain classifier
        return {}
    if not keras.ops.is_tensor(outputs) or len(outputs.shape) != 2:
        return {}
    logits = np.asarray(keras.ops.convert_to_numpy(outputs), "float64")[0]
    if len(logits) == 1:  # one output: class 1's probability (sigmoid)
        p = logits[0] if 0 <= logits[0] <= 1 else 1 / (1 + np.exp(-logits[0]))
        probabilities = np.array([1 - p, p])
    elif logits.min() >= 0 and abs(logits.sum() - 1) < 1e-3:
        probabilities = logits
    else:
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
    k = int(np.argmax(probabilities))
    return {
        "predicted": data.class_name(class_names, k),
        "probability": round(float(probabilities[k]), 4),
    }


def detection_payload(context, inputs, index, class_names, score_threshold,
                      pixel_mask=None):
    from keras_attention.applications.detection_layers import image_sizes

    image = data.one_image(inputs, index)
    model = context.model
    mask, sizes = image_sizes(pixel_mask, np.asarray(inputs))
    index = int(index)  # checked by one_image
    extra = {} if mask is None else {"pixel_mask": mask[index : index + 1]}
    try:
        outputs = model(image, training=False, return_attention_scores=True,
                        **extra)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"The model {model.name!r} cannot be called on inputs of shape "
            f"{image.shape}: {data.brief(error)}"
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
    # Boxes are relative to the image without its padding (top left).
    height, width = image.shape[1:3] if sizes is None else sizes[index]
    centre, extent = boxes[:, :2], boxes[:, 2:]
    corners = np.clip(np.concatenate([centre - extent / 2, centre + extent / 2], -1), 0, 1)
    corners = corners * np.array([width, height, width, height], "float32")
    heads, queries, h, w = cross.shape
    objects = [
        {
            "query": q,
            "box": [round(float(v), 2) for v in corners[q]],
            "label": data.class_name(class_names, int(labels[q])),
            "score": round(float(scores[q]), 4),
        }
        for q in np.argsort(-scores, kind="stable").tolist()
    ]
    layer = data.matrix_layer(
        "last decoder layer: cross-attention", cross.reshape(heads, queries, h * w),
        grid=[h, w], classToken=False,
    )
    return {
        "image": data.image_bytes(image[0]),
        "layers": [layer],
        "objects": objects,
        "threshold": float(score_threshold),
    }
