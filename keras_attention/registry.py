"""The name -> layer registry of keras_attention, and its entry-point plugins.

One decorator, `register("name", input_kind=...)`, records a
`keras.layers.Layer` subclass under a short name *and* registers it for Keras
serialization, so a `.keras` file that uses it loads back with no
`custom_objects`. The input kind says what the layer takes, so that an
application can place any registered layer without a list of names:

- `"tokens"`: sequences `(B, T, C)` (self-attention on one tensor, or
  `layer(query, value)`); the default;
- `"grid"`: feature maps `(B, H, W, C)` returned in the same shape;
- `"graph"`: node features with an adjacency or edge list.

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
never at `import keras_attention`: a plain Keras model holding a plugin's
layer loads from `.keras` after `discover_plugins()` (or the plugin's own
import). A plugin that fails to import, or whose entry point names neither a
module nor a layer class, is reported with a warning naming it and the
library keeps working, with none of the names a plugin that failed
halfway had registered (a plugin it imported keeps its own); a plugin never
takes over the name of one of keras_attention's own layers nor one the
user's code registered, and a name two plugins claim is refused
(`get_class` raises, naming both) until the user chooses. A registration is
credited to the package whose code called `register` (an alias of a
built-in class registered in the user's code is the user's).
"""

import inspect
import re
import sys
import threading
import warnings

import keras

from keras_attention import _plugins

ENTRY_POINT_GROUP = "keras_attention.layers"

# name -> layer class
_REGISTRY = {}
# name -> where it came from ("keras_attention" or "plugin <ep> (<dist>)")
_ORIGINS = {}
# name -> "tokens" | "grid" | "graph"
_INPUT_KINDS = {}
# name -> [(origin, class), ...]: two plugins claimed it while discovered, so
# `get_class` refuses it (which one a saved application meant is unknown).
_CLASHES = {}
INPUT_KINDS = ("tokens", "grid", "graph")
_lock = threading.RLock()
_MISSING = object()
# A name is a word of letters, digits, `_`, `.` or `-` (what the CLI's table,
# error messages and entry-point names can show unambiguously).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,99}")


def _default_origin(cls):
    return cls.__module__.split(".")[0]


def _caller_package(depth=2):
    """The top-level package of the module that called `register`: a
    registration is credited to the code that made it (an alias of a
    built-in class registered in the user's code is the user's)."""
    try:
        module = sys._getframe(depth).f_globals.get("__name__") or ""
    except ValueError:
        module = ""
    return module.split(".")[0] or "__main__"


def _registration_origin(source):
    """Who registers, from the calling package `source`: outside plugin
    discovery the package itself; during it, the plugin being imported,
    unless `source` is another plugin's package (a module it imports)."""
    origin = getattr(_plugins.state, "origin", None)
    if origin is None:
        return source, False
    if source != getattr(_plugins.state, "package", None):
        other = (getattr(_plugins.state, "plugins", None) or {}).get(source)
        if other is not None and other != origin:
            return other, False
    return origin, True


def _is_plugin(origin):
    """Whether `origin` is a plugin being discovered (`plugin 'ep' (dist)`)."""
    return isinstance(origin, str) and origin.startswith("plugin ")


def _declared_kind(cls):
    """The input kind a class (or the nearest base) declares, or `None`.

    `input_kind = "grid"`, or the older `expects_grid = True`.
    """
    for klass in cls.__mro__:
        if "input_kind" in vars(klass):
            return klass.input_kind
        if "expects_grid" in vars(klass):
            return "grid" if klass.expects_grid else "tokens"
    return None


