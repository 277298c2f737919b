"""Hugging Face DETR checkpoints -> `DETR` with a ResNet backbone.

`DetrForObjectDetection` / `DetrModel` with the timm ResNet backbone of
the published checkpoints (`facebook/detr-resnet-50`, `-101`; timm's
`resnet18`...`resnet152`) or Hugging Face's own `ResNetBackbone`
(`use_timm_backbone=False`) becomes a `DETR(backbone_type="resnet")`:
frozen batch norm statistics into Keras `BatchNormalization` layers,
PyTorch convolutions `(out, in, kh, kw)` into channels-last kernels, each
attention's `q_proj`/`k_proj`/`v_proj`/`out_proj` into this library's
`MultiHeadAttention` (`(D, H, D / H)` and `(H, D / H, D)` kernels), the
post-norm encoder and decoder layers, the decoder's final LayerNorm, the
class head (`num_labels + 1`, the last "no object") and the 3-layer box
MLP. Tensor names are read as the hub files spell them; the module names
of transformers 5 (`o_proj`, `mlp.fc1`, no `conv_encoder`) are mapped to
those first.
"""

import re

from keras_attention import _validation as base
from keras_attention.applications.converters import common

HF_ARCHITECTURES = ("DetrForObjectDetection", "DetrModel")

# timm model -> (block, blocks per stage); `resnet50.a1_in1k` reads as resnet50.
TIMM_RESNETS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}

# transformers 5 module names -> the names in hub files.
_RENAMES = [
    (r"(^|\.)backbone\.model\.", r"\1backbone.conv_encoder.model."),
    (r"\.o_proj\.", ".out_proj."),
    (r"(layers\.\d+)\.mlp\.(fc\d)\.", r"\1.\2."),
]


# DETR argument -> (DetrConfig option, DetrConfig's default): the
# architecture, whose defaults (DETR-R50's) are not DETR's small ones.
_ARCHITECTURE = {
    "num_queries": ("num_queries", 100),
    "hidden_dim": ("d_model", 256),
    "num_heads": ("encoder_attention_heads", 8),
    "num_encoder_layers": ("encoder_layers", 6),
    "num_decoder_layers": ("decoder_layers", 6),
    "feedforward_dim": ("encoder_ffn_dim", 2048),
    "dropout": ("dropout", 0.1),
}
# `DETR(loss_settings=)` key -> DetrConfig option: the loss. DetrConfig's defaults are
# the paper's, as DETR's are, so an option a config leaves out is not
# passed.
_LOSS = {
    "eos_coef": "eos_coefficient",
    "bbox_loss_weight": "bbox_loss_coefficient",
    "giou_loss_weight": "giou_loss_coefficient",
    "class_cost": "class_cost",
    "bbox_cost": "bbox_cost",
    "giou_cost": "giou_cost",
}


def _file_name(name):
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def _unsupported(option, value, hint=""):
    return ValueError(
        f"The DETR config option {option}={value!r} is not covered by "
        f"DETR.from_transformers{hint}."
    )


def _check_last_stage(option, features, indices, stages):
    """DETR reads the backbone's last feature map: it must be the last
    stage's, which is the one this `DETR` reads."""
    hint = f" (DETR then reads another feature map than the last stage's, stage{stages})"
    if features and features[-1] != f"stage{stages}":
        raise _unsupported(f"{option}.out_features", list(features), hint)
    if indices and indices[-1] not in (stages, -1):
        raise _unsupported(f"{option}.out_indices", list(indices), hint)


def _hf_resnet(backbone):
    """`(block, depths, names)` of a Hugging Face `ResNetConfig` dict."""
    block = {"bottleneck": "bottleneck", "basic": "basic"}.get(
        backbone.get("layer_type", "bottleneck")
    )
    if block is None:
        raise _unsupported("backbone_config.layer_type", backbone.get("layer_type"))
    expansion = 4 if block == "bottleneck" else 1
    width = backbone.get("embedding_size", 64)
    depths = tuple(backbone.get("depths", (3, 4, 6, 3)))
    sizes = tuple(backbone.get("hidden_sizes", (256, 512, 1024, 2048)))
    expected = tuple(64 * 2**s * expansion for s in range(len(depths)))
    if width != 64 or sizes != expected:
        raise _unsupported(
            "backbone_config.hidden_sizes/embedding_size", (sizes, width)
        )
    for option in ("downsample_in_bottleneck", "downsample_in_first_stage"):
        if backbone.get(option, False):
            raise _unsupported(f"backbone_config.{option}", True)
    if backbone.get("hidden_act", "relu") != "relu":
        raise _unsupported("backbone_config.hidden_act", backbone["hidden_act"])
    _check_last_stage("backbone_config", backbone.get("out_features"),
                      backbone.get("out_indices"), len(depths))
    return block, depths, "hf"


