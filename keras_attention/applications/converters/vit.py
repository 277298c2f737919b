"""timm and Hugging Face ViT checkpoints -> `VisionTransformer`.

The layouts map each Keras variable of a `VisionTransformer` to its
checkpoint tensor: the patch convolution `(C, channels, p, p)` becomes a
channels-last kernel `(p, p, channels, C)`, each `Linear` weight
`(out, in)` a kernel `(in, out)` (reshaped to the `EinsumDense` kernels of
the attention: query/key/value `(C, H, D)`, output `(H, D, C)`), and timm's
fused `qkv` `(3 C, C)` is split in three. A checkpoint without query/key/
value biases (`qkv_bias=False`) loads zeros into ours, which is exact (they
become trainable when fine-tuning); so does one without the attention
output and MLP biases (timm's `proj_bias=False`).

A model built for another image size gets the position embedding resampled
to its patch grid as its source library does: timm's antialiased bicubic
(`resample_abs_pos_embed`), Hugging Face's plain bicubic
(`interpolate_pos_encoding=True`). timm's hybrids (`HybridEmbed`, a CNN
stem) and attention layers other than `Attention` are refused by name.
A timm checkpoint file read with `model_name` goes through the model's
`checkpoint_filter_fn` first, as timm's `load_checkpoint` does.
"""

import os
import re

import numpy as np

from keras_attention.applications.converters import common


def _grid(arguments):
    """The patch grid `(h, w)` of `VisionTransformer` arguments."""
    image = arguments["image_size"]
    patch = arguments["patch_size"]
    image = (image, image) if isinstance(image, int) else tuple(image)
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    return image[0] // patch[0], image[1] // patch[1]


def _fill(model, loader, layout, qkv_bias, load_head, source_grid=None,
          proj_bias=True, antialias=True):
    """Queues every variable of `model` in `loader` from `layout`'s names.

    `layout`: `patch`, `class_token`, `position`, `block` (a format string
    of the block index), the block's `norm1`, `norm2`, `qkv` (fused, timm)
    or `query`/`key`/`value`, `output`, `fc1`, `fc2`, then `final_norm` and
    `head` names. `source_grid`: the checkpoint's patch grid; a model
    built for another image size gets the position embedding resampled to
    its grid (`common.resample_position_embedding`: timm's antialiased
    bicubic, or with `antialias=False` Hugging Face's plain bicubic).
    `proj_bias=False`: the checkpoint has no `output`, `fc1` and `fc2`
    biases; ours are set to zero.
    """
    backbone = model.backbone
    patch = backbone.get_layer("patch_embedding")
    loader.take(layout["patch"] + ".weight", patch.projection.kernel, common.conv_kernel)
    loader.take(layout["patch"] + ".bias", patch.projection.bias)
    if patch.use_class_token:
        loader.take(layout["class_token"], patch.class_token)
    target = tuple(patch.position_embedding.shape)
    grid = tuple(patch.grid_shape)
    prefix_tokens = target[1] - grid[0] * grid[1]

    def position(embedding):
        if source_grid is None or tuple(source_grid) == grid:
            return embedding
        return common.resample_position_embedding(
            embedding, source_grid, grid, prefix_tokens, antialias=antialias
        )

    loader.take(layout["position"], patch.position_embedding, position)
    for index, block in enumerate(common.encoder_blocks(backbone)):
        prefix = layout["block"].format(index)
        attention = block.attention_layer
        q, k, v = attention._query_dense, attention._key_dense, attention._value_dense
        heads_shape = tuple(q.kernel.shape)  # (C, H, D)

        heads = common.linear_as(heads_shape)
        head_bias = common.bias_as(heads_shape[1:])

        common.take_norm(loader, prefix + layout["norm1"], block.attention_norm)
        if "qkv" in layout:
            qkv = prefix + layout["qkv"]
            loader.take(
                qkv + ".weight",
                [q.kernel, k.kernel, v.kernel],
                lambda w: [heads(part) for part in np.split(w, 3, axis=0)],
            )
            if qkv_bias:
                loader.take(
                    qkv + ".bias",
                    [q.bias, k.bias, v.bias],
                    lambda b: [head_bias(part) for part in np.split(b, 3)],
                )
        else:
            for role, dense in (("query", q), ("key", k), ("value", v)):
                name = prefix + layout[role]
                loader.take(name + ".weight", dense.kernel, heads)
                if qkv_bias:
                    loader.take(name + ".bias", dense.bias, head_bias)
        if not qkv_bias:
            loader.zeros([q.bias, k.bias, v.bias])
        out = attention._output_dense
        loader.take(
            prefix + layout["output"] + ".weight",
            out.kernel,
            common.linear_as(out.kernel.shape),
        )
        common.take_norm(loader, prefix + layout["norm2"], block.mlp_norm)
        for role, dense in (("fc1", block.mlp_hidden), ("fc2", block.mlp_output)):
            loader.take(
                prefix + layout[role] + ".weight", dense.kernel, common.dense_kernel
            )
        linears = ((layout["output"], out), (layout["fc1"], block.mlp_hidden),
                   (layout["fc2"], block.mlp_output))
        for name, dense in linears:
            if proj_bias:
                loader.take(prefix + name + ".bias", dense.bias)
            else:
                loader.zeros([dense.bias])
    if backbone.final_norm is not None:
        common.take_norm(loader, layout["final_norm"], backbone.get_layer("final_norm"))
    if load_head:
        common.take_linear(loader, layout["head"], model.get_layer("predictions"))


