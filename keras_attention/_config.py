"""The one way the package writes `get_config` and `from_config`.

A layer, model or preprocessor keeps each argument of its constructor (but
`**kwargs`) as an attribute of the same name, checked or normalized as it
likes. `ArgumentConfig` reads the names from the constructor's signature
(and those of its bases), so `get_config` returns them without listing them
again, keras objects serialized, and `from_config` calls the constructor.

The attention layers (`keras_attention.layers`) and the applications both
use it; it imports only keras, so any module of the package may import it.
"""

import contextlib
import functools
import gc
import inspect
import threading

import keras
from keras.src.backend.common import global_state


# The keras objects a class may take by name or instance: stored as keras's
# `get` returns them, written to a config by the module's `serialize`.
KERAS_OBJECTS = {
    "activation": keras.activations,
    "kernel_initializer": keras.initializers,
    "bias_initializer": keras.initializers,
    "kernel_regularizer": keras.regularizers,
    "bias_regularizer": keras.regularizers,
    "kernel_constraint": keras.constraints,
    "bias_constraint": keras.constraints,
}


def constructor_arguments(cls):
    """The names of the arguments of `cls.__init__` (not `self`, `**kwargs`)."""
    parameters = inspect.signature(cls.__init__).parameters
    return tuple(
        name
        for name, parameter in parameters.items()
        if name != "self"
        and parameter.kind
        in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    )


def serialize_argument(name, value):
    """`value` of the constructor argument `name` as a config holds it.

    A keras object (`KERAS_OBJECTS`) is serialized; a name or config dict
    that a class kept as given (the Transformer blocks' `activation="gelu"`,
    which keras's `activations.serialize` rejects) is already its config.
    """
    module = KERAS_OBJECTS.get(name)
    if module is None or value is None or isinstance(value, (str, dict)):
        return value
    return module.serialize(value)


def arguments_config(obj, names, skip=()):
    """`{name: value}` of `obj`'s constructor arguments `names`, each read
    from the attribute of its own name (`serialize_argument`); the names in
    `skip` are left out."""
    return {
        name: serialize_argument(name, getattr(obj, name))
        for name in names
        if name not in skip
    }


class ArgumentConfig:
    """`get_config()`: the constructor's arguments, read from attributes.

    `config_keys` is set for every subclass: the arguments of its
    constructor after those of its bases' (a subclass constructor that
    passes the shared ones on with `**kwargs` names only its own). The
    config starts from the next class's `get_config` (a Keras layer's name,
    dtype, ...), or is empty for a plain object, and gets the keys it does
    not hold yet: a subclass of a keras layer that writes its own arguments
    (`keras.layers.MultiHeadAttention`) adds only its new ones. A class may
    also set `config_keys` itself, where its signature cannot tell.
    """

    config_keys = ()
    optional_config_keys = frozenset()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "config_keys" in cls.__dict__:
            return
        inherited = tuple(
            key for base in cls.__bases__ for key in getattr(base, "config_keys", ())
        )
        cls.config_keys = tuple(
            dict.fromkeys(inherited + constructor_arguments(cls))
        )
        # A user's subclass (outside this package) may keep its own
        # arguments under other names and write them in its own
        # `get_config`, keras's way: those are written here only when an
        # attribute of their name exists, instead of failing.
        optional = set().union(
            *(getattr(base, "optional_config_keys", ()) for base in cls.__bases__)
        )
        if not cls.__module__.startswith("keras_attention."):
            optional |= set(cls.config_keys) - set(inherited)
        cls.optional_config_keys = frozenset(optional)

    def keep_config(self, arguments):
        """Keeps each of `config_keys` from `arguments` (the constructor's
        `locals()`) as an attribute; `attention_kwargs` as a new dict."""
        for key in self.config_keys:
            value = arguments[key]
            if key == "attention_kwargs":
                value = dict(value or {})
            setattr(self, key, value)

    def base_config(self):
        """The config the arguments are added to."""
        parent = getattr(super(), "get_config", None)
        return parent() if parent is not None else {}

    def get_config(self):
        config = self.base_config()
        kept = [
            key
            for key in self.config_keys
            if key not in self.optional_config_keys or hasattr(self, key)
        ]
        config.update(arguments_config(self, kept, skip=config))
        return config

    @classmethod
    def from_config(cls, config):
        # A Keras layer's own `from_config` (dtype policies) calls the
        # constructor too.
        parent = getattr(super(), "from_config", None)
        if parent is not None:
            return parent(config)
        return cls(**config)


