"""Walking a model's layer tree and patching a layer's `call` for one pass.

Keras 3 looks `self.call` up on every `Layer.__call__`, so an instance
attribute named `call` replaces the method for that one layer object (in a
`Sequential`, a functional model, a nested model or a subclassed one) until
it is deleted again. Nothing here changes a class or a saved model.
A patch holds for the thread whose block made it (`patched_calls`).
"""

import contextlib
import functools
import threading

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


# Guards every layer's `_PATCHES` entry: blocks enter and leave from
# several threads.
_LOCK = threading.Lock()
# id(layer) -> (layer, had_own, original, {thread id: [wrapper, ...]}): the
# layers whose `call` is our dispatcher now.
_PATCHES = {}


def _dispatcher(layer, original):
    """The `call` a patched layer gets: the innermost replacement of the
    calling thread's blocks, else the original (another thread's call,
    or a function another thread traces meanwhile, is not recorded)."""

    @functools.wraps(original)
    def call(*args, **kwargs):
        entry = _PATCHES.get(id(layer))
        stack = entry[3].get(threading.get_ident()) if entry else None
        return (stack[-1] if stack else original)(*args, **kwargs)

    return call


def _push(layer, make):
    with _LOCK:
        entry = _PATCHES.get(id(layer))
        if entry is None or entry[0] is not layer:
            had_own = "call" in layer.__dict__
            entry = (layer, had_own, layer.call, {})
            _PATCHES[id(layer)] = entry
            object.__setattr__(layer, "call", _dispatcher(layer, entry[2]))
        stack = entry[3].setdefault(threading.get_ident(), [])
        inner = stack[-1] if stack else entry[2]
        wrapper = functools.wraps(entry[2])(make(inner))
        stack.append(wrapper)
        return wrapper


def _pop(layer, wrapper):
    with _LOCK:
        _, had_own, original, stacks = _PATCHES[id(layer)]
        thread = threading.get_ident()
        stacks[thread].remove(wrapper)
        if not stacks[thread]:
            del stacks[thread]
        if not stacks:
            del _PATCHES[id(layer)]
            if had_own:
                object.__setattr__(layer, "call", original)
            else:
                object.__delattr__(layer, "call")


@contextlib.contextmanager
def patched_calls(replacements):
    """Replace `layer.call` by `make(original)` for each `(layer, make)` pair,
    for calls from this thread.

    The replacement keeps the original's signature (`functools.wraps`), so
    Keras still passes `training` and `mask` as before. The original methods
    come back when the block ends, also after an exception. Blocks in
    several threads on the same layers each see their own replacements
    only, and calls from threads outside any block the original; they
    may end in any order.
    """
    patched = []
    try:
        for layer, make in replacements:
            patched.append((layer, _push(layer, make)))
        yield
    finally:
        for layer, wrapper in reversed(patched):
            _pop(layer, wrapper)
