"""Reading checkpoint tensors and loading them all-or-nothing."""

import json
import os
import warnings

import numpy as np

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".tar")
# Where training checkpoints keep the weights, in timm's order of
# preference (`timm.models.load_state_dict`, `use_ema=True`): the EMA first.
STATE_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model", "module")
# Wrappers' name prefixes that timm's `clean_state_dict` strips:
# DistributedDataParallel's and `torch.compile`'s, in either order.
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_orig_mod.")


def _to_numpy(tensor):
    """A torch tensor (any float dtype, bfloat16 too) or array as NumPy."""
    if hasattr(tensor, "detach"):
        if tensor.is_meta:
            raise ValueError(
                "The torch model's tensors are on the meta device (no data): "
                "load its weights (`load_state_dict(..., assign=True)`) or "
                "pass the checkpoint file."
            )
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(tensor)


def state_dict_arrays(module):
    """`{name: np.ndarray}` of a torch module's `state_dict()`."""
    return {name: _to_numpy(t) for name, t in module.state_dict().items()}


def _read_bfloat16(path, name):
    """One bfloat16 tensor of a safetensors file, as float32.

    The format: an 8-byte little-endian header size, a JSON header with each
    tensor's dtype, shape and byte offsets after it, then the data.
    """
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(size))[name]
        start, end = entry["data_offsets"]
        f.seek(8 + size + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    # bfloat16 is the upper half of a float32.
    return (raw.astype("<u4") << 16).view("<f4").reshape(entry["shape"])


def _read_safetensors(path):
    try:
        from safetensors import SafetensorError
        from safetensors import safe_open
    except ImportError as error:  # a dependency; removed since installing
        raise ValueError(
            f"Reading {path!r} needs the safetensors package: "
            "pip install safetensors"
        ) from error

    arrays = {}
    try:
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":  # NumPy lacks it
                    arrays[name] = _read_bfloat16(path, name)
                else:
                    arrays[name] = f.get_tensor(name)
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise ValueError(
            f"Could not read the safetensors file {path!r} (truncated, or "
            f"not a safetensors file?): {error}"
        ) from error
    return arrays


def _read_torch(path):
    try:
        import torch
    except ImportError as error:
        raise ValueError(
            f"Reading {path!r} needs torch; convert it to .safetensors or "
            "install torch (pip install \"keras-attention-layers[convert]\")."
        ) from error
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a bad file
        raise ValueError(
            f"Could not read the torch checkpoint {path!r} (truncated, or "
            f"not a checkpoint?): {error}"
        ) from error
    # Training checkpoints wrap the weights: {"state_dict": ...}, {"model":
    # ...}, with the EMA's beside them (taken first, as timm does).
    while isinstance(content, dict):
        keys = [k for k in STATE_KEYS if isinstance(content.get(k), dict)]
        if not keys:
            break
        if keys[0].endswith("ema"):
            warnings.warn(
                f"{path!r} holds EMA weights ({keys[0]!r}) beside others "
                f"({', '.join(repr(k) for k in keys[1:]) or 'none'}): took "
                "the EMA's, as timm's `load_checkpoint` does.",
                stacklevel=5,
            )
        content = content[keys[0]]
    if not isinstance(content, dict):
        raise ValueError(
            f"Expected a state dict (name -> tensor) in {path!r}. Received: "
            f"{type(content).__name__}"
        )
    return {name: _to_numpy(t) for name, t in content.items()}


def read_checkpoint(path):
    """`{name: np.ndarray}` of a checkpoint file.

    Args:
        path: a `.safetensors` file (read with the `safetensors` package into
            NumPy, no torch needed) or a torch file (`.pth`, `.pt`, `.bin`,
            `.ckpt`, `.pth.tar`, read with `torch.load(weights_only=True)`;
            a training checkpoint's EMA weights first, as timm's).

    Returns:
        The tensors by name, float tensors as `float32`; names without
        the prefixes of DistributedDataParallel (`module.`) and
        `torch.compile` (`_orig_mod.`), as timm's `clean_state_dict`.

    Raises:
        ValueError: a missing, unreadable or truncated file, or another
            suffix.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"No checkpoint file at {path!r}.")
    if path.endswith(".safetensors"):
        arrays = _read_safetensors(path)
    elif path.endswith(TORCH_SUFFIXES):
        arrays = _read_torch(path)
    else:
        raise ValueError(
            "Received an invalid value for argument `source`, expected a "
            f".safetensors or torch ({', '.join(TORCH_SUFFIXES)}) file. "
            f"Received: source={path!r}"
        )
    arrays = {_without_wrappers(name): a for name, a in arrays.items()}
    return {
        name: a.astype("float32") if a.dtype.kind == "f" else a
        for name, a in arrays.items()
    }


# What a keyword may change in a converted model: regularisation, and the
# input sizes the converters resample positions for (or a loss).
FREE_ARGUMENTS = ("image_size", "sequence_length", "loss_settings")


def with_overrides(arguments, overrides):
    """The arguments read from a checkpoint, with the caller's keywords.

    A keyword that contradicts what the checkpoint fixed (its heads, its
    norms' epsilon, its sizes) is refused: the weights hold only under the
    checkpoint's values (eight heads read from four, or another epsilon,
    keep every shape and load silently wrong). Dropout rates and the
    `FREE_ARGUMENTS` may differ.
    """
    for key, value in overrides.items():
        fixed = key in arguments and "dropout" not in key and key not in FREE_ARGUMENTS
        if fixed and not _same(value, arguments[key]):
            raise ValueError(
                f"Received an invalid value for argument `{key}`: the "
                f"checkpoint fixes {key}={arguments[key]!r}, and its weights "
                f"hold only under it; leave `{key}` out. Received: {key}={value!r}"
            )
    return {**arguments, **overrides}


def _same(a, b):
    """Equal as arguments: lists as tuples, `n` as `(n, n)`."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (list, tuple)) != isinstance(b, (list, tuple)):
        pair, one = (a, b) if isinstance(a, (list, tuple)) else (b, a)
        return all(_same(x, one) for x in pair)
    return a == b


def _without_wrappers(name):
    for prefix in WRAPPER_PREFIXES:
        name = name[len(prefix):] if name.startswith(prefix) else name
    return name


def is_exact_gelu(act):
    """Whether a timm block's activation is the exact GELU: torch's
    `nn.GELU()` or timm's own `GELU` (`act_layer="gelu"`, `F.gelu`)."""
    import torch.nn as nn

    if isinstance(act, nn.GELU):
        return act.approximate == "none"
    return type(act).__module__.startswith("timm.") and type(act).__name__ == "GELU"


def unwrap_compiled(source):
    """The module inside `torch.compile(module)`, else `source`."""
    return getattr(source, "_orig_mod", source)


def read_hub_directory(directory):
    """`(config, tensors)` of a Hugging Face model folder.

    The folder of `save_pretrained` or of a hub snapshot: `config.json` and
    `model.safetensors` (preferred) or `pytorch_model.bin`. Sharded
    checkpoints (`*.index.json`) are read shard by shard.
    """
    directory = os.fspath(directory)
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise ValueError(
            f"Expected a Hugging Face model folder with a config.json. "
            f"Received: source={directory!r}"
        )
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as error:  # ValueError: not JSON, not UTF-8
        raise ValueError(f"Could not read {config_path!r}: {error}") from error
    if not isinstance(config, dict):
        raise ValueError(
            f"Expected a JSON object in {config_path!r}. Received: "
            f"{type(config).__name__}"
        )
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if os.path.isfile(os.path.join(directory, single)):
            return config, read_checkpoint(os.path.join(directory, single))
        if os.path.isfile(os.path.join(directory, index)):
            with open(os.path.join(directory, index)) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            tensors = {}
            for shard in shards:
                tensors.update(read_checkpoint(os.path.join(directory, shard)))
            return config, tensors
    raise ValueError(
        f"No model.safetensors or pytorch_model.bin in {directory!r}."
    )


def read_transformers_source(source, architectures):
    """`(config dict, {name: array}, how to name it)` of a Hugging Face model.

    Args:
        source: a `transformers` model (its class one of `architectures`)
            or a local folder (`read_hub_directory`) whose `config.json`
            lists no other architecture.
        architectures: the accepted class names.
    """
    expected = f"Expected a Hugging Face {' or '.join(architectures)}."
    source = unwrap_compiled(source)
    if hasattr(source, "state_dict") and hasattr(source, "config"):
        kind = type(source).__name__
        if kind not in architectures:
            raise ValueError(
                f"{expected} Received: {type(source).__module__}.{kind}"
            )
        tensors = state_dict_arrays(source)
        return source.config.to_dict(), tensors, f"The Hugging Face model {kind}"
    if not isinstance(source, (str, os.PathLike)) or not os.path.isdir(source):
        shown = (
            repr(os.fspath(source)) if isinstance(source, (str, os.PathLike))
            else type(source).__name__
        )
        raise ValueError(
            "Received an invalid value for argument `source`, expected a "
            "Hugging Face model or a folder with config.json and "
            f"model.safetensors (or pytorch_model.bin). Received: source={shown}"
        )
    config, tensors = read_hub_directory(source)
    listed = config.get("architectures") or []
    if any(a not in architectures for a in listed):
        raise ValueError(f"{expected} Received: architectures={listed}")
    if not listed:
        warnings.warn(
            f"{os.fspath(source)!r}: config.json names no architecture; its "
            f"tensors are read as a {' or '.join(architectures)}'s (a "
            "head of another kind, such as token classification, would "
            "load as this one's).",
            stacklevel=4,
        )
    return config, tensors, f"The folder {os.fspath(source)!r}"


class TensorLoader:
    """Collects `checkpoint tensor -> Keras variable` assignments, then loads.

    `take(names, variables, transform)` looks up the source tensors,
    transforms them (`transform(*arrays)` returns one array per variable)
    and checks each result against its variable's shape; problems are
    collected, not raised. `load()` raises one `ValueError` listing every
    missing, misshapen and unused tensor, and assigns the variables only when
    there is none.

    Args:
        tensors: `{name: np.ndarray}` of the checkpoint.
        source: how the checkpoint is named in messages.
        ignore: tensor names that are known and deliberately not loaded
            (a pooler the model has no use for, a replaced head).
    """

    def __init__(self, tensors, source="the checkpoint", ignore=()):
        self.tensors = dict(tensors)
        self.source = source
        self.used = set(name for name in ignore if name in self.tensors)
        self.assignments = []
        self.problems = []

    def take(self, names, variables, transform=None):
        names = [names] if isinstance(names, str) else list(names)
        variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
        missing = [name for name in names if name not in self.tensors]
        if missing:
            self.problems.extend(f"missing tensor {name!r}" for name in missing)
            return
        self.used.update(names)
        arrays = [self.tensors[name] for name in names]
        try:
            values = transform(*arrays) if transform else arrays
        except ValueError as error:  # a reshape or split of a wrong shape
            self.problems.append(
                f"tensor {'/'.join(names)!r} of shape "
                f"{tuple(arrays[0].shape)} does not fit "
                f"{', '.join(v.path for v in variables)}: {error}"
            )
            return
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        for variable, value in zip(variables, values):
            expected = tuple(variable.shape)
            if tuple(value.shape) != expected:
                self.problems.append(
                    f"tensor {'/'.join(names)!r} of shape "
                    f"{tuple(arrays[0].shape)} gives {tuple(value.shape)}, "
                    f"but {variable.path} has shape {expected}"
                )
            else:
                self.assignments.append((variable, value))

    def zeros(self, variables):
        """Sets `variables` to zero (a bias the checkpoint does not have)."""
        for variable in variables:
            self.assignments.append(
                (variable, np.zeros(tuple(variable.shape), "float32"))
            )

    def load(self):
        """Assigns every variable, or raises `ValueError` and assigns none."""
        extra = sorted(set(self.tensors) - self.used)
        problems = self.problems + [f"unexpected tensor {name!r}" for name in extra]
        if problems:
            shown = problems[:20]
            more = len(problems) - len(shown)
            raise ValueError(
                f"{self.source} does not match the model "
                f"({len(problems)} problem(s); no weight was assigned):\n  "
                + "\n  ".join(shown)
                + (f"\n  ... and {more} more" if more else "")
            )
        for variable, value in self.assignments:
            variable.assign(value.astype(variable.dtype))


# Assigning torch tensors to Keras variables, shared by every converter.


def is_torch_module(source):
    """Whether `source` is a torch module (else a path)."""
    return hasattr(source, "state_dict") and hasattr(source, "named_modules")


def encoder_blocks(backbone):
    """The backbone's Transformer encoder blocks, in order."""
    from keras_attention.applications.blocks import TransformerEncoderBlock

    return [
        layer for layer in backbone.layers
        if isinstance(layer, TransformerEncoderBlock)
    ]


def conv_kernel(weight):
    """`(C_out, C_in, kh, kw)` -> `(kh, kw, C_in, C_out)`: NCHW to
    channels-last."""
    return weight.transpose(2, 3, 1, 0)


def dense_kernel(weight):
    """A `torch.nn.Linear` weight `(out, in)` as a Keras kernel `(in, out)`."""
    return weight.T


def linear_as(shape):
    """The transform of a `torch.nn.Linear` weight `(out, in)` into an
    `EinsumDense` kernel of `shape` (the input's axes, then the output's).
    Only a 2-D weight whose two axes group `shape`'s is taken: a flattened
    or padded tensor of as many values would reshape to it and load wrong
    (`TensorLoader.take` reports the `ValueError` with the tensor's name)."""
    shape = tuple(int(n) for n in shape)

    def transform(weight):
        fits = weight.ndim == 2 and any(
            int(np.prod(shape[:k])) == weight.shape[1]
            and int(np.prod(shape[k:])) == weight.shape[0]
            for k in range(1, len(shape))
        )
        if not fits:
            raise ValueError(f"expected a 2-D (out, in) weight for {shape}")
        return weight.T.reshape(shape)

    return transform


def bias_as(shape):
    """The transform of a 1-D bias into `shape` (an `EinsumDense` bias);
    another rank is refused, as in `linear_as`."""
    shape = tuple(int(n) for n in shape)

    def transform(bias):
        if bias.ndim != 1:
            raise ValueError(f"expected a 1-D bias for {shape}")
        return bias.reshape(shape)

    return transform


def take_norm(loader, name, norm):
    """`name.weight`/`name.bias` -> a LayerNormalization's gamma/beta."""
    loader.take(name + ".weight", norm.gamma)
    loader.take(name + ".bias", norm.beta)


def take_linear(loader, name, dense, shape=None):
    """`name.weight`/`name.bias` of a `Linear` -> a Dense (or, with
    `shape`, an EinsumDense kernel of that shape and its bias)."""
    loader.take(
        name + ".weight", dense.kernel,
        dense_kernel if shape is None else linear_as(shape),
    )
    loader.take(
        name + ".bias", dense.bias,
        None if shape is None else bias_as(dense.bias.shape),
    )


def _cubic(x, a):
    """Keys' cubic convolution kernel with parameter `a`."""
    x = np.abs(x)
    return np.where(
        x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )


def _aa_bicubic_weights(size_in, size_out):
    """`(size_out, size_in)` weights of torch's antialiased bicubic resize
    (`F.interpolate(mode="bicubic", antialias=True)`, PIL's filter, a=-0.5)."""
    scale = size_in / size_out
    support = 2.0 * max(scale, 1.0)
    inverse = 1.0 / max(scale, 1.0)
    weights = np.zeros((size_out, size_in))
    for i in range(size_out):
        center = (i + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), size_in)
        taps = _cubic((np.arange(low, high) - center + 0.5) * inverse, -0.5)
        weights[i, low:high] = taps / taps.sum()
    return weights