# The config key of the layers of a functional model's graph that were
# frozen (`layer.trainable = False`) in a trainable model.
FROZEN_LAYERS = "frozen_layers"


def frozen_layers_config(model):
    """`{"frozen_layers": [names]}` for a functional model rebuilt by its
    constructor, or `{}` when none of its graph's layers is frozen.

    Keras's own functional config keeps each layer's `trainable`; a model
    whose config is its arguments keeps the names of its frozen layers
    instead, so that `model.get_layer("block_0").trainable = False`
    survives a `.keras` file as it does for a plain functional model (a
    frozen model's layers all are: its own `trainable` says so).
    """
    if not model.trainable:
        return {}
    # Layers LoRA froze (`enable_lora`) are not frozen by their user.
    names = [
        layer.name for layer in model.layers
        if not layer.trainable and not getattr(layer, "_frozen_by_lora", False)
    ]
    return {FROZEN_LAYERS: names} if names else {}


class FreezesSublayers:
    """`layer.trainable = False` set before the layer is built freezes the
    projections `build` makes too. Keras's setter reaches only the
    variables and sublayers that exist when it runs, so the `Dense`,
    `EinsumDense`, `Conv`, `BatchNormalization` sublayers made in `build`
    stayed trainable and a model trained them (keras's own
    `MultiHeadAttention` does the same; `Dense` does not, having no
    sublayers). The same path rebuilds a frozen layer in `from_config`,
    `clone_model` and `.keras` loading. Keras calls `_post_build` after
    every `build` (keras 3's `Operation`). Likewise a sublayer frozen
    before this layer built it (a model's `backbone.trainable = False`
    before the first call, or `build_with_frozen_layers` in
    `from_config`): it is frozen again once built, its own new sublayers
    and variables with it (DETR's backbone stayed trainable)."""

    def _post_build(self):
        super()._post_build()
        if not self.trainable:
            for layer in self._layers:
                layer.trainable = False
            return
        for layer in self._flatten_layers(include_self=False):
            if not layer.trainable:
                # The setter itself: on TensorFlow `layer.trainable = False`
                # on a layer already False returns early (TF's tracking
                # skips `self.x = self.x`), and reaches nothing.
                type(layer).trainable.fset(layer, False)


def build_with_frozen_layers(build, config):
    """`build(**config)` with the layers that `config` names under
    `"frozen_layers"` (`frozen_layers_config`) frozen again."""
    config = dict(config)
    frozen = config.pop(FROZEN_LAYERS, ())
    model = build(**config)
    for name in frozen:
        model.get_layer(name).trainable = False
    return model


# The config key of a model's quantized layers (`quantized_layers`).
QUANTIZED_LAYERS = "quantized_layers"


def quantized_layers(model, skip=None):
    """`{path: {"mode", "config"}}` of the quantized layers of `model`
    (`model.quantize`), `skip`'s (a nested model that writes its own) left
    out; `{}` when none is.

    A model rebuilt by its constructor makes float layers, which cannot load
    quantized weights; `requantize` quantizes them again, the same way,
    before the weights load.
    """
    skipped = set() if skip is None else {id(x) for x in skip._flatten_layers()}
    return {
        layer.path: {
            "mode": layer.quantization_mode,
            "config": keras.saving.serialize_keras_object(
                getattr(layer, "quantization_config", None)
            ),
        }
        for layer in model._flatten_layers(include_self=False)
        if id(layer) not in skipped
        and getattr(layer, "quantization_mode", None) is not None
    }