def _build(cls, arguments, source_classes, num_classes, overrides):
    """The Keras model, and whether the checkpoint's head is loaded."""
    if num_classes is None:
        if not source_classes:
            raise ValueError(
                "The checkpoint has no classification head; pass "
                "`num_classes` for a new one. Received: num_classes=None"
            )
        num_classes = source_classes
    model = cls(num_classes=num_classes, **common.with_overrides(arguments, overrides))
    return model, num_classes == source_classes


# ----------------------------------------------------------------- timm


TIMM_LAYOUT = dict(
    patch="patch_embed.proj",
    class_token="cls_token",
    position="pos_embed",
    block="blocks.{}.",
    norm1="norm1",
    qkv="attn.qkv",
    output="attn.proj",
    norm2="norm2",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
    head="head",
)


def _unsupported(option, value, hint=""):
    return ValueError(
        f"The timm model's option {option}={value!r} is not covered by "
        f"VisionTransformer.from_timm{hint}."
    )


def _check_patches_tile(patch_embed):
    """timm drops the pixels past the last whole patch; the Keras model's
    patches tile its image."""
    image, patch = tuple(patch_embed.img_size or ()), tuple(patch_embed.patch_size)
    if len(image) == 2 and any(i % p for i, p in zip(image, patch)):
        raise _unsupported(
            "img_size", image, f" with patch_size={patch} (not a multiple: "
            "timm drops the remainder)",
        )


