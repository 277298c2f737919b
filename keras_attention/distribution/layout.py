"""Layout maps that shard attention projections over a model axis."""

import re
import warnings

import keras

from keras_attention import registry

# A projection's role, from the variable's path inside its layer: a path
# segment (or `_`-separated part of one) naming it, e.g. `query_kernel`,
# `query/kernel`, `attention_output/kernel`, `output_dense/kernel`. The
# input projections split their outputs (column-parallel): query, key,
# value and gate (MultiHeadAttention), qkv (LocalWindowAttention), theta,
# phi and g (NonLocalBlock), hidden (CBAM's channel MLP), projection,
# source and target (GraphAttention), general (Luong's); `output` splits
# its input side (row-parallel).
_ROLE = re.compile(
    r"(?:^|[/_])(query|key|value|gate|qkv|theta|phi|g|hidden|projection|"
    r"source|target|general|output)(?=[/_]|$)"
)
_KERNEL = re.compile(r"(?:^|[/_])kernel$")
_BIAS = re.compile(r"(?:^|[/_])bias$")


def _registry_classes():
    return registry.classes()


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


def _projection_variables(model, pattern):
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
            if role and pattern.search(relative):
                seen.add(id(variable))
                found.append((layer, variable, role.group(1), relative))
    return found


def projection_kernels(model):
    """The projection kernels of the model's registry layers.

    Returns:
        A list of `(layer, variable, role, relative_path)`, `role` the
        projection's name in the path (`"query"`, `"key"`, `"value"`,
        `"gate"`, `"qkv"`, `"theta"`, `"phi"`, `"g"`, `"hidden"`,
        `"projection"`, `"source"`, `"target"`, `"general"` or
        `"output"`), for every kernel (a variable whose path ends with
        `kernel`) of a registry layer whose path names one.
    """
    return _projection_variables(model, _KERNEL)


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

    Every projection of every registry layer in `model` is split over the
    mesh axis `model_axis`, Megatron style: the input projections (query,
    key, value, gate, a fused qkv, non-local's theta/phi/g, CBAM's hidden
    layer, GAT's projections) split their outputs — heads, else head size
    or units (`_sharded_axis`) — and their biases the same way; the output
    projections split their input side, so each device computes its heads
    end to end and one all-reduce sums the output (a fused qkv kernel
    `(C, 3 * H * D)` is split by columns, which are not whole heads: XLA
    gathers them once more). A projection with no
    dimension the axis size divides (CBAM's one hidden unit, three heads
    on four devices) is replicated, and a warning names it. Other variables
    are replicated. Keys are regexes on variable paths that ignore Keras's
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

    Layers whose names differ only by that suffix but need different
    layouts (GAT's two layers, of 64 and of `num_classes` units) are keyed
    by their own names.

    Returns:
        A `keras.distribution.LayoutMap`.

    Raises:
        ValueError: `model_axis` is not an axis of `mesh`; `model` is not
            built (it has no variables yet: the map would be empty); or two
            layers of the same name need different layouts.
    """
    if model_axis not in mesh.axis_names:
        raise ValueError(
            "Received an invalid value for argument `model_axis`, expected "
            f"one of the mesh's axes {list(mesh.axis_names)}. Received: "
            f"model_axis={model_axis!r}"
        )
    if not getattr(model, "built", False) or not model.weights:
        raise ValueError(
            "Received an invalid value for argument `model`, expected a "
            "built model (call it on a batch, or give it an `Input`): its "
            f"variables are what the map shards. Received: {model!r}, "
            f"built={getattr(model, 'built', None)}, with "
            f"{len(getattr(model, 'weights', []))} variables"
        )
    size = mesh.shape[list(mesh.axis_names).index(model_axis)]
    layouts = keras.distribution.LayoutMap(mesh)
    wanted, replicated = [], []  # (layer, relative, spec); None: replicated
    kernels = {}  # a column-parallel layer's kernel axis, for its bias
    for layer, variable, role, relative in projection_kernels(model):
        shape = tuple(variable.shape)
        axis = _sharded_axis(role, shape, size)
        if axis is None:
            replicated.append(f"{variable.path} {shape}")
            wanted.append((layer, relative, None))
            continue
        if role != "output":
            kernels[(id(layer), relative.rsplit("kernel", 1)[0])] = axis - 1
        wanted.append((layer, relative, _spec(axis, len(shape), model_axis)))
    for layer, variable, role, relative in _projection_variables(model, _BIAS):
        axis = kernels.get((id(layer), relative.rsplit("bias", 1)[0]))
        spec = None
        if axis is not None and axis < len(variable.shape):
            spec = _spec(axis, len(variable.shape), model_axis)
        wanted.append((layer, relative, spec))
    chosen = _keys(wanted)
    if replicated:
        warnings.warn(
            f"layout_map: {len(replicated)} projection kernel(s) have no "
            f"dimension of heads or units divisible by the {size} devices of "
            f"the mesh axis {model_axis!r} and stay replicated: "
            + ", ".join(replicated),
            stacklevel=2,
        )
    for key, spec in chosen.items():
        layouts[key] = spec
    return layouts


def _spec(axis, rank, model_axis):
    return tuple(model_axis if i == axis else None for i in range(rank))


def _keys(wanted):
    """`{regex: spec}` for the `(layer, relative, spec)` wanted (`spec`
    None: replicated, no key). Layers whose names differ only by a `_<n>`
    suffix share a key (`_key`) while they want one layout; where they
    differ (a projection that one splits and another, of other sizes,
    cannot), each such layer is keyed by its own name, so that no key
    covers a layer it does not fit (another instance of the model then
    needs the same layer names: name such layers, or build the model the
    same way)."""
    groups = {}
    for layer, relative, spec in wanted:
        groups.setdefault(_key(layer, relative), []).append(
            (layer, relative, spec)
        )
    chosen = {}
    for key, members in groups.items():
        specs = {spec for _, _, spec in members}
        if len(specs) == 1:
            if None not in specs:
                chosen[key] = specs.pop()
            continue
        exact = {}
        for layer, relative, spec in members:
            name = rf"(?:.*/)?{re.escape(layer.name)}/{re.escape(relative)}"
            if exact.get(name, spec) != spec:
                raise ValueError(
                    f"Two layers named {layer.name!r} need different layouts "
                    f"for {relative} ({exact[name]} and {spec}); give them "
                    "distinct names."
                )
            exact[name] = spec
        chosen.update({k: v for k, v in exact.items() if v is not None})
    return chosen