def _timm_resnet(name, output_stride=None, dilation=False, out_indices=None):
    base_name = str(name).split(".")[0]
    if base_name not in TIMM_RESNETS:
        raise _unsupported(
            "backbone", f"{name} (timm ResNets: {', '.join(TIMM_RESNETS)})"
        )
    if dilation or output_stride not in (None, 32):
        raise _unsupported("dilation (DC5)", True)
    # timm's ResNet features: the stem, then layer1..layer4 (index 4).
    _check_last_stage("backbone", None, out_indices, 4)
    block, depths = TIMM_RESNETS[base_name]
    return block, depths, "timm"


def backbone_arguments(config):
    """`(block, depths, naming)` of the backbone a DETR config describes.

    Reads both the configs of transformers 5 (`backbone_config` with
    `model_type` `"timm_backbone"` or `"resnet"`) and the older hub files
    (`use_timm_backbone`, `backbone`).
    """
    backbone = config.get("backbone_config")
    if isinstance(backbone, dict):
        kind = backbone.get("model_type")
        if kind == "timm_backbone":
            return _timm_resnet(
                backbone.get("backbone"), backbone.get("output_stride"),
                config.get("dilation", False), backbone.get("out_indices"),
            )
        if kind == "resnet":
            return _hf_resnet(backbone)
        raise _unsupported("backbone_config.model_type", kind)
    if config.get("use_timm_backbone", True):
        return _timm_resnet(
            config.get("backbone") or "resnet50", None,
            config.get("dilation", False),
            (config.get("backbone_kwargs") or {}).get("out_indices"),
        )
    return _hf_resnet({})


def detr_arguments(config):
    """`DETR` constructor arguments of a Hugging Face `DetrConfig` dict."""
    if config.get("model_type") != "detr":
        raise ValueError(
            "Expected a Hugging Face DETR (model_type 'detr'; architectures "
            f"{HF_ARCHITECTURES}). Received: model_type="
            f"{config.get('model_type')!r}, architectures="
            f"{config.get('architectures')}"
        )
    for option, supported in (
        ("position_embedding_type", "sine"),
        ("activation_function", "relu"),
    ):
        if config.get(option, supported) != supported:
            raise _unsupported(option, config[option])
    if config.get("auxiliary_loss"):
        raise _unsupported(
            "auxiliary_loss", True, " (Hugging Face's decoder then feeds each "
            "layer the decoder LayerNorm's output, a function this DETR does "
            "not compute; its own `aux_loss` keeps the original DETR's)"
        )
    defaults = dict(_ARCHITECTURE.values())
    for first, second in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(first, defaults[first]) != config.get(
            second, defaults[first]
        ):
            raise _unsupported(f"{first} != {second}", config.get(second))
    block, depths, _ = backbone_arguments(config)
    arguments = {ours: config.get(theirs, default)
                 for ours, (theirs, default) in _ARCHITECTURE.items()}
    loss_settings = {ours: config[theirs]
                     for ours, theirs in _LOSS.items() if theirs in config}
    if loss_settings:
        arguments["loss_settings"] = loss_settings
    return dict(arguments, norm_first=False, backbone_type="resnet",
                resnet_depths=depths, resnet_block=block)