def register(name, package=None, input_kind=None):
    """Register a layer class under `name`, for `get` and for `.keras` files.

    Args:
        name: the short registry name (e.g. `"multi_head"`), a non-empty
            string. Registering a name that is already taken by another
            class warns and replaces it, except a name of keras_attention's
            own layers: another package's class warns and the built-in
            stays (`unregister` it first to replace it); and a name two
            plugins claim as they are discovered: that warns and the name
            is refused (`get_class` raises, naming both) until one is
            uninstalled or a `register` call outside discovery chooses.
        package: the Keras serialization package, a non-empty string;
            defaults to the top-level package of the class's module, so
            plugin classes never collide with keras_attention's own. Two
            classes of one name in one package (`"my_package>Attention"`)
            would load from `.keras` files as one another: that raises a
            `ValueError`; give one of them its own `package`.
        input_kind: what the layer takes: `"tokens"` `(B, T, C)`, `"grid"`
            `(B, H, W, C)` or `"graph"`. `None` reads the class attribute
            `input_kind` (or the older `expects_grid`), else `"tokens"`.
            The class gets the attribute `input_kind`.

    Returns:
        A class decorator that returns the class unchanged.

    Example:

    ```python
    @keras_attention.register("my_attention", input_kind="tokens")
    class MyAttention(keras.layers.Layer):
        ...

    layer = keras_attention.get("my_attention", name="attention")
    ```
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "Received an invalid value for argument `name`, expected a "
            "non-empty word of at most 100 letters, digits, `_`, `.` or `-` "
            f"starting with a letter or `_`. Received: name={name!r}"
        )
    if package is not None and (not isinstance(package, str) or not package):
        raise ValueError(
            "Received an invalid value for argument `package`, expected a "
            f"non-empty string or None. Received: package={package!r}"
        )
    if input_kind is not None and input_kind not in INPUT_KINDS:
        raise ValueError(
            "Received an invalid value for argument `input_kind`, expected "
            f"one of {INPUT_KINDS}. Received: input_kind={input_kind!r}"
        )

    source = _caller_package()

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
            raise ValueError(
                "`register` decorates subclasses of `keras.layers.Layer`. "
                f"Received: {cls!r} for name={name!r}"
            )
        origin, journaled = _registration_origin(source)
        with _lock:
            if journaled:
                _journal(name)
            kind = input_kind or _declared_kind(cls) or "tokens"
            if kind not in INPUT_KINDS:
                raise ValueError(
                    f"The layer class {cls.__qualname__} declares "
                    f"input_kind={kind!r}; expected one of {INPUT_KINDS}."
                )
            previous = _REGISTRY.get(name)
            replacing = previous is not None and previous is not cls
            held_by = _ORIGINS.get(name)
            origin = held_by if previous is cls else origin  # kept if the same
            # keras_attention's own names stay its own; and during
            # discovery a plugin does not take a name that the user's code
            # (or a module it imported) registered: that was a choice.
            kept = replacing and (
                (held_by == "keras_attention" and origin != "keras_attention")
                or (_is_plugin(origin) and not _is_plugin(held_by))
            )
            # Serializable even when its name is refused: a model that
            # holds the class itself still loads from `.keras`.
            _register_serializable(cls, package or _default_origin(cls))
            # Kept on the class too: re-registrations and subclasses read it.
            cls.input_kind = kind
            if replacing and not kept and _is_plugin(origin) and (
                held_by != origin
            ):
                return _refuse_clash(name, previous, cls, origin)
            if replacing:
                warnings.warn(
                    f"keras_attention: the layer name {name!r} is registered "
                    f"twice: {_qualified(previous)} (from "
                    f"{_ORIGINS.get(name)}) "
                    + ("stays; " if kept else "is replaced by ")
                    + f"{_qualified(cls)} (from {origin})"
                    + (
                        (
                            " is not registered under keras_attention's own "
                            "name (`keras_attention.unregister` it first to "
                            "replace it)."
                        ) if held_by == "keras_attention" else (
                            " is not registered: a plugin does not take a "
                            "name registered by your code."
                        )
                        if kept else "."
                    ),
                    stacklevel=2,
                )
                if kept:
                    return cls
            _CLASHES.pop(name, None)  # chosen by this registration
            _REGISTRY[name] = cls
            _ORIGINS[name] = origin
            _INPUT_KINDS[name] = kind
        return cls

    return decorator


def _refuse_clash(name, previous, cls, origin):
    """A second plugin claims `name` during discovery: which class a saved
    application's `attention=name` meant cannot be told (the one found
    first would win by the order of `sys.path`), so the name is refused
    until the user chooses."""
    claims = _CLASHES.setdefault(name, [(_ORIGINS.get(name), previous)])
    claims.append((origin, cls))
    warnings.warn(
        f"keras_attention: the layer name {name!r} is claimed by two "
        f"plugins: {_claimants(name)}. The name is refused until one is "
        f"uninstalled, or `keras_attention.register({name!r})(cls)` is "
        "called outside discovery to choose.",
        stacklevel=3,
    )
    return cls


def _claimants(name):
    return " and ".join(
        f"{_qualified(cls)} (from {origin})" for origin, cls in _CLASHES[name]
    )


def _qualified(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _register_serializable(cls, package):
    """`keras.saving.register_keras_serializable(package)(cls)`, refusing a
    key (`package>ClassName`) that another class holds: keras would
    silently replace it, and a `.keras` file of the first class would load
    as the second. A class defined again (same module and name: a reloaded
    module, a notebook cell run twice) replaces its former self."""
    key = f"{package}>{cls.__name__}"
    holder = keras.saving.get_registered_object(key)
    if holder is not None and holder is not cls and (
        _qualified(holder) != _qualified(cls)
    ):
        raise ValueError(
            f"Received an invalid value for argument `package`: the Keras "
            f"serialization name {key!r} of {_qualified(cls)} is already "
            f"that of {_qualified(holder)}, so a `.keras` file of one would "
            "load as the other. Pass another `package` (e.g. "
            f"package={cls.__module__!r}) or rename the class. "
            f"Received: package={package!r}"
        )
    keras.saving.register_keras_serializable(package=package, name=cls.__name__)(cls)


def _journal(name):
    """Notes what `name` holds before this thread's plugin changes it."""
    journal = getattr(_plugins.state, "journal", None)
    if journal is not None:
        journal.append((name, [
            table.get(name, _MISSING) for table in (_REGISTRY, _ORIGINS, _INPUT_KINDS)
        ], list(_CLASHES[name]) if name in _CLASHES else _MISSING))


