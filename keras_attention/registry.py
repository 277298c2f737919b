"""The name -> layer registry of keras_attention, and its entry-point plugins.

One decorator, `register("name")`, records a `keras.layers.Layer` subclass
under a short name *and* registers it for Keras serialization, so a `.keras`
file that uses it loads back with no `custom_objects`.

Third-party packages add layers through the entry-point group
`keras_attention.layers`, declared in their own packaging metadata:

```
[options.entry_points]
keras_attention.layers =
    my_attention = my_package.layers
```

The entry point may name a module (whose import runs `@register(...)`) or a
layer class (registered under the entry point's name if it is not already).
Plugins are discovered lazily, the first time a name is looked up or listed,
never at `import keras_attention`. A plugin that fails to import is reported
with a warning naming it and the library keeps working.
"""

import contextlib
import importlib.metadata
import threading
import warnings

import keras

ENTRY_POINT_GROUP = "keras_attention.layers"

# name -> layer class
_REGISTRY = {}
# name -> where it came from ("keras_attention" or "plugin <ep> (<dist>)")
_ORIGINS = {}
_plugins_discovered = False
_lock = threading.RLock()
# The plugin being imported right now, so `register` can say who registered.
_current_origin = [None]


def _default_origin(cls):
    return cls.__module__.split(".")[0]


def register(name, package=None):
    """Register a layer class under `name`, for `get` and for `.keras` files.

    Args:
        name: the short registry name (e.g. `"multi_head"`), a non-empty
            string. Registering a name that is already taken by another
            class warns and replaces it.
        package: the Keras serialization package; defaults to the top-level
            package of the class's module, so plugin classes never collide
            with keras_attention's own.

    Returns:
        A class decorator that returns the class unchanged.

    Example:

    ```python
    @keras_attention.register("my_attention")
    class MyAttention(keras.layers.Layer):
        ...

    layer = keras_attention.get("my_attention")
    ```
    """
    if not isinstance(name, str) or not name:
        raise ValueError(
            "Received an invalid value for argument `name`, expected a "
            f"non-empty string. Received: name={name!r}"
        )

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
            raise ValueError(
                "`register` decorates subclasses of `keras.layers.Layer`. "
                f"Received: {cls!r} for name={name!r}"
            )
        origin = _current_origin[0] or _default_origin(cls)
        with _lock:
            previous = _REGISTRY.get(name)
            if previous is not None and previous is not cls:
                warnings.warn(
                    f"keras_attention: the layer name {name!r} is registered "
                    f"twice: {previous.__module__}.{previous.__qualname__} "
                    f"(from {_ORIGINS.get(name)}) is replaced by "
                    f"{cls.__module__}.{cls.__qualname__} (from {origin}).",
                    stacklevel=2,
                )
            keras.saving.register_keras_serializable(
                package=package or _default_origin(cls), name=cls.__name__
            )(cls)
            _REGISTRY[name] = cls
            _ORIGINS[name] = origin
        return cls

    return decorator


@contextlib.contextmanager
def _origin(origin):
    previous = _current_origin[0]
    _current_origin[0] = origin
    try:
        yield
    finally:
        _current_origin[0] = previous


def discover_plugins(force=False):
    """Import the layers declared in the `keras_attention.layers` entry points.

    Runs once per process unless `force=True` (e.g. after installing a plugin
    in a running interpreter). A plugin whose import fails is skipped with a
    warning naming the entry point and its distribution.

    Returns:
        The list of entry-point names that loaded.
    """
    global _plugins_discovered
    with _lock:
        if _plugins_discovered and not force:
            return []
        _plugins_discovered = True
        loaded = []
        for entry_point in importlib.metadata.entry_points(
            group=ENTRY_POINT_GROUP
        ):
            dist = getattr(entry_point, "dist", None)
            dist_name = getattr(dist, "name", None) or "unknown distribution"
            origin = f"plugin {entry_point.name!r} ({dist_name})"
            try:
                with _origin(origin), warnings.catch_warnings():
                    warnings.simplefilter("always")
                    obj = entry_point.load()
                    if (
                        isinstance(obj, type)
                        and issubclass(obj, keras.layers.Layer)
                        and obj not in _REGISTRY.values()
                    ):
                        register(entry_point.name)(obj)
            except Exception as error:  # a broken plugin must not break us
                warnings.warn(
                    f"keras_attention: could not load {origin} "
                    f"= {entry_point.value!r}: {type(error).__name__}: {error}",
                    stacklevel=2,
                )
                continue
            loaded.append(entry_point.name)
        return loaded


def names():
    """The sorted list of every registered layer name, plugins included."""
    discover_plugins()
    return sorted(_REGISTRY)


def origins():
    """A dict mapping each registered name to the package it came from."""
    discover_plugins()
    return dict(sorted(_ORIGINS.items()))


def get_class(name):
    """The layer class registered under `name`."""
    discover_plugins()
    if isinstance(name, type) and issubclass(name, keras.layers.Layer):
        return name
    if name not in _REGISTRY:
        raise ValueError(
            f"Received an unknown attention layer name: {name!r}. "
            f"Known names: {', '.join(sorted(_REGISTRY)) or '(none)'}. "
            "Third-party layers are found through the entry-point group "
            f"{ENTRY_POINT_GROUP!r}."
        )
    return _REGISTRY[name]


def get(name, **kwargs):
    """A new layer of the class registered under `name`, built from `kwargs`.

    Args:
        name: a registered name (see `names()`), or a layer class.
        **kwargs: the layer's constructor arguments.

    Example:

    ```python
    layer = keras_attention.get("multi_head", num_heads=4, key_dim=16)
    ```
    """
    return get_class(name)(**kwargs)