def timm_arguments(model):
    """`(arguments, num_classes, qkv_bias)` of a timm `VisionTransformer`.

    `arguments` are `VisionTransformer`'s constructor arguments; an option
    the Keras model cannot reproduce exactly is a `ValueError` naming it.
    """
    import torch.nn as nn
    from timm.models import vision_transformer as timm_vit

    if type(model) is not timm_vit.VisionTransformer:
        raise ValueError(
            "Expected a timm `VisionTransformer` (a `vit_*` model) or "
            "`SwinTransformer` (`swin_*`). "
            f"Received: {type(model).__module__}.{type(model).__name__}"
        )

    def identity(module):
        return module is None or isinstance(module, nn.Identity)

    pool = model.global_pool
    if pool not in ("token", "avg"):
        raise _unsupported("global_pool", pool)
    if pool == "token" and not model.has_class_token:
        raise _unsupported("global_pool", pool, " without a class token")
    if pool == "avg" and model.has_class_token:
        raise _unsupported(
            "global_pool", pool, " with a class token (mean pooling here has "
            "no class token)"
        )
    if getattr(model, "num_reg_tokens", 0):
        raise _unsupported("reg_tokens", model.num_reg_tokens)
    if getattr(model, "dynamic_img_size", False):
        raise _unsupported("dynamic_img_size", True)
    if getattr(model.patch_embed, "dynamic_img_pad", False):
        raise _unsupported("dynamic_img_pad", True)
    if model.pos_embed is None:
        raise _unsupported("pos_embed", "none")
    for option in ("norm_pre", "patch_drop"):
        if not identity(getattr(model, option, None)):
            raise _unsupported(option, type(getattr(model, option)).__name__)
    if getattr(model, "attn_pool", None) is not None:
        raise _unsupported("global_pool", "map")
    patch_embed = model.patch_embed
    # The hybrids' `HybridEmbed` (a CNN stem: vit_base_r50_*, MobileCLIP's
    # vit_*_mci_*) is not the one patch convolution this model has.
    if type(patch_embed) is not timm_vit.PatchEmbed:
        raise _unsupported("embed_layer", type(patch_embed).__name__)
    if not identity(getattr(patch_embed, "norm", None)):
        raise _unsupported("embed_norm_layer", type(patch_embed.norm).__name__)
    if patch_embed.proj.bias is None:
        raise _unsupported("patch_embed bias", False)
    _check_patches_tile(patch_embed)
    epsilons = set()
    for index, block in enumerate(model.blocks):
        where = f" (blocks.{index})"
        if type(block) is not timm_vit.Block:
            raise _unsupported("block_fn", type(block).__name__, where)
        for option in ("ls1", "ls2"):
            if not identity(getattr(block, option)):
                raise _unsupported("init_values (layer scale)", option, where)
        attention = block.attn
        if type(attention) is not timm_vit.Attention:
            raise _unsupported("attn_layer", type(attention).__name__, where)
        for option in ("q_norm", "k_norm", "norm", "gate"):
            module = getattr(attention, option, None)
            if not identity(module):
                raise _unsupported(f"attn.{option}", type(module).__name__, where)
        mlp = block.mlp
        if type(mlp) is not timm_vit.Mlp:
            raise _unsupported("mlp_layer", type(mlp).__name__, where)
        biases = {linear.bias is not None
                  for linear in (attention.proj, mlp.fc1, mlp.fc2)}
        if biases != {model.blocks[0].attn.proj.bias is not None}:
            raise _unsupported("proj_bias", "mixed", where)
        if not identity(getattr(mlp, "norm", None)):
            raise _unsupported("scale_mlp_norm", True, where)
        act = mlp.act
        if not common.is_exact_gelu(act):
            raise _unsupported("act_layer", repr(act), where)
        for norm in (block.norm1, block.norm2):
            if not isinstance(norm, nn.LayerNorm):
                raise _unsupported("norm_layer", type(norm).__name__, where)
            epsilons.add(norm.eps)
    if not isinstance(model.norm, nn.LayerNorm) and not identity(model.norm):
        raise _unsupported("norm_layer", type(model.norm).__name__, " (norm)")
    if not isinstance(model.fc_norm, nn.LayerNorm) and not identity(model.fc_norm):
        raise _unsupported("fc_norm", type(model.fc_norm).__name__)
    if isinstance(model.norm, nn.LayerNorm) and isinstance(model.fc_norm, nn.LayerNorm):
        raise _unsupported("norm and fc_norm", "both LayerNorm")
    final_norm = None
    for name, where in (("norm", "tokens"), ("fc_norm", "pooled")):
        norm = getattr(model, name)
        if isinstance(norm, nn.LayerNorm):
            final_norm = where
            epsilons.add(norm.eps)
    if len(epsilons) > 1:
        raise _unsupported("LayerNorm eps", sorted(epsilons), " (one for all)")
    head = model.head
    if not (identity(head) or isinstance(head, nn.Linear)):
        raise _unsupported("head", type(head).__name__)
    first = model.blocks[0]
    arguments = dict(
        image_size=tuple(patch_embed.img_size),
        patch_size=tuple(patch_embed.patch_size),
        hidden_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=first.attn.num_heads,
        mlp_dim=first.mlp.fc1.out_features,
        pooling="cls" if pool == "token" else "mean",
        num_channels=patch_embed.proj.in_channels,
        layer_norm_epsilon=epsilons.pop() if epsilons else 1e-6,
        final_norm=final_norm,
        embed_class_token=not model.no_embed_class,
    )
    num_classes = head.out_features if isinstance(head, nn.Linear) else 0
    return arguments, num_classes, first.attn.qkv.bias is not None