def _undo(journal):
    """Puts back what the journal's registrations replaced, latest first."""
    with _lock:
        for name, values, clashes in reversed(journal):
            for table, value in zip((_REGISTRY, _ORIGINS, _INPUT_KINDS), values):
                if value is _MISSING:
                    table.pop(name, None)
                else:
                    table[name] = value
            if clashes is _MISSING:
                _CLASHES.pop(name, None)
            else:
                _CLASHES[name] = clashes


def discover_plugins(force=False):
    """Import the layers declared in the `keras_attention.layers` entry points.

    Runs once per process unless `force=True` (e.g. after installing a plugin
    in a running interpreter). A plugin whose import fails is skipped with a
    warning naming the entry point and its distribution.

    Returns:
        The list of entry-point names that loaded.
    """
    return _plugins.discover(
        force, ENTRY_POINT_GROUP, register, _REGISTRY.get, _undo
    )


def names():
    """The sorted list of every registered layer name, plugins included."""
    discover_plugins()
    return sorted(_REGISTRY)


def origins():
    """A dict mapping each registered name to the package it came from."""
    discover_plugins()
    return dict(sorted(_ORIGINS.items()))


def classes():
    """Every registered layer class once, plugins included, in name order:
    a class under a name two plugins claim too (that name is refused to
    `get_class`, but such a layer in a model is still an attention layer)."""
    discover_plugins()
    with _lock:
        found = [_REGISTRY[name] for name in sorted(_REGISTRY)]
        for name in sorted(_CLASHES):
            found.extend(cls for _, cls in _CLASHES[name])
    return tuple(dict.fromkeys(found))


def refused():
    """A dict mapping each name two plugins claim to why it is refused."""
    discover_plugins()
    with _lock:
        return {name: f"claimed by two plugins: {_claimants(name)}" for name in sorted(_CLASHES)}


def get_class(name):
    """The layer class registered under `name` (plugins discovered first).

    Args:
        name: a registered name (`names()` lists them), or a
            `keras.layers.Layer` subclass, returned as it is.

    Raises:
        ValueError: `name` is neither, or no layer is registered under it
            (the message lists the names).

    Example:

    >>> get_class("multi_head").__name__
    'MultiHeadAttention'
    """
    discover_plugins()
    if isinstance(name, type) and issubclass(name, keras.layers.Layer):
        return name
    if not isinstance(name, str):
        raise ValueError(
            "Received an invalid value for argument `name`, expected a "
            "registered layer name (a string) or a keras.layers.Layer "
            f"subclass. Received: name={name!r}"
        )
    if name in _CLASHES:
        raise ValueError(
            f"Received an ambiguous attention layer name: {name!r}, claimed "
            f"by two plugins: {_claimants(name)}. Uninstall one, or choose "
            f"with `keras_attention.register({name!r})(cls)`."
        )
    if name not in _REGISTRY:
        raise ValueError(
            f"Received an unknown attention layer name: {name!r}. "
            f"Known names: {_listed(_REGISTRY)}. "
            "Third-party layers are found through the entry-point group "
            f"{ENTRY_POINT_GROUP!r}."
        )
    return _REGISTRY[name]


def _listed(known):
    """The names, quoted (a user's `"multi-head"` beside `"multi_head"`)."""
    return ", ".join(repr(n) for n in sorted(known)) or "(none)"