def _unit_names(key, naming):
    """The conv and batch norm names of a `ResNetBackbone` unit."""
    if key == ("stem",):
        if naming == "timm":
            return "conv1", "bn1"
        return ("embedder.embedder.convolution",
                "embedder.embedder.normalization")
    stage, block, part = int(key[0][5:]), int(key[1][5:]), key[2]
    if naming == "timm":
        prefix = f"layer{stage + 1}.{block}."
        if part == "downsample":
            return prefix + "downsample.0", prefix + "downsample.1"
        return prefix + part, prefix + "bn" + part[4:]
    prefix = f"encoder.stages.{stage}.layers.{block}."
    if part == "downsample":
        unit = prefix + "shortcut."
    else:
        unit = prefix + f"layer.{int(part[4:]) - 1}."
    return unit + "convolution", unit + "normalization"


def _take_backbone(loader, backbone, prefix, naming):
    for key, conv, norm in backbone.named_units():
        conv_name, norm_name = _unit_names(key, naming)
        loader.take(prefix + conv_name + ".weight", conv.kernel,
                    lambda w: w.transpose(2, 3, 1, 0))
        for suffix, variable in (
            ("weight", norm.gamma), ("bias", norm.beta),
            ("running_mean", norm.moving_mean),
            ("running_var", norm.moving_variance),
        ):
            loader.take(f"{prefix}{norm_name}.{suffix}", variable)


def _take_attention(loader, name, attention):
    """`q_proj`, `k_proj`, `v_proj`, `out_proj` -> `MultiHeadAttention`."""
    for role, dense in (("q_proj", attention._query_dense),
                        ("k_proj", attention._key_dense),
                        ("v_proj", attention._value_dense)):
        common.take_linear(loader, f"{name}.{role}", dense, tuple(dense.kernel.shape))
    out = attention._output_dense
    common.take_linear(loader, f"{name}.out_proj", out, tuple(out.kernel.shape))


def fill(model, loader, prefix, naming, load_class_head, load_box_head):
    """Queues every variable of a ResNet `DETR` in `loader`."""
    _take_backbone(
        loader, model.backbone, prefix + "backbone.conv_encoder.model.", naming
    )
    loader.take(prefix + "input_projection.weight",
                model.input_projection.kernel, lambda w: w.transpose(2, 3, 1, 0))
    loader.take(prefix + "input_projection.bias", model.input_projection.bias)
    loader.take(prefix + "query_position_embeddings.weight",
                model.query_embedding)
    for index, block in enumerate(model.encoder_layers):
        name = f"{prefix}encoder.layers.{index}."
        _take_attention(loader, name + "self_attn", block.attention_layer)
        common.take_norm(loader, name + "self_attn_layer_norm", block.attention_norm)
        common.take_linear(loader, name + "fc1", block.mlp_hidden)
        common.take_linear(loader, name + "fc2", block.mlp_output)
        common.take_norm(loader, name + "final_layer_norm", block.mlp_norm)
    for index, block in enumerate(model.decoder_layers):
        name = f"{prefix}decoder.layers.{index}."
        _take_attention(loader, name + "self_attn", block.self_attention)
        common.take_norm(loader, name + "self_attn_layer_norm",
                   block.self_attention_norm)
        _take_attention(loader, name + "encoder_attn", block.cross_attention)
        common.take_norm(loader, name + "encoder_attn_layer_norm",
                   block.cross_attention_norm)
        common.take_linear(loader, name + "fc1", block.mlp_hidden)
        common.take_linear(loader, name + "fc2", block.mlp_output)
        common.take_norm(loader, name + "final_layer_norm", block.mlp_norm)
    common.take_norm(loader, prefix + "decoder.layernorm", model.decoder_norm)
    if load_class_head:
        common.take_linear(loader, "class_labels_classifier", model.class_head)
    if load_box_head:
        for index, dense in enumerate(model.box_head):
            common.take_linear(loader, f"bbox_predictor.layers.{index}", dense)