def _bicubic_weights(size_in, size_out):
    """`(size_out, size_in)` weights of torch's plain bicubic resize
    (`F.interpolate(mode="bicubic", align_corners=False)`, a=-0.75): four
    taps around each output pixel, indices past a border clamped to it."""
    weights = np.zeros((size_out, size_in))
    for i in range(size_out):
        source = (i + 0.5) * size_in / size_out - 0.5
        low = int(np.floor(source))
        for tap in range(low - 1, low + 3):
            weights[i, min(max(tap, 0), size_in - 1)] += _cubic(source - tap, -0.75)
    return weights


def resample_position_embedding(
    embedding, old_grid, new_grid, prefix_tokens, antialias=True
):
    """A ViT's learned position embedding `(1, prefix + h*w, C)` resized to
    another patch grid, as timm's `resample_abs_pos_embed` does (bicubic
    with antialiasing on the `(h, w)` grid; the class token's row kept),
    or, with `antialias=False`, as Hugging Face's ViT does with
    `interpolate_pos_encoding=True` (plain bicubic).

    For fine-tuning a converted model at another image size:
    `VisionTransformer.from_timm(model, image_size=384)`.
    """
    old_h, old_w = old_grid
    new_h, new_w = new_grid
    prefix = embedding[:, :prefix_tokens]
    grid = embedding[0, prefix_tokens:].astype("float64")
    if grid.shape[0] != old_h * old_w:
        raise ValueError(
            f"The position embedding has {grid.shape[0]} patch rows, not the "
            f"{old_h} x {old_w} grid of the source model."
        )
    grid = grid.reshape(old_h, old_w, -1)
    weights = _aa_bicubic_weights if antialias else _bicubic_weights
    grid = np.einsum("ih,hwc->iwc", weights(old_h, new_h), grid)
    grid = np.einsum("jw,iwc->ijc", weights(old_w, new_w), grid)
    grid = grid.reshape(1, new_h * new_w, -1).astype(embedding.dtype)
    return np.concatenate([prefix, grid], axis=1)
