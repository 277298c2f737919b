"""The keras projection sublayers of the attention layers: their weight
arguments (stored, serialized, passed on), LoRA (`enable_lora`),
quantization, freezing (`FreezesSublayers`) and the configs
(`ProjectionMixin`, on `ArgumentConfig`)."""

import re

import keras

from keras_attention._validation import check_bool
from keras_attention._weights import AllOrNothingWeights
from keras_attention import registry
from keras_attention._config import KERAS_OBJECTS
from keras_attention._config import ArgumentConfig
from keras_attention._config import FreezesSublayers
from keras_attention._config import collections_of_new_objects
from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid


# keras's layers whose kernels take LoRA (`enable_lora`) and, the dense
# ones, quantization (`quantize`): the projections of every layer here.
_LORA_LAYERS = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
)


# What `Dense.quantize` takes per layer ("gptq" and "awq" work on a model).
LAYER_QUANTIZATION_MODES = ("int8", "int4", "float8")


class NothingToQuantizeError(ValueError, NotImplementedError):
    """`quantize` on a layer without dense projections (the parameter-free
    scores of `ScaledDotProductAttention`).

    A `ValueError` for a direct call; a `NotImplementedError` too, which
    `model.quantize` turns into a warning and skips, as it skips keras's
    own weightless layers (`keras.layers.Attention`).
    """


def projection_sublayers(layer):
    """`{name: sublayer}` of the keras projections inside `layer`.

    Nested keras_attention layers are searched too (`CBAM`'s channel MLP),
    named by their path below `layer` (`"channel_attention/hidden"`).
    """
    found = {}
    prefix = layer.path + "/" if getattr(layer, "path", None) else ""
    for sub in layer._flatten_layers(include_self=False, recursive=True):
        if isinstance(sub, _LORA_LAYERS):
            name = sub.path[len(prefix):] if sub.path.startswith(prefix) else sub.name
            found[name] = sub
    return found


def _check_lora_alpha(lora_alpha):
    if lora_alpha is not None and (
        isinstance(lora_alpha, bool)
        or not isinstance(lora_alpha, (int, float))
        or lora_alpha <= 0
    ):
        raise invalid("lora_alpha", "a positive number or None", lora_alpha)


def refuse_float8_lora(sublayers, rank):
    """Raises if a projection among `sublayers` is float8-quantized: keras's
    float8 call has no LoRA path (every later call failed)."""
    for sub in sublayers:
        if getattr(sub, "quantization_mode", None) == "float8":
            raise ValueError(
                f"LoRA cannot adapt the float8-quantized {sub.path!r} "
                "(keras's float8 layers take no LoRA; int8 and int4 do). "
                f"Received: rank={rank}"
            )


def enable_lora_on(layer, rank, lora_alpha=None, target_names=None):
    """`enable_lora(rank)` on `layer`'s projections, all or nothing.

    Every argument and every target is checked before the first sublayer
    changes, so a bad call leaves the layer exactly as it was.
    """
    check_positive_int("rank", rank)
    _check_lora_alpha(lora_alpha)
    if not layer.built:
        raise ValueError(
            f"Cannot enable LoRA on the layer {layer.name!r} before it is "
            f"built: call it once or `build` it first. Received: rank={rank}"
        )
    targets = projection_sublayers(layer)
    if target_names is not None:
        names = [target_names] if isinstance(target_names, str) else list(target_names)
        unknown = [n for n in names if not any(
            key == n or key.endswith("/" + n) for key in targets
        )]
        if unknown or not names:
            raise invalid(
                "target_names",
                f"names among {sorted(targets)}",
                target_names,
            )
        targets = {
            key: sub for key, sub in targets.items()
            if any(key == n or key.endswith("/" + n) for n in names)
        }
    if not targets:
        raise ValueError(
            f"The layer {layer.name!r} has no projection kernels to adapt "
            f"with LoRA. Received: rank={rank}"
        )
    refuse_float8_lora(targets.values(), rank)
    enabled = sorted(k for k, sub in targets.items() if sub.lora_enabled)
    if enabled:
        raise ValueError(
            f"LoRA is already enabled on {enabled} of the layer "
            f"{layer.name!r}; it can be enabled once. Received: rank={rank}"
        )
    constrained = sorted(
        k for k, sub in targets.items() if getattr(sub, "kernel_constraint", None)
    )
    if constrained:
        raise ValueError(
            f"LoRA is incompatible with kernel constraints, set on "
            f"{constrained} of the layer {layer.name!r}. Received: rank={rank}"
        )
    for sub in targets.values():
        sub.enable_lora(rank, lora_alpha=lora_alpha)