def from_transformers(cls, source, num_classes=None, image_size=(800, 800),
                      **kwargs):
    """See `DETR.from_transformers`."""
    height, width = base.check_pair("image_size", image_size)
    config, tensors, name = common.read_transformers_source(
        source, HF_ARCHITECTURES
    )
    arguments = detr_arguments(config)
    _, _, naming = backbone_arguments(config)
    tensors = {
        _file_name(key): value
        for key, value in tensors.items()
        if not key.endswith("num_batches_tracked")
    }
    prefix = "model." if any(k.startswith("model.") for k in tensors) else ""
    head = tensors.get("class_labels_classifier.weight")
    source_classes = 0 if head is None else int(head.shape[0]) - 1
    if num_classes is None:
        if not source_classes:
            raise ValueError(
                "The checkpoint has no class head (a DetrModel); pass "
                "`num_classes` for a new one. Received: num_classes=None"
            )
        num_classes = source_classes
    load_class_head = num_classes == source_classes
    load_box_head = "bbox_predictor.layers.0.weight" in tensors
    channels = config.get("num_channels", 3)
    if isinstance(config.get("backbone_config"), dict):
        channels = config["backbone_config"].get("num_channels", channels)
    if "loss_settings" in arguments and "loss_settings" in kwargs:
        kwargs["loss_settings"] = {
            **arguments["loss_settings"], **(kwargs["loss_settings"] or {})
        }
    model = cls(num_classes=num_classes, **common.with_overrides(arguments, kwargs))
    model.build((None, height, width, int(channels)))
    ignore = [] if load_class_head else [
        "class_labels_classifier.weight", "class_labels_classifier.bias"
    ]
    loader = common.TensorLoader(tensors, name, ignore=ignore)
    fill(model, loader, prefix, naming, load_class_head, load_box_head)
    loader.load()
    return model


class DETRConverters:
    """`DETR.from_transformers`, kept beside the converter it calls."""

    @classmethod
    def from_transformers(cls, source, num_classes=None, image_size=(800, 800),
                          **kwargs):
        """A `DETR` with the weights of a Hugging Face DETR (ResNet backbone).

        Converts `DetrForObjectDetection` (heads included) and `DetrModel`
        (new class and box heads of `num_classes`) exactly: the same logits
        and boxes within float rounding, on channels-last images, with or
        without a `pixel_mask`. The backbone is the published checkpoints'
        timm ResNet (`resnet18` to `resnet152`; `facebook/detr-resnet-50`
        and `-101`) or Hugging Face's `ResNetBackbone`, with DETR's frozen
        batch norm. Every tensor is checked before any is assigned. Images
        are normalized as the checkpoint expects (ImageNet mean and std for
        the published ones); this model does not normalize them. Hugging
        Face also keeps the stem and first ResNet stage fixed when it
        fine-tunes; here that is `layer.trainable = False` on those
        convolutions of `model.backbone.named_units()`.

        Args:
            source: a `transformers` DETR model, or a local folder with
                `config.json` and `model.safetensors` (read without torch)
                or `pytorch_model.bin`: what `save_pretrained` writes, or a
                downloaded hub snapshot.
            num_classes: a new class head of this many classes (the box
                head is kept) when it differs from the checkpoint's
                `num_labels`; needed for a `DetrModel`.
            image_size: `(height, width)` the model is built for (any size
                runs; the `.keras` file rebuilds at this one).
            **kwargs: other `DETR` arguments that keep the weights' shapes
                (`dropout`, `aux_loss`, `loss_settings`, `transformer_attention`
                with the same projections, ...).

        Returns:
            A `DETR` with `backbone_type="resnet"`.

        Raises:
            ValueError: another architecture or an option not covered
                (learned positions, DC5 dilation, another activation or
                backbone, a backbone read before its last stage, different
                encoder and decoder widths, Hugging Face's
                `auxiliary_loss=True`, whose decoder normalizes between
                layers), or missing,
                extra or misshapen tensors (naming them); no weight is
                assigned then.

        Example:

        ```python
        import transformers
        config = transformers.DetrConfig(
            backbone="resnet18", use_timm_backbone=True, d_model=32,
            encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, num_queries=5, num_labels=3,
        )
        reference = transformers.DetrForObjectDetection(config).eval()
        model = DETR.from_transformers(reference, image_size=64)
        model(np.zeros((1, 64, 64, 3)))["boxes"].shape  # (1, 5, 4)
        ```

        References:
            - Hugging Face Transformers, DETR.
              https://huggingface.co/docs/transformers/model_doc/detr
        """
        return from_transformers(
            cls, source, num_classes=num_classes, image_size=image_size,
            **kwargs,
        )