def _timm_filtered(tensors, timm_model, source_name):
    """A checkpoint file's tensors as timm's `load_checkpoint` gives them to
    `timm_model`: through its module's `checkpoint_filter_fn` (the original
    Swin layout, with its downsampling at the end of a stage and its `head`;
    a position embedding or patch kernel of another size resampled). A
    tensor of another rank than the model's is refused by name first, and
    whatever else the filter fails on is a `ValueError` naming the file
    (timm's own errors were IndexError, AssertionError, RuntimeError)."""
    import sys

    import torch

    module = sys.modules[type(timm_model).__module__]
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    if filter_fn is None:
        return tensors
    own = timm_model.state_dict()
    for name, array in tensors.items():
        if name in own and np.ndim(array) != own[name].ndim:
            raise ValueError(
                f"{source_name} does not match the model: tensor {name!r} "
                f"of shape {tuple(np.shape(array))}, the model's is "
                f"{tuple(own[name].shape)}; no weight was assigned"
            )
    state = {name: torch.from_numpy(np.array(a)) for name, a in tensors.items()}
    try:
        filtered = filter_fn(state, timm_model)
    except Exception as error:  # noqa: BLE001 - timm's, of any type
        raise ValueError(
            f"{source_name} could not be read as timm reads it (its "
            f"`checkpoint_filter_fn` failed: {type(error).__name__}: "
            f"{error}); no weight was assigned"
        ) from error
    return {name: common._to_numpy(t) for name, t in filtered.items()}


def _timm_model_from_name(model_name, num_classes, model_kwargs):
    try:
        import timm
        import torch
    except ImportError as error:
        raise ValueError(
            "Reading the architecture from `model_name` (the command's "
            "`--timm-model`) needs timm and torch: pip install "
            "\"keras-attention-layers[convert]\"; from Python, without "
            "them, pass `config=` (VisionTransformer's arguments)."
        ) from error
    given = model_kwargs.pop("num_classes", num_classes)
    if given != num_classes:
        raise ValueError(
            "Received an invalid value for argument `model_kwargs`, whose "
            f"num_classes={given!r} is not the checkpoint's {num_classes} "
            "classes (read from its head; pass `num_classes=` for a new "
            f"head). Received: model_kwargs={dict(model_kwargs, num_classes=given)!r}"
        )
    try:
        with torch.device("meta"):  # the structure only, no memory
            return timm.create_model(
                model_name, pretrained=False, num_classes=num_classes,
                **model_kwargs,
            )
    except RuntimeError as error:
        raise ValueError(
            f"timm does not know the model {model_name!r}: {error}"
        ) from error
    except TypeError as error:  # an argument its model class does not take
        raise ValueError(
            f"Received an invalid value for argument `model_kwargs`, which "
            f"timm's {model_name!r} does not take: {error}. Received: "
            f"model_kwargs={model_kwargs!r}"
        ) from error


def from_timm(
    cls, source, model_name=None, config=None, num_classes=None,
    model_kwargs=None, **kwargs,
):
    """See `VisionTransformer.from_timm`."""
    from keras_attention.applications.converters import swin

    timm_model = None
    source = common.unwrap_compiled(source)
    if common.is_torch_module(source):
        timm_model = source  # its tensors are read once its options pass
        name = f"The timm model {type(source).__name__}"
    elif isinstance(source, (str, os.PathLike)):
        tensors = common.read_checkpoint(source)
        name = f"The checkpoint {os.fspath(source)!r}"
        head = tensors.get("head.weight", tensors.get("head.fc.weight"))
        source_classes = 0 if head is None else int(head.shape[0])
        if config is not None:
            arguments = dict(config)
            # Read from every block: one block's missing bias is named
            # as missing, not the others' as unexpected.
            qkv_bias = any(k.endswith(".attn.qkv.bias") for k in tensors)
            proj_bias = any(k.endswith(".attn.proj.bias") for k in tensors)
        elif model_name is not None:
            timm_model = _timm_model_from_name(
                model_name, source_classes, dict(model_kwargs or {})
            )
        else:
            raise ValueError(
                "A timm checkpoint file needs its architecture: pass "
                "`model_name` (e.g. 'vit_base_patch16_224') or `config`."
            )
    else:
        raise ValueError(
            "Received an invalid value for argument `source`, expected a "
            "timm model or a checkpoint file. Received: "
            f"source={type(source).__name__}"
        )
    is_swin = timm_model is not None and swin.is_timm_swin(timm_model)
    if timm_model is not None:
        describe = swin.swin_arguments if is_swin else timm_arguments
        arguments, model_classes, qkv_bias = describe(timm_model)
        if not is_swin:
            proj_bias = timm_model.blocks[0].attn.proj.bias is not None
        if common.is_torch_module(source):
            source_classes = model_classes
            tensors = common.state_dict_arrays(source)
        else:
            tensors = _timm_filtered(tensors, timm_model, name)
    if is_swin and "image_size" in kwargs:
        raise ValueError(
            "A converted Swin keeps its image size (its window grids and "
            "relative position tables are built for it). Received: "
            f"image_size={kwargs['image_size']!r}"
        )
    model, load_head = _build(cls, arguments, source_classes, num_classes, kwargs)
    head = "head.fc" if is_swin else "head"
    ignore = () if load_head else (head + ".weight", head + ".bias")
    loader = common.TensorLoader(tensors, name, ignore=ignore)
    if is_swin:
        swin.fill(model, loader, qkv_bias)
        if load_head:
            common.take_linear(loader, head, model.get_layer("predictions"))
        loader.load()
        return model
    _fill(
        model, loader, {**TIMM_LAYOUT, "final_norm": (
            "fc_norm" if model.backbone.final_norm == "pooled" else "norm"
        )}, qkv_bias, load_head, source_grid=_grid(arguments),
        proj_bias=proj_bias,
    )
    loader.load()
    return model