# The projections `enable_lora` adapts by default in a layer that does not
# name its own (`ProjectionMixin.lora_targets`): keras-hub's.
DEFAULT_LORA_TARGETS = ("query", "value")


def enable_lora(model, rank, lora_alpha=None, target_names=None):
    """LoRA fine-tuning of a model's attention layers, as keras-hub's
    `Backbone.enable_lora`: the named projections get trainable low-rank
    updates and every other weight of `model` is frozen (a frozen model's
    targets are made trainable first, as keras-hub does).

    Args:
        model: a built `keras.Model` or layer (a backbone) holding
            keras_attention layers.
        rank: the rank of the updates, a positive integer.
        lora_alpha: the updates' scale numerator; defaults to `rank`.
        target_names: the projection names to adapt in every attention
            layer that has them (see `projection_sublayers`); `None` (the
            default, as keras-hub's `target_layer_names=None`) takes each
            layer's own `lora_targets`: `"query"` and `"value"` (keras-hub's
            choice), the fused `"qkv"` of `LocalWindowAttention`, CBAM's
            `"hidden"`, `"output"` and `"conv"`, the non-local block's
            `"theta"`, `"g"` and `"output"`, GAT's `"projection"` (v2:
            `"source"`, `"target"`).

    Returns:
        The adapted projection sublayers, `{path: layer}`.

    Raises:
        ValueError: for a bad argument, an unbuilt model, a target name
            no projection has, LoRA already enabled on any projection of
            `model`, or a target quantized to float8; nothing changes then.

    Example:

    ```python
    model = VisionTransformer.from_preset("vit_digits")
    enable_lora(model.backbone, rank=4)
    model.compile("adam", "sparse_categorical_crossentropy")  # head + LoRA train
    ```
    """
    check_positive_int("rank", rank)
    names = None if target_names is None else (
        [target_names] if isinstance(target_names, str)
        else list(target_names) if isinstance(target_names, (list, tuple))
        else []
    )
    if names is not None and (
        not names or not all(isinstance(n, str) for n in names)
    ):
        raise invalid("target_names", "a non-empty list of names", target_names)
    if not model.built:
        raise ValueError(
            f"Cannot enable LoRA on {model.name!r} before it is built. "
            f"Received: rank={rank}"
        )
    # Ours, and any registered layer (a plugin's: `lora_targets` if it
    # names them, else query and value).
    registered = registry.classes()
    owners = [
        layer for layer in model._flatten_layers(include_self=True)
        if isinstance(layer, (ProjectionMixin,) + registered)
    ]
    targets, seen, available, adapted = {}, set(), set(), set()
    for layer in owners:
        for key, sub in projection_sublayers(layer).items():
            if id(sub) in seen:
                continue  # a nested attention layer (CBAM's parts)
            available.add(key.split("/")[-1])
            if sub.lora_enabled:
                adapted.add(sub.path)
            wanted = getattr(layer, "lora_targets", DEFAULT_LORA_TARGETS)
            wanted = wanted if names is None else names
            if key.split("/")[-1] in wanted:
                targets[sub.path] = sub
                seen.add(id(sub))
    unknown = [n for n in names or () if n not in available]
    if unknown:  # a misspelt name beside a right one was skipped
        raise invalid(
            "target_names",
            f"names of projections in {model.name!r}'s attention layers "
            f"(found: {sorted(available)}; unknown: {unknown})",
            target_names,
        )
    if adapted:
        # A second call froze the first one's factors (its freezing
        # covers every leaf but its own targets).
        raise ValueError(
            f"LoRA is already enabled on {sorted(adapted)}; enable it once, "
            f"with every target you want. Received: rank={rank}, "
            f"target_names={target_names}"
        )
    if not targets:
        raise invalid(
            "target_names",
            f"names of projections in {model.name!r}'s attention layers "
            f"(found: {sorted(available) or 'no registered attention layer'})"
            + ("; None takes each layer's `lora_targets`, which name none "
               "of them" if names is None else ""),
            target_names,
        )
    # Check everything before the first change (all or nothing).
    refuse_float8_lora(targets.values(), rank)
    for sub in targets.values():
        if getattr(sub, "kernel_constraint", None):
            raise ValueError(
                f"LoRA is incompatible with the kernel constraint of "
                f"{sub.path!r}. Received: rank={rank}"
            )
    _check_lora_alpha(lora_alpha)
    _adapt_and_freeze(model, targets, rank, lora_alpha)
    return targets


