"""Layout maps that shard attention projections over a model axis."""

import re

import keras

from keras_attention import registry

# A projection's role, from the variable's path inside its layer: a path
# segment (or `_`-separated part of one) naming query/key/value/output,
# e.g. `query_kernel`, `query/kernel`, `attention_output/kernel`.
_ROLE = re.compile(r"(?:^|[/_])(query|key|value|output)(?=[/_]|$)")
_KERNEL = re.compile(r"(?:^|[/_])kernel$")


def _registry_classes():
    classes = []
    for name in registry.names():
        try:
            classes.append(registry.get_class(name))
        except Exception:  # a broken plugin: not ours to shard
            continue
    return tuple(classes)


def _relative_path(variable, layer):
    """The variable's path inside `layer` (`query_kernel`, `query/kernel`)."""
    marker = layer.name + "/"
    index = variable.path.rfind(marker)
    if index < 0 or (index > 0 and variable.path[index - 1] != "/"):
        return None
    return variable.path[index + len(marker) :]


def _sharded_axis(role, shape, size):
    """The axis of a `role` kernel to split over `size` devices, or None.

    Query/key/value kernels `(F, H, D)` split their heads `H` (their size
    `D` when the heads do not divide, e.g. few key/value heads of grouped
    query attention), `(F, U)` their units; output kernels `(H, D, F)` and
    `(U, F)` split their input side, so that each device computes its heads
    end to end and one all-reduce sums the output.
    """
    if role == "output":
        candidates = [0, 1] if len(shape) == 3 else [0]
    else:
        candidates = [1, 2] if len(shape) == 3 else [len(shape) - 1]
    for axis in candidates:
        if axis < len(shape) and shape[axis] is not None and shape[axis] % size == 0:
            return axis
    return None


def projection_kernels(model):
    """The projection kernels of the model's registry layers.

    Returns:
        A list of `(layer, variable, role, relative_path)`, `role` one of
        `"query"`, `"key"`, `"value"`, `"output"`, for every kernel (a
        variable whose path ends with `kernel`) of a registry layer whose
        path names a role.
    """
    classes = _registry_classes()
    found, seen = [], set()
    for layer in model._flatten_layers(include_self=True):
        if not isinstance(layer, classes):
            continue
        for variable in layer.weights:
            relative = _relative_path(variable, layer)
            if relative is None or id(variable) in seen:
                continue
            role = _ROLE.search(relative)
            if role and _KERNEL.search(relative):
                seen.add(id(variable))
                found.append((layer, variable, role.group(1), relative))
    return found


def _key(layer, relative):
    """A regex (fully matched by keras) for this kernel in any instance.

    Any parent path, the layer's name with or without Keras's `_<n>`
    uniquifying suffix, then the path inside the layer: another instance
    of the same model (built under the distribution's scope) matches.
    """
    base = re.sub(r"_\d+$", "", layer.name)
    return rf"(?:.*/)?{re.escape(base)}(?:_\d+)?/{re.escape(relative)}"


def layout_map(model, mesh, model_axis="model"):
    """A `keras.distribution.LayoutMap` sharding the model's attention heads.

    Every projection kernel (query, key, value, output) of every registry
    layer in `model` is split over the mesh axis `model_axis`
    (`_sharded_axis`: heads, else head size or units); other variables are
    replicated. Keys are regexes on variable paths that ignore Keras's
    `_<n>` name suffixes, so the map built from one instance applies to
    another instance of the same model, created in the distribution's
    scope, as `ModelParallel` requires:

    ```python
    mesh = keras.distribution.DeviceMesh((2, 4), ["data", "model"], devices)
    layouts = keras_attention.distribution.layout_map(build_model(), mesh)
    distribution = keras.distribution.ModelParallel(
        layout_map=layouts, batch_dim_name="data")
    with distribution.scope():
        model = build_model()
    ```

    Args:
        model: a built model (or layer) holding registry layers.
        mesh: a `keras.distribution.DeviceMesh` with an axis `model_axis`.
        model_axis: name of the mesh axis that splits the heads.

    Returns:
        A `keras.distribution.LayoutMap`.

    Raises:
        ValueError: `model_axis` is not an axis of `mesh`; a projection
            kernel has no dimension divisible by the axis size (the message
            names the variable); or two layers sharing a key need different
            layouts.
    """
    if model_axis not in mesh.axis_names:
        raise ValueError(
            "Received an invalid value for argument `model_axis`, expected "
            f"one of the mesh's axes {list(mesh.axis_names)}. Received: "
            f"model_axis={model_axis!r}"
        )
    size = mesh.shape[list(mesh.axis_names).index(model_axis)]
    layouts = keras.distribution.LayoutMap(mesh)
    chosen = {}
    for layer, variable, role, relative in projection_kernels(model):
        shape = tuple(variable.shape)
        axis = _sharded_axis(role, shape, size)
        if axis is None:
            raise ValueError(
                f"Cannot shard {variable.path} {shape} over the {size} devices "
                f"of the mesh axis {model_axis!r}: no dimension that "
                "holds heads or units is divisible by it. Choose a mesh "
                "axis size that divides the number of heads."
            )
        spec = tuple(model_axis if i == axis else None for i in range(len(shape)))
        key = _key(layer, relative)
        if key in chosen and chosen[key] != spec:
            raise ValueError(
                f"Layers named like {layer.name!r} need different layouts for "
                f"{relative} ({chosen[key]} and {spec}); give them distinct "
                "names."
            )
        chosen[key] = spec
    for key, spec in chosen.items():
        layouts[key] = spec
    return layouts