def input_kind(name):
    """What the layer registered as `name` takes: tokens, grid or graph."""
    cls = get_class(name)
    if isinstance(name, str):
        return _INPUT_KINDS[name]
    for registered, kind in _INPUT_KINDS.items():
        if _REGISTRY[registered] is cls:
            return kind
    return _declared_kind(cls) or "tokens"


def names_of_kind(kind):
    """The sorted registered names whose input kind is `kind`."""
    if kind not in INPUT_KINDS:
        raise ValueError(
            "Received an invalid value for argument `kind`, expected one of "
            f"{INPUT_KINDS}. Received: kind={kind!r}"
        )
    discover_plugins()
    return sorted(
        n for n, k in _INPUT_KINDS.items() if k == kind and n in _REGISTRY
    )


def unregister(name):
    """Remove `name` from the registry (its Keras serialization stays).

    Raises:
        ValueError: no layer is registered under `name` (the message lists
            the names).

    Example:

    ```python
    keras_attention.unregister("my_attention")
    ```
    """
    with _lock:
        if name not in _REGISTRY and name not in _CLASHES:
            raise ValueError(
                f"Received an unknown attention layer name: {name!r}. "
                f"Known names: {_listed(_REGISTRY)}."
            )
        _REGISTRY.pop(name, None)
        _ORIGINS.pop(name, None)
        _INPUT_KINDS.pop(name, None)
        _CLASHES.pop(name, None)


def check_name(value, argument="attention", allow_none=False, kinds=None):
    """`value` if it is a registered name (of one of `kinds`), else raise.

    The keras-worded `ValueError` names the application's argument and
    lists the names that would fit.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, type) and issubclass(value, keras.layers.Layer):
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            "a registered name (a string; register classes with "
            "`keras_attention.register`). Received: "
            f"{argument}={value.__name__}"
        )
    known = names()
    if kinds is not None:
        known = [n for n in known if _INPUT_KINDS.get(n) in kinds]
    if not isinstance(value, str) or value not in known:
        kind_text = "" if kinds is None else f" of input kind {'/'.join(kinds)}"
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a registered attention name{kind_text}, one of: "
            f"{_listed(known)}{' or None' if allow_none else ''}. "
            f"Received: {argument}={value!r}"
            + (
                " (a layer of a plugin that is not installed? Plugins are "
                f"found through the entry-point group {ENTRY_POINT_GROUP!r})"
                if isinstance(value, str) and value not in _REGISTRY else ""
            )
        )
    return value


def call_accepts(layer, argument, var_keyword=False):
    """Whether `layer.call` has a parameter named `argument`.

    A `**kwargs` catch-all counts only with `var_keyword=True`: an
    application would pass an argument (`return_attention_scores`, `mask`)
    that such a layer may silently drop, while the attention-map hooks try
    any layer that might take it.
    """
    try:
        parameters = inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return False
    return argument in parameters or (
        var_keyword
        and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    )


def get(name, /, **kwargs):
    """A new layer of the class registered under `name`, built from `kwargs`.

    Args:
        name: a registered name (see `names()`), or a layer class.
        **kwargs: the layer's constructor arguments, `name` and `dtype`
            included.

    Example:

    ```python
    layer = keras_attention.get(
        "multi_head", num_heads=4, key_dim=16, name="attention"
    )
    ```
    """
    return get_class(name)(**kwargs)


def accepted_arguments(name, offered):
    """The items of `offered` that the constructor of `name` names.

    Applications offer every layer the arguments they know (`num_heads`,
    `key_dim`, `window_size`, `reduction`, ...); each layer takes those its
    constructor names, its bases' included where the class keeps them
    (`config_keys`: a CBAM's `data_format`, taken through `**kwargs`).
    """
    cls = get_class(name)
    parameters = set(inspect.signature(cls.__init__).parameters)
    parameters.update(getattr(cls, "config_keys", ()))
    return {k: v for k, v in offered.items() if k in parameters}


def build(name, /, offered=None, overrides=None, **kwargs):
    """The applications' one way to make an attention layer by name.

    `get(name, **accepted_arguments(name, offered), **overrides, **kwargs)`:
    the offered arguments that the layer takes, then the user's
    `attention_kwargs` (`overrides`), then fixed keywords such as `name` and
    `dtype`.
    """
    arguments = accepted_arguments(name, offered or {})
    arguments.update(overrides or {})
    arguments.update(kwargs)
    return get(name, **arguments)