def _adapt_and_freeze(model, targets, rank, lora_alpha):
    """`enable_lora`'s change, once every check passed: LoRA on `targets`,
    every other weight of `model` frozen."""
    frozen_before = {
        id(layer) for layer in model._flatten_layers(include_self=True)
        if not layer.trainable
    }
    if not model.trainable:
        # As keras-hub's: a frozen model's factors train too (they did not).
        model.trainable = True
    # Else not set again: on JAX and torch that unfroze the layers its user
    # froze (their targets' factors trained, and the `.keras` file did
    # not freeze them again); on TensorFlow it changed nothing.
    for sub in targets.values():
        sub.enable_lora(rank, lora_alpha=lora_alpha)
    target_ids = {id(sub) for sub in targets.values()}
    for layer in model._flatten_layers(include_self=True):
        if id(layer) in target_ids:
            continue  # keras froze its kernel; its factors and bias train
        if not list(layer._flatten_layers(include_self=False)):
            # A leaf (BatchNormalization: inference).
            layer.trainable = False
            if id(layer) not in frozen_before:
                # Not frozen by its user: a `.keras` file (which holds the
                # updates merged, without LoRA) does not freeze it again
                # (`frozen_layers_config`).
                layer._frozen_by_lora = True
        else:
            # A container of targets: freeze only its own weights.
            for variable in layer._trainable_variables:
                variable.trainable = False


# The arguments of the projection sublayers' weights that the layers with
# keras sublayers take (CBAM passes them on to its two parts).
WEIGHT_ARGUMENTS = (
    "use_bias", "kernel_initializer", "bias_initializer", "kernel_regularizer",
    "bias_regularizer",
)


def keep_weight_arguments(layer, arguments):
    """Store the weight arguments among a constructor's `arguments` (its
    `locals()`) on `layer` under their own names: `use_bias` as a bool, each
    keras object as keras's `get` returns it (`kernel_initializer`,
    `bias_regularizer`, `activation`, ...), and a `seed` with the generator
    of the dropout (`keep_seed`: `layer.dropout` is set first)."""
    if "use_bias" in arguments:
        layer.use_bias = check_bool("use_bias", arguments["use_bias"])
    for name, module in KERAS_OBJECTS.items():
        if name in arguments:
            setattr(layer, name, module.get(arguments[name]))
    if "seed" in arguments:
        keep_seed(layer, arguments["seed"])


def clone_initializer(initializer):
    """A fresh copy per weight, so seeded initializers are not shared."""
    return initializer.__class__.from_config(initializer.get_config())