@contextlib.contextmanager
def collections_of_new_objects():
    """Within it, a `gc.collect()` walks only the objects made inside it.

    Keras runs a full `gc.collect()` each time a layer deletes a variable,
    and `quantize` deletes every kernel it replaces: after the imports of
    TensorFlow (or torch) each collection walks ~600,000 objects, 0.3 s, so
    quantizing `vit_digits` took 8 s (BENCHMARKS.md, "`quantize` in a
    process that has imported TensorFlow"). This freezes what exists on
    entry (`gc.freeze()`), unfreezes it on exit and runs one collection
    then, so what the deleted kernels held is freed before it returns.
    Nothing is done when something is frozen already (the caller's
    `gc.freeze()` is theirs to undo).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def requantize(model, quantized, skip=None):
    """Quantize the layers of `model` that `quantized_layers` listed."""
    if not quantized:
        return model
    with collections_of_new_objects():
        return _requantize(model, quantized, skip)


def _requantize(model, quantized, skip):
    skipped = set() if skip is None else {id(x) for x in skip._flatten_layers()}
    layers = {
        layer.path: layer
        for layer in model._flatten_layers(include_self=False)
        if id(layer) not in skipped
    }
    missing = sorted(set(quantized) - set(layers))
    if missing:
        raise ValueError(
            f"Received an invalid value for argument `{QUANTIZED_LAYERS}`, "
            f"expected paths of layers of the rebuilt {type(model).__name__}. "
            f"Received: {QUANTIZED_LAYERS}={missing}"
        )
    for path, item in quantized.items():
        layers[path].quantize(
            item["mode"],
            type_check=False,
            config=keras.saving.deserialize_keras_object(item["config"]),
        )
    return model


def graph_state_config(model, skip=None):
    """What a model rebuilt by its constructor would not have again: its
    frozen layers (`frozen_layers_config`) and quantized layers
    (`quantized_layers`, `skip`'s left out), as config entries."""
    config = frozen_layers_config(model)
    quantized = quantized_layers(model, skip)
    if quantized:
        config[QUANTIZED_LAYERS] = quantized
    return config


def build_with_graph_state(build, config, skip=None):
    """`build(**config)`, then the layers that `graph_state_config` listed
    frozen and quantized again (before the weights load); `skip(model)`:
    a nested model whose own config lists its layers."""
    config = dict(config)
    quantized = config.pop(QUANTIZED_LAYERS, None)
    model = build_with_frozen_layers(build, config)
    return requantize(model, quantized, None if skip is None else skip(model))


_DTYPE_SCOPE = threading.local()


def _global_policy():
    """Keras's global dtype policy, without setting it when it is unset
    (`keras.config.dtype_policy()` sets it to floatx's)."""
    policy = global_state.get_global_attribute("dtype_policy", None)
    return keras.dtype_policies.DTypePolicy(keras.config.floatx()) if (
        policy is None
    ) else policy


def under_dtype_policy(init):
    """`init` (a functional model's constructor) with its `dtype=` argument
    honoured, as keras-hub's backbones honour theirs.

    A functional model's layers are made in its constructor before
    `keras.Model.__init__` sees `dtype`, which keras's functional
    constructor does not pass on; so the constructor runs under that
    policy as the global one (restored afterwards; nested constructors,
    such as a task's backbone, run inside the outer scope), and the model
    keeps the policy and writes it in its config.
    """

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        dtype = kwargs.get("dtype")
        if dtype is None:
            # A task on a backbone built with `dtype=` takes its policy, as
            # keras-hub's task heads take their backbone's.
            dtype = getattr(kwargs.get("backbone"), "_given_dtype_policy", None)
        depth = getattr(_DTYPE_SCOPE, "depth", 0)
        if dtype is None and not depth:
            # Built under the global policy: the model keeps it and writes
            # it, as keras's layers write theirs (a `mixed_bfloat16` model
            # loaded as float32 in another process gave other logits).
            init(self, *args, **kwargs)
            self._given_dtype_policy = _global_policy()
            return None
        # Inside another's scope (a task's backbone), the scope's policy:
        # the nested model writes it too, as it is loaded on its own.
        policy = _global_policy() if dtype is None else (
            keras.dtype_policies.get(dtype)
        )
        # The global setting as it was, unset included: restoring
        # `keras.config.dtype_policy()` (which sets it when unset) pinned
        # it, and a later `set_floatx` changed no new layer's dtype.
        previous = global_state.get_global_attribute("dtype_policy", None)
        keras.config.set_dtype_policy(policy)
        _DTYPE_SCOPE.depth = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            _DTYPE_SCOPE.depth = depth
            global_state.set_global_attribute("dtype_policy", previous)
        self.dtype_policy = policy
        self._given_dtype_policy = policy

    # keras reads the constructor's arguments with `getfullargspec`, which
    # does not follow `__wrapped__`.
    __init__.__signature__ = inspect.signature(init)
    return __init__


def backend_neutral_compile_config(config):
    """A saved compile config with torch's optimizers named as Keras's.

    On torch, Keras saves `keras.optimizers.Adam` (and the others) under
    their backend class, `keras.src.backend.torch.optimizers.torch_adam`:
    loading such a file on JAX gave torch's optimizer (a `TypeError` in
    `fit`), and on TensorFlow imported torch after TensorFlow (a crash).
    Those entries are named `keras.optimizers.<class>` here, which each
    backend resolves to its own.
    """
    if isinstance(config, (list, tuple)):
        return [backend_neutral_compile_config(v) for v in config]
    if not isinstance(config, dict):
        return config
    config = {k: backend_neutral_compile_config(v) for k, v in config.items()}
    module, name = config.get("module"), config.get("class_name")
    if (
        isinstance(module, str)
        and module.startswith("keras.src.backend.")
        and isinstance(getattr(keras.optimizers, str(name), None), type)
    ):
        config.update(module="keras.optimizers", registered_name=None)
    return config


def dtype_config(model):
    """`{"dtype": policy}`: the policy the model was built under (its
    `dtype=`, else the global one then); `{}` for a model that does not
    keep one."""
    policy = getattr(model, "_given_dtype_policy", None)
    if policy is None:
        return {}
    return {"dtype": keras.dtype_policies.serialize(policy)}


class DTypeArgument:
    """Mixin of the functional applications: `dtype=` honoured
    (`under_dtype_policy`) by every subclass's constructor, and a keyword
    that no constructor took refused (keras's functional constructor drops
    what it does not know: a misspelt `dropout_rate=` went unnoticed)."""

    # What keras's functional constructor takes besides the graph.
    model_arguments = ("inputs", "outputs", "name", "trainable", "dtype")

    def __init__(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - set(self.model_arguments))
        if unknown:
            raise ValueError(
                f"Unrecognized keyword arguments passed to "
                f"{type(self).__name__}: {unknown}; expected its own "
                f"({', '.join(self._own_arguments())}) or keras.Model's "
                "(name, dtype, trainable)."
            )
        super().__init__(*args, **kwargs)

    def _own_arguments(self):
        """The constructor's named arguments, and its backbone class's."""
        named = [
            name for name, p in inspect.signature(type(self).__init__).parameters.items()
            if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        backbone = getattr(type(self), "backbone_class", None)
        return named + [k for k in getattr(backbone, "config_keys", ()) if k not in named]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = under_dtype_policy(cls.__dict__["__init__"])


class FunctionalConfig(DTypeArgument, ArgumentConfig):
    """`ArgumentConfig` for a functional model, rebuilt by its constructor.

    Its config is its arguments, name and trainability, not the graph that
    `keras.Model.get_config` would describe; and what the constructor does
    not make again (`graph_state_config`): the names of its frozen layers
    and the layers that `model.quantize` quantized, frozen and quantized
    again when the model is rebuilt, so a `.keras` file keeps them.
    """

    def base_config(self):
        return {
            "name": self.name, "trainable": self.trainable,
            **dtype_config(self), **graph_state_config(self),
        }

    @classmethod
    def from_config(cls, config):
        return build_with_graph_state(cls, config)
