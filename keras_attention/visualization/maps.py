"""The attention weights of every attention layer of any Keras model."""

import contextlib

import keras
import numpy as np

from keras_attention import registry
from keras_attention._validation import is_symbolic
from keras_attention.visualization import _hooks
from keras_attention.visualization._grid import as_numpy


def attention_classes():
    """The tuple of every registered attention layer class, plugins included."""
    return registry.classes()


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
    layers. Only eager calls are recorded: call the model directly, as in
    the example; inside `model.predict`, a `tf.function` or `jax.jit` the
    scores are traced values, not recorded (`attention_maps` runs the
    model eagerly for you).

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
        calls = [keras.tree.map_structure(as_numpy, c) for c in calls]
        maps[path] = calls[0] if len(calls) == 1 else calls
    return maps


def window_attention_on_grid(weights, height, width, window_size, shift_size=0):
    """`LocalWindowAttention`'s per-window maps as attention over the grid.

    The layer returns `(B, nW, H, T, T)`: for each window of its (padded,
    cyclically shifted) input, `T = window**2` queries over the same `T`
    keys. This lays them out over the `height x width` grid of the input
    itself, row-major: entry `(b, h, i, j)` is what token `i` gives token
    `j`, zero where `j` is outside `i`'s window. Weights on the padding
    tokens (not positions of the input) are dropped, so those rows sum to
    less than 1.

    Args:
        weights: `(B, nW, H, T, T)` from the layer with
            `return_attention_scores=True`.
        height, width: the spatial size of the layer's input.
        window_size, shift_size: the layer's (`layer.window_size`,
            `layer.shift_size`).

    Returns:
        A NumPy array `(B, H, height * width, height * width)`.

    Example:

    ```python
    layer = keras_attention.layers.LocalWindowAttention(
        num_heads=2, window_size=4, shift_size=2
    )
    _, weights = layer(np.ones((1, 8, 8, 16)), return_attention_scores=True)
    grid = window_attention_on_grid(weights, 8, 8, 4, 2)
    grid.shape  # (1, 2, 64, 64)
    ```
    """
    from keras_attention.layers.local_window import window_geometry

    weights = as_numpy(weights)
    window, shift, hp, wp = window_geometry(height, width, window_size, shift_size)
    count, t = (hp // window) * (wp // window), window * window
    if weights.ndim != 5 or weights.shape[1] != count or weights.shape[3:] != (t, t):
        raise ValueError(
            "Received an invalid value for argument `weights`, expected "
            f"(batch, {count}, heads, {t}, {t}): the windows of a {height} x "
            f"{width} input with window_size={window_size}, "
            f"shift_size={shift_size}. Received: weights.shape={weights.shape}"
        )
    # Where each token of each window came from (-1: padding), undoing the
    # layer's pad, roll by -shift and row-major partition.
    ids = np.full((hp, wp), -1)
    ids[:height, :width] = np.arange(height * width).reshape(height, width)
    ids = np.roll(ids, (-shift, -shift), axis=(0, 1))
    ids = ids.reshape(hp // window, window, wp // window, window)
    ids = ids.transpose(0, 2, 1, 3).reshape(count, t)
    pairs = np.nonzero((ids[:, :, None] >= 0) & (ids[:, None, :] >= 0))
    where, query, key = pairs
    size = height * width
    grid = np.zeros(weights.shape[:1] + weights.shape[2:3] + (size, size), weights.dtype)
    picked = weights[:, where, :, query, key]  # (P, B, H)
    grid[:, :, ids[where, query], ids[where, key]] = np.moveaxis(picked, 0, -1)
    return grid


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