def sublayer_kwargs(layer, name, kernel_initializer=None):
    """Keyword arguments of a keras projection sublayer (`Dense`, `Conv`)
    of `layer`: its `use_bias`, a copy of each initializer (of
    `kernel_initializer` when given), its regularizers, dtype policy and
    `name`."""
    return dict(
        use_bias=layer.use_bias,
        kernel_initializer=clone_initializer(
            kernel_initializer or layer.kernel_initializer
        ),
        bias_initializer=clone_initializer(layer.bias_initializer),
        kernel_regularizer=layer.kernel_regularizer,
        bias_regularizer=layer.bias_regularizer,
        dtype=layer.dtype_policy,
        name=name,
    )


def keep_seed(layer, seed):
    """`layer.seed`, and the generator of its dropout (none without one)."""
    layer.seed = seed
    layer.seed_generator = (
        keras.random.SeedGenerator(seed) if layer.dropout > 0 else None
    )


def check_quantizable(sublayers, mode, owner):
    """Raises a `ValueError` when quantizing `sublayers` (keras layers with
    `quantize`) to `mode` cannot go through: one of them already quantized
    (keras quantized the others first, then raised), or float8 on one with
    LoRA (keras's float8 call has no LoRA path: the model could not be
    called after). Checked before anything changes."""
    done = sorted(
        s.path for s in sublayers if getattr(s, "quantization_mode", None)
    )
    if done:
        raise ValueError(
            f"{done} of {owner} are already quantized (a layer is quantized "
            f"once). Received: mode={mode!r}"
        )
    adapted = sorted(s.path for s in sublayers if getattr(s, "lora_enabled", False))
    if mode == "float8" and adapted:
        raise ValueError(
            f"float8 cannot quantize {adapted} of {owner}, which have LoRA "
            "(keras's float8 layers take no LoRA): save the model (the "
            "updates merged) and quantize the loaded one, or take int8 or "
            f"int4. Received: mode={mode!r}"
        )


