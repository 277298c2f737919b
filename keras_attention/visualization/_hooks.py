"""Walking a model's layer tree and patching a layer's `call` for one pass.

Keras 3 looks `self.call` up on every `Layer.__call__`, so an instance
attribute named `call` replaces the method for that one layer object (in a
`Sequential`, a functional model, a nested model or a subclassed one) until
it is deleted again. Nothing here changes a class or a saved model.
"""

import contextlib
import functools

import keras


def child_layers(layer):
    """The direct sublayers of `layer`, in the order Keras tracks them."""
    children = getattr(layer, "_layers", None) or []
    return [child for child in children if isinstance(child, keras.layers.Layer)]


def walk(model, stop=None):
    """`(path, layer)` for every layer under `model`, depth first.

    Paths join the layer names with `/`, from the child of `model` down
    (`"backbone/block_0/attention"`). A layer reachable along two paths is
    listed once, under the first. The walk does not go below a layer for
    which `stop(layer)` is true.
    """
    seen = {id(model)}
    result = []

    def visit(layer, prefix):
        for child in child_layers(layer):
            if id(child) in seen or isinstance(child, keras.layers.InputLayer):
                continue
            seen.add(id(child))
            path = f"{prefix}/{child.name}" if prefix else child.name
            result.append((path, child))
            if stop is None or not stop(child):
                visit(child, path)

    visit(model, "")
    return result


def ensure_built(model, inputs, **call_kwargs):
    """Run `model` once if it or a sublayer is not built yet.

    Subclassed models (and layers) often create their sublayers in `build`,
    on the first call; only then can they be found and patched.
    """
    if getattr(model, "built", True) and all(
        getattr(layer, "built", True) for _, layer in walk(model)
    ):
        return
    model(inputs, **call_kwargs)


@contextlib.contextmanager
def patched_calls(replacements):
    """Replace `layer.call` by `make(original)` for each `(layer, make)` pair.

    The replacement keeps the original's signature (`functools.wraps`), so
    Keras still passes `training` and `mask` as before. The original methods
    come back when the block ends, also after an exception.
    """
    patched = []
    try:
        for layer, make in replacements:
            had_own = "call" in layer.__dict__
            original = layer.call
            wrapper = functools.wraps(original)(make(original))
            object.__setattr__(layer, "call", wrapper)
            patched.append((layer, had_own, original))
        yield
    finally:
        for layer, had_own, original in reversed(patched):
            if had_own:
                object.__setattr__(layer, "call", original)
            else:
                object.__delattr__(layer, "call")

