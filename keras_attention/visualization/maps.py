"""The attention weights of every attention layer of any Keras model."""

import contextlib

import keras
import numpy as np

from keras_attention import registry
from keras_attention._validation import is_symbolic
from keras_attention.visualization import _hooks


def attention_classes():
    """The tuple of every registered attention layer class, plugins included."""
    return tuple(registry.get_class(name) for name in registry.names())


def attention_layers(model):
    """Every registry attention layer in `model`, keyed by its path.

    The walk goes into nested models and into any custom layer (an encoder
    block, a residual stage), but not inside an attention layer (a `CBAM`'s
    own `ChannelAttention` and `SpatialAttention` are reported by the
    `CBAM`, which returns both maps).

    Args:
        model: a `keras.Model` or `keras.layers.Layer`.

    Returns:
        A dict `{path: layer}` in the order the layers are tracked; the path
        joins layer names with `/` (`"backbone/block_0/attention"`).

    Example:

    ```python
    model = keras.Sequential([
        keras.Input((6, 8)),
        keras_attention.layers.MultiHeadAttention(2, 4, name="mha"),
    ])
    list(attention_layers(model))  # ["mha"]
    ```
    """
    classes = attention_classes()
    is_attention = lambda layer: isinstance(layer, classes)  # noqa: E731
    found = {
        path: layer
        for path, layer in _hooks.walk(model, stop=is_attention)
        if is_attention(layer)
    }
    if is_attention(model):  # a bare attention layer
        found = {model.name: model}
    return found


@contextlib.contextmanager
def capture_attention(model, layers=None):
    """Records the attention scores of `model`'s attention layers.

    Inside the block, each attention layer is called with
    `return_attention_scores=True`; it records the scores and gives its
    caller only the output (or the pair, if the caller asked for the scores
    itself), so the model runs as usual. Leaving the block restores the
    layers.

    Args:
        model: any Keras model or layer.
        layers: optional paths or names of the layers to record (default:
            every attention layer that can return scores).

    Yields:
        A dict `{path: [scores of each call, ...]}`, filled as the model
        runs, in the order of the first calls; scores stay tensors.

    Example:

    ```python
    with capture_attention(model) as records:
        model(inputs)
    ```
    """
    found = attention_layers(model)
    if layers is not None:
        found = _select(found, layers)
    records = {}

    def make(path):
        def factory(original):
            def call(*args, **kwargs):
                asked = bool(kwargs.get("return_attention_scores", False))
                kwargs["return_attention_scores"] = True
                outputs, scores = original(*args, **kwargs)
                if not _is_symbolic_structure(scores):
                    records.setdefault(path, []).append(scores)
                return (outputs, scores) if asked else outputs

            return call

        return factory

    replacements = [
        (layer, make(path))
        for path, layer in found.items()
        if registry.call_accepts(layer, "return_attention_scores", var_keyword=True)
    ]
    with _hooks.patched_calls(replacements):
        yield records


def attention_maps(model, inputs, layers=None, training=False, **call_kwargs):
    """The attention weights of every attention layer for `inputs`.

    Runs `model(inputs, training=training)` once, eagerly, with every
    registry attention layer asked for its scores (see
    `capture_attention`): no change to the model and no rewriting it as a
    multi-output model. Works for `Sequential`, functional, nested and
    subclassed models (the applications) alike.

    What each layer gives is what its `return_attention_scores=True`
    returns: `(B, H, T, S)` for `MultiHeadAttention`, `(B, T, S)` for
    `AdditiveAttention` and `ScaledDotProductAttention`, the pair
    `(channel weights (B, C), spatial map (B, h, w, 1))` for `CBAM`,
    `(B, nW, H, T, T)` per window for `LocalWindowAttention`, per-edge
    coefficients `(E', H)` (or `(B, H, N, N)` for an adjacency) for
    `GraphAttention`.

    Args:
        model: a Keras model (or layer) containing registry attention layers.
        inputs: what `model` is called on (an array, a list, a dict).
        layers: optional list of paths or names; default all.
        training: passed to the model call.
        **call_kwargs: other arguments of the model call.

    Returns:
        A dict `{path: weights}` in call order, NumPy arrays (tuples of
        them where a layer returns several maps). A layer called more than
        once in the pass (a shared layer, a decoder loop) gives the list of
        its weights, one per call.

    Example:

    ```python
    model = keras.Sequential([
        keras.Input((6, 8)),
        keras_attention.layers.MultiHeadAttention(2, 4, name="mha_1"),
        keras_attention.layers.MultiHeadAttention(2, 4, name="mha_2"),
    ])
    maps = attention_maps(model, np.ones((3, 6, 8)))
    maps["mha_2"].shape  # (3, 2, 6, 6)
    ```
    """
    _hooks.ensure_built(model, inputs, training=training, **call_kwargs)
    with capture_attention(model, layers=layers) as records:
        model(inputs, training=training, **call_kwargs)
    if not records and not attention_layers(model):
        raise ValueError(
            "Received a model with no attention layer of the registry "
            f"(known: {', '.join(registry.names())}). Received: "
            f"model={getattr(model, 'name', model)!r}"
        )
    maps = {}
    for path, calls in records.items():
        calls = [keras.tree.map_structure(_to_numpy, c) for c in calls]
        maps[path] = calls[0] if len(calls) == 1 else calls
    return maps


def _to_numpy(x):
    return None if x is None else np.asarray(keras.ops.convert_to_numpy(x))


def _is_symbolic_structure(structure):
    return any(
        is_symbolic(x)
        for x in keras.tree.flatten(structure)
        if x is not None
    )


def _select(found, wanted):
    """The entries of `found` whose path or last name is in `wanted`."""
    if isinstance(wanted, str):
        wanted = [wanted]
    selected = {}
    for key in wanted:
        matches = [
            path
            for path in found
            if path == key or path.rsplit("/", 1)[-1] == key
        ]
        if not matches:
            raise ValueError(
                "Received an invalid value for argument `layers`, expected "
                f"paths or names of attention layers ({', '.join(found)}). "
                f"Received: layers={wanted!r}"
            )
        for path in matches:
            selected[path] = found[path]
    return selected