class ProjectionMixin(AllOrNothingWeights, ArgumentConfig, FreezesSublayers):
    """`enable_lora` for a layer whose kernels live in keras sublayers, and
    its config.

    The config is `ArgumentConfig`'s: the constructor's arguments, each
    stored under its own name (keras objects serialized), added to what the
    parent's config does not hold yet; and the dtype policies of quantized
    projections.
    """

    # The projections a model-wide `enable_lora` adapts in this layer when
    # no `target_names` is given (keras-hub's query and value).
    lora_targets = DEFAULT_LORA_TARGETS

    def enable_lora(self, rank, lora_alpha=None, target_names=None):
        """LoRA on the layer's projections (Hu et al., 2021).

        The base kernels are frozen and a trainable low-rank update
        `A B * lora_alpha / rank` is added to each, as keras's
        `Dense.enable_lora` does; saving merges the update into the kernel.

        Args:
            rank: the rank of the updates, a positive integer.
            lora_alpha: the updates' scale numerator; defaults to `rank`.
            target_names: the projections to adapt (sublayer names, see
                `keras_attention.layers.base.projection_sublayers`); all by
                default.

        Raises:
            ValueError: for a bad `rank`, `lora_alpha` or `target_names`, an
                unbuilt layer, or LoRA already enabled; nothing changes then.
        """
        enable_lora_on(self, rank, lora_alpha, target_names)

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantize the layer's dense projections (keras's `Dense.quantize`).

        `model.quantize(mode)` does this for every layer of a model; this is
        the same for one layer. Convolutions stay float (keras quantizes
        none).

        Args:
            mode: `"int8"`, `"int4"` or `"float8"`.
            type_check, config: as for `keras.layers.Dense.quantize`.

        Raises:
            ValueError: for another mode, an unbuilt or already quantized
                layer, or a layer without dense projections (that one also
                a `NotImplementedError`, so `model.quantize` skips the layer
                with a warning, as keras's weightless layers); nothing
                changes then.
        """
        if not self.built:
            raise ValueError(
                f"Cannot quantize the layer {self.name!r} before it is built. "
                f"Received: mode={mode!r}"
            )
        targets = [
            sub for sub in projection_sublayers(self).values()
            if isinstance(sub, (keras.layers.Dense, keras.layers.EinsumDense))
        ]
        if not targets:
            # First, whatever the mode: `model.quantize` (GPTQ and AWQ
            # too) skips such a layer with a warning, as keras's own.
            raise NothingToQuantizeError(
                f"The layer {self.name!r} has no dense projections to "
                f"quantize. Received: mode={mode!r}"
            )
        if mode not in LAYER_QUANTIZATION_MODES:
            raise invalid(
                "mode", f"one of {LAYER_QUANTIZATION_MODES}", mode
            )
        check_quantizable(targets, mode, f"the layer {self.name!r}")
        with collections_of_new_objects():
            for sub in targets:
                sub.quantize(mode, type_check=type_check, config=config)

    def legacy_variables(self):
        """The variables in the order the layer held them as raw weights,
        before its projections became keras sublayers (`None`: no change).

        Lets `.weights.h5` and `.keras` files saved with the former layout
        load (see `load_own_variables`).
        """
        return None

    def load_own_variables(self, store):
        # Unbuilt (a copy, a pickle or a file of a layer never called),
        # the sublayers `legacy_variables` reads do not exist yet.
        legacy = self.legacy_variables() if self.built else None
        own = self._trainable_variables + self._non_trainable_variables
        count = len(store.keys())
        if legacy is None or count == len(own) or count != len(legacy):
            return super().load_own_variables(store)
        # A file of the former layout: this layer's entries hold its
        # sublayers' weights too, and the sublayers have none of their own.
        for i, variable in enumerate(legacy):
            variable.assign(store[str(i)])
        legacy_ids = {id(v) for v in legacy}
        for sub in projection_sublayers(self).values():
            if any(id(v) in legacy_ids for v in sub.weights):
                _skip_next_load(sub)

    def get_config(self):
        config = super().get_config()
        policy = quantized_policy_map(self)
        if policy is not None:
            config["dtype"] = keras.dtype_policies.serialize(policy)
        return config


def _skip_next_load(layer):
    """Make `layer`'s next `load_own_variables` a no-op (its parent loaded
    it from a file of the former layout), then restore the method."""

    def skip(store):
        del layer.__dict__["load_own_variables"]

    object.__setattr__(layer, "load_own_variables", skip)


def quantized_policy_map(layer):
    """A `DTypePolicyMap` of `layer`'s quantized projections, or `None`.

    `model.quantize("int8")` changes the dtype policy of the projection
    sublayers only, which a layer's config does not hold: rebuilt from its
    config, the layer would make float kernels and could not load the
    quantized ones (keras's own `MultiHeadAttention` has this problem).
    Saving the sublayers' policies in a map under their paths, as keras's
    `test_dtype_policy_map` builds one by hand, makes the rebuilt sublayers
    quantized again, so a `.keras` file of a quantized model loads.
    """
    # Keyed by a pattern of the path from the layer's own name down: a
    # model's name may lead the path when the layer is quantized (a
    # `Sequential`'s does) and not when it is rebuilt from its config.
    subs = [
        sub for sub in projection_sublayers(layer).values()
        if sub.quantization_mode is not None
    ]
    if not subs:
        return None
    start = len(layer.path) - len(layer.name)
    quantized = {
        "(?:.*/)?" + re.escape(sub.path[start:]): sub.dtype_policy for sub in subs
    }
    own = layer._dtype_policy
    if isinstance(own, keras.dtype_policies.DTypePolicyMap):
        policy = keras.dtype_policies.DTypePolicyMap(
            default_policy=own.default_policy
        )
        for path, item in own.items():
            policy[path] = item
    else:
        policy = keras.dtype_policies.DTypePolicyMap(default_policy=own)
    for path, item in quantized.items():
        if path not in policy:
            policy[path] = item
    return policy
