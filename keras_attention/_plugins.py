"""Discovery of the entry-point plugins (`keras_attention.registry`'s).

`discover` imports each entry point of a group once per process; while it
does, the thread-local `state` says which plugin is importing, so that
`registry.register` credits (and journals) what that import registers to
it, and a plugin that fails halfway leaves none of its names. The registry
passes its own functions in: this module imports nothing of ours.
"""

import contextlib
import importlib.metadata
import inspect
import threading
import warnings

import keras

_plugins_discovered = False
# Held while plugins are discovered, never while `registry._lock` is: a
# plugin's module imported by the user in another thread registers
# (`_lock`) while discovery waits for that module's import lock.
_discovery_lock = threading.RLock()
# Per thread: `origin`, the plugin this thread is importing, so `register`
# can say who registered; `journal`, what its registrations replaced, so a
# plugin that fails halfway leaves none of its names behind; `package`, that
# plugin's top-level package, and `plugins`, every plugin's (package ->
# origin), so a plugin's import of another plugin's module credits (and
# journals) those registrations to the other plugin, not to itself.
state = threading.local()


_STATE = ("origin", "journal", "package", "plugins")


@contextlib.contextmanager
def _origin(origin, package, plugins):
    previous = [getattr(state, key, None) for key in _STATE]
    state.origin, state.journal = origin, []
    state.package, state.plugins = package, plugins
    try:
        yield state.journal
    finally:
        for key, value in zip(_STATE, previous):
            setattr(state, key, value)


def _entry_point_package(entry_point):
    """The top-level package an entry point's value (`pkg.mod:Attr`) names."""
    return entry_point.value.split(":")[0].strip().split(".")[0]


def _plugin_origin(entry_point):
    dist = getattr(entry_point, "dist", None)
    dist_name = getattr(dist, "name", None) or "unknown distribution"
    return f"plugin {entry_point.name!r} ({dist_name})"


def discover(force, group, register, registered_as, undo):
    """Imports the entry points of `group` (once per process unless
    `force`); `register(name)(cls)` registers, `registered_as(name)` is the
    class a name holds, `undo(journal)` takes a failed plugin's names back.
    Returns the names of the entry points that loaded."""
    global _plugins_discovered
    with _discovery_lock:
        if _plugins_discovered and not force:
            return []
        _plugins_discovered = True
        loaded = []
        entry_points = list(importlib.metadata.entry_points(group=group))
        plugins = {}
        for entry_point in entry_points:
            plugins.setdefault(
                _entry_point_package(entry_point), _plugin_origin(entry_point)
            )
        for entry_point in entry_points:
            origin = _plugin_origin(entry_point)
            # A plugin that fails halfway leaves none of its names behind
            # (and another thread's registrations meanwhile, and another
            # plugin's that its import ran, in place).
            journal = []
            package = _entry_point_package(entry_point)
            try:
                with _origin(origin, package, plugins) as journal, \
                        warnings.catch_warnings():
                    warnings.simplefilter("always")
                    obj = entry_point.load()
                    is_layer = isinstance(obj, type) and issubclass(
                        obj, keras.layers.Layer
                    )
                    if not (is_layer or inspect.ismodule(obj)):
                        raise TypeError(
                            "the entry point names neither a module nor a "
                            f"keras.layers.Layer subclass but {obj!r}"
                        )
                    # A class is registered under the entry point's name
                    # unless that name already holds it (a class registered
                    # under another name gets this one too).
                    if is_layer and registered_as(entry_point.name) is not obj:
                        register(entry_point.name)(obj)
            except Exception as error:  # a broken plugin must not break us
                undo(journal)
                warnings.warn(
                    f"keras_attention: could not load {origin} "
                    f"= {entry_point.value!r}: {type(error).__name__}: {error}",
                    stacklevel=2,
                )
                continue
            loaded.append(entry_point.name)
        return loaded