# ---------------------------------------------------------- transformers


HF_ARCHITECTURES = ("ViTForImageClassification", "ViTModel")

# transformers 5 names its modules anew; its files keep the hub names.
_HF_RENAMES = [
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]


def _hub_name(name):
    for pattern, replacement in _HF_RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def transformers_arguments(config):
    """`VisionTransformer` arguments of a Hugging Face `ViTConfig` dict."""
    model_type = config.get("model_type")
    if model_type != "vit":
        raise ValueError(
            "Expected a Hugging Face ViT (model_type 'vit'; architectures "
            f"{HF_ARCHITECTURES}). Received: model_type={model_type!r}, "
            f"architectures={config.get('architectures')}"
        )
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(
            "The Hugging Face option hidden_act="
            f"{act!r} is not covered by VisionTransformer.from_transformers "
            "(exact 'gelu' only)."
        )
    for option in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "image_size", "patch_size"):
        if option not in config:
            raise ValueError(f"The ViT config has no {option!r}.")
    return dict(
        image_size=config["image_size"],
        patch_size=config["patch_size"],
        hidden_dim=config["hidden_size"],
        depth=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        mlp_dim=config["intermediate_size"],
        pooling="cls",
        num_channels=config.get("num_channels", 3),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        final_norm="tokens",
        embed_class_token=True,
    ), bool(config.get("qkv_bias", True))


def from_transformers(cls, source, num_classes=None, **kwargs):
    """See `VisionTransformer.from_transformers`."""
    config, tensors, name = common.read_transformers_source(
        source, HF_ARCHITECTURES
    )
    arguments, qkv_bias = transformers_arguments(config)
    tensors = {_hub_name(n): t for n, t in tensors.items()}
    prefix = "vit." if any(n.startswith("vit.") for n in tensors) else ""
    head = tensors.get("classifier.weight")
    source_classes = 0 if head is None else int(head.shape[0])
    model, load_head = _build(cls, arguments, source_classes, num_classes, kwargs)
    # The pooler (ViTModel) feeds no classifier of Hugging Face's either.
    ignore = [prefix + "pooler.dense.weight", prefix + "pooler.dense.bias"]
    if not load_head:
        ignore += ["classifier.weight", "classifier.bias"]
    loader = common.TensorLoader(tensors, name, ignore=ignore)
    layout = dict(
        patch=prefix + "embeddings.patch_embeddings.projection",
        class_token=prefix + "embeddings.cls_token",
        position=prefix + "embeddings.position_embeddings",
        block=prefix + "encoder.layer.{}.",
        norm1="layernorm_before",
        query="attention.attention.query",
        key="attention.attention.key",
        value="attention.attention.value",
        output="attention.output.dense",
        norm2="layernorm_after",
        fc1="intermediate.dense",
        fc2="output.dense",
        final_norm=prefix + "layernorm",
        head="classifier",
    )
    # As ViTModel(..., interpolate_pos_encoding=True) at another image size.
    _fill(model, loader, layout, qkv_bias, load_head,
          source_grid=_grid(arguments), antialias=False)
    loader.load()
    return model
