"""timm Swin Transformer checkpoints -> `VisionTransformer` in Swin mode.

timm's `SwinTransformer` (`swin_*`) becomes a `VisionTransformer` with
`attention="local_window"`, a list `depth` (stages separated by
`PatchMerging`), `patch_norm=True`, no absolute position embedding, mean
pooling after the final norm. Each block's window attention is this
library's `LocalWindowAttention`, whose fused `qkv` and relative position
bias table have timm's layout, so they load as they are (transposed
kernels only).
"""

from keras_attention.applications.converters import common
from keras_attention.layers.local_window import window_geometry


def _unsupported(option, value, where=""):
    return ValueError(
        f"The timm Swin model's option {option}={value!r}{where} is not "
        "covered by VisionTransformer.from_timm."
    )


def is_timm_swin(model):
    try:
        from timm.models import swin_transformer as timm_swin
    except ImportError:
        return False
    return type(model) is timm_swin.SwinTransformer


def swin_arguments(model):
    """`(arguments, num_classes, qkv_bias)` of a timm `SwinTransformer`."""
    import torch.nn as nn
    from timm.models import swin_transformer as timm_swin

    if getattr(model, "absolute_pos_embed", None) is not None:
        raise _unsupported("ape (absolute position embedding)", True)
    patch_embed = model.patch_embed
    if not isinstance(patch_embed.norm, nn.LayerNorm):
        raise _unsupported("patch_norm", False)
    if model.head.global_pool.pool_type != "avg":
        raise _unsupported("global_pool", model.head.global_pool.pool_type)
    epsilons = {model.norm.eps, patch_embed.norm.eps}
    window = None
    # Without query/key/value biases (`qkv_bias=False`), ours load zeros.
    qkv_bias = model.layers[0].blocks[0].attn.qkv.bias is not None
    for stage, layer in enumerate(model.layers):
        downsample = layer.downsample
        if (stage == 0) != isinstance(downsample, nn.Identity):
            raise _unsupported("downsample", type(downsample).__name__,
                               f" (layers.{stage})")
        if stage:
            if type(downsample) is not timm_swin.PatchMerging:
                raise _unsupported("downsample", type(downsample).__name__)
            if downsample.norm.eps != 1e-5:
                raise _unsupported("PatchMerging eps", downsample.norm.eps)
        for index, block in enumerate(layer.blocks):
            where = f" (layers.{stage}.blocks.{index})"
            if type(block) is not timm_swin.SwinTransformerBlock:
                raise _unsupported("block", type(block).__name__, where)
            # `dynamic_mask` (`strict_img_size=False`) computes the same
            # mask at run time: exact at the converted model's image size.
            if getattr(block, "always_partition", False):
                raise _unsupported("always_partition", True, where)
            size = tuple(block.window_size)
            window = window or size
            grid = tuple(block.input_resolution)
            if size[0] != size[1]:
                raise _unsupported(
                    "window_size", size, f"{where} (square windows only)"
                )
            if size != window:
                # timm shrinks a window to a grid smaller than it: the size
                # it was given is the first stage's.
                raise _unsupported(
                    "window_size", window, f"{where} (its {grid[0]} x "
                    f"{grid[1]} patch grid is smaller than the window, which "
                    f"timm shrinks to {size}; or the windows differ)"
                )
            if grid[0] % size[0] or grid[1] % size[1]:
                # timm pads such a grid with zeros that are attended to;
                # LocalWindowAttention masks its padding out.
                raise _unsupported(
                    "window_size", size, f"{where} with img_size="
                    f"{tuple(patch_embed.img_size)} (the {grid[0]} x "
                    f"{grid[1]} patch grid is not a multiple of the window)"
                )
            # Ours shifts both axes or neither (`window_geometry`); timm
            # stops shifting an axis as long as the window on its own.
            shift = window_geometry(grid[0], grid[1], size[0],
                                    size[0] // 2 if index % 2 else 0)[1]
            if tuple(block.shift_size) != (shift, shift):
                raise _unsupported(
                    "img_size", tuple(patch_embed.img_size),
                    f"{where} (timm shifts its windows by "
                    f"{tuple(block.shift_size)} on the {grid[0]} x {grid[1]} "
                    "grid: one axis only; a grid whose sides both exceed the "
                    "window, or both equal it, converts)"
                )
            attention = block.attn
            if attention.qkv.out_features != 3 * attention.dim:
                # timm's `head_dim`: heads of another size than dim / heads.
                raise _unsupported(
                    "head_dim", attention.qkv.out_features // 3 // attention.num_heads,
                    f"{where} (dim {attention.dim}, {attention.num_heads} heads)",
                )
            if (block.attn.qkv.bias is not None) != qkv_bias:
                raise _unsupported("qkv_bias", not qkv_bias, where + " (blocks differ)")
            act = block.mlp.act
            if not common.is_exact_gelu(act):
                raise _unsupported("act_layer", repr(act), where)
            epsilons.update((block.norm1.eps, block.norm2.eps))
    if len(epsilons) > 1:
        raise _unsupported("LayerNorm eps", sorted(epsilons))
    first = [layer.blocks[0] for layer in model.layers]
    head = model.head.fc
    arguments = dict(
        image_size=tuple(patch_embed.img_size),
        patch_size=tuple(patch_embed.patch_size),
        hidden_dim=patch_embed.proj.out_channels,
        depth=[len(layer.blocks) for layer in model.layers],
        num_heads=[block.attn.num_heads for block in first],
        mlp_dim=[block.mlp.fc1.out_features for block in first],
        attention="local_window",
        window_size=window[0],
        pooling="mean",
        num_channels=patch_embed.proj.in_channels,
        layer_norm_epsilon=epsilons.pop(),
        final_norm="tokens",
        use_position_embedding=False,
        patch_norm=True,
    )
    num_classes = head.out_features if isinstance(head, nn.Linear) else 0
    return arguments, num_classes, qkv_bias


def fill(model, loader, qkv_bias=True):
    """Queues every variable of a Swin-mode `model` in `loader`; without
    `qkv_bias`, the fused `qkv` bias is set to zero (exact)."""
    backbone = model.backbone
    patch = backbone.get_layer("patch_embedding")
    loader.take("patch_embed.proj.weight", patch.projection.kernel,
                common.conv_kernel)
    loader.take("patch_embed.proj.bias", patch.projection.bias)
    common.take_norm(loader, "patch_embed.norm", patch.norm)
    depths = backbone.depth if isinstance(backbone.depth, (list, tuple)) else [backbone.depth]
    for stage, stage_depth in enumerate(depths):
        if stage:
            merging = backbone.get_layer(f"patch_merging_{stage}")
            prefix = f"layers.{stage}.downsample."
            common.take_norm(loader, prefix + "norm", merging.norm)
            loader.take(prefix + "reduction.weight", merging.reduction.kernel,
                        common.dense_kernel)
        for index in range(stage_depth):
            name = f"block_{index}" if len(depths) == 1 else f"block_{stage}_{index}"
            block = backbone.get_layer(name)
            attention = block.attention_layer
            prefix = f"layers.{stage}.blocks.{index}."
            common.take_norm(loader, prefix + "norm1", block.attention_norm)
            loader.take(prefix + "attn.relative_position_bias_table",
                        attention.relative_position_bias_table)
            if qkv_bias:
                common.take_linear(loader, prefix + "attn.qkv", attention.qkv)
            else:
                loader.take(prefix + "attn.qkv.weight", attention.qkv.kernel,
                            common.dense_kernel)
                loader.zeros([attention.qkv.bias])
            common.take_linear(
                loader, prefix + "attn.proj", attention.output_dense
            )
            common.take_norm(loader, prefix + "norm2", block.mlp_norm)
            common.take_linear(loader, prefix + "mlp.fc1", block.mlp_hidden)
            common.take_linear(loader, prefix + "mlp.fc2", block.mlp_output)
    common.take_norm(loader, "norm", backbone.get_layer("final_norm"))
