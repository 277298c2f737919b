"""Vision Transformer classifier whose attention is chosen by registry name.

Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021; with
`attention="local_window"` and a list `depth`, the shifted-window hierarchy
of Swin (Liu et al., 2021).

**The attention plugin contract.** Each encoder block builds its attention
layer with `keras_attention.get(attention, **arguments)`, where `arguments`
are those of `num_heads`, `key_dim` (`C // num_heads`), `dropout` (the
attention dropout), `window_size` and `shift_size` that the layer's
constructor names, updated with the user's `attention_kwargs`. The block
then calls the layer on the normalized tokens and adds its output to them
(pre-norm residual), so the layer must return a tensor of its input's shape:

- a layer registered with `input_kind="grid"` (`"local_window"`, `"cbam"`,
  `"channel"`, `"spatial"`, `"non_local"`, plugins that declare it)
  receives the patch grid `(B, h, w, C)`;
- a `"tokens"` layer receives the tokens `(B, N, C)` (with the class token
  first when `pooling="cls"`).

A layer whose `call` takes `return_attention_scores` gives its scores to
`VisionTransformerBackbone.attention_scores`; one whose `call` takes
`training` gets it; one whose `call` takes `mask` gets the padding mask
(text models).
"""

import keras

from keras_attention._validation import check_bool
from keras_attention import registry
from keras_attention.applications import base as app_base
from keras_attention.applications import presets
from keras_attention.applications.blocks import TransformerEncoderBlock
from keras_attention.applications.patches import PatchEmbedding
from keras_attention.applications.patches import PatchMerging
from keras_attention.applications.patches import TokenPooling
from keras_attention import _validation as base

def _per_stage(argument, value, num_stages, growth):
    """An int (multiplied by `growth**stage`) or one positive int per stage."""
    if isinstance(value, (tuple, list)):
        if len(value) != num_stages:
            raise base.invalid(
                argument, f"an integer or a list of {num_stages} integers "
                "(one per stage of `depth`)", value
            )
        return [base.check_positive_int(argument, v) for v in value]
    base.check_positive_int(argument, value)
    return [value * growth**stage for stage in range(num_stages)]


def _check_attention_kwargs(attention_kwargs):
    """No window_size, shift_size or grid_shape: the model sets them per
    block (the shift alternates), and given here they would disagree with
    them (a window of 2 with the default window's shift, 4 // 2, was an
    error naming shift_size)."""
    if {"window_size", "shift_size", "grid_shape"} & set(attention_kwargs or {}):
        raise base.invalid(
            "attention_kwargs",
            "no window_size, shift_size or grid_shape (the model sets them "
            "per block: pass `window_size=` to the model)",
            attention_kwargs,
        )


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class VisionTransformerBackbone(app_base.ImageBackbone):
    """ViT feature extractor (Dosovitskiy et al., 2021); Swin-style stages.

    Images `(B, H, W, channels)` are cut into `patch_size` patches embedded
    by a strided convolution (`PatchEmbedding`), a learned position embedding
    is added (and a class token put first with `pooling="cls"`), then
    `depth` pre-norm `TransformerEncoderBlock`s run, a final layer
    normalization, and the pooling (class token or mean of the tokens)
    gives one feature vector `(B, C)`.

    With `depth` a list (e.g. `[2, 2]`), the blocks form stages separated by
    `PatchMerging` (the grid halves, the width and, for integer `num_heads`
    and `mlp_dim`, the heads and MLP size double), as in Swin. With
    `attention="local_window"` consecutive blocks alternate the shift
    `0` and `window_size // 2`.

    Args:
        image_size: image side (int) or `(height, width)`.
        patch_size: patch side (int) or `(height, width)`; must divide the
            image size.
        hidden_dim: token size `C` (of the first stage).
        depth: number of encoder blocks, or a list of blocks per stage.
        num_heads: attention heads (an int, or one per stage).
        mlp_dim: MLP hidden size (an int, or one per stage).
        dropout: dropout rate of the embedding, the residual branches and
            the MLP.
        attention_dropout: dropout rate on the attention weights.
        attention: registry name of the attention layer (see the module's
            plugin contract): `"multi_head"`, `"local_window"`, ...
        attention_kwargs: extra constructor arguments of the attention layer.
        window_size: window of window-attention layers (`local_window`).
        pooling: `"cls"` (class token), `"mean"` (mean of the tokens) or
            `"auto"`: `"cls"` for token attention in one stage, else
            `"mean"` (grid layers and patch merging have no class token).
        num_channels: channels of the images.
        layer_norm_epsilon: epsilon of the layer normalizations (timm's ViT
            uses `1e-6`, Hugging Face's `1e-12`).
        final_norm: where the last layer normalization goes: `"tokens"`
            (on every token, before the pooling: the original ViT, timm's
            `norm`), `"pooled"` (on the pooled vector: timm's `fc_norm` of
            the global-pool models) or `None`.
        embed_class_token: with `pooling="cls"`, the position embedding
            covers the class token too (`True`, the original ViT and
            Hugging Face's) or only the patches (timm's `no_embed_class`).
        use_position_embedding: add a learned absolute position embedding
            (`False` for Swin, whose window attention has a relative
            position bias).
        patch_norm: a layer normalization on the embedded patches (Swin).

    Call arguments:
        images: `(B, H, W, num_channels)`.

    Returns:
        Features `(B, C_last)`.

    Raises:
        ValueError: naming the argument: `patch_size` not dividing
            `image_size`; sizes, `depth`, `num_heads` or `mlp_dim` not
            positive integers (or per-stage lists of another length than
            `depth`); `dropout` outside `[0, 1)`; an `attention` the
            registry lacks or that takes neither tokens nor a grid;
            `attention_kwargs` with `window_size`, `shift_size` or
            `grid_shape` (the model sets them); `pooling` or `final_norm`
            not one of theirs (`"cls"` with a grid attention or patch
            merging); images of another shape than
            `(B, *image_size, num_channels)`.

    Example:

    ```python
    backbone = VisionTransformerBackbone(
        image_size=8, patch_size=2, hidden_dim=32, depth=2, num_heads=4,
        mlp_dim=64, num_channels=1,
    )
    backbone(np.zeros((3, 8, 8, 1))).shape  # (3, 32)
    scores = backbone.attention_scores(np.zeros((3, 8, 8, 1)))
    scores[0].shape  # (3, 4, 17, 17): batch, heads, tokens, tokens
    ```

    References:
        - Dosovitskiy et al., An Image is Worth 16x16 Words: Transformers
          for Image Recognition at Scale, 2021.
          https://arxiv.org/abs/2010.11929
        - Liu et al., Swin Transformer, 2021. https://arxiv.org/abs/2103.14030
    """

    scored_blocks = (TransformerEncoderBlock,)

    def __init__(
        self,
        image_size,
        patch_size,
        hidden_dim=64,
        depth=4,
        num_heads=4,
        mlp_dim=128,
        dropout=0.0,
        attention_dropout=0.0,
        attention="multi_head",
        attention_kwargs=None,
        window_size=4,
        pooling="auto",
        num_channels=3,
        layer_norm_epsilon=1e-6,
        final_norm="tokens",
        embed_class_token=True,
        use_position_embedding=True,
        patch_norm=False,
        **kwargs,
    ):
        image_size = base.check_pair("image_size", image_size)
        patch_size = base.check_pair("patch_size", patch_size)
        if any(i % p for i, p in zip(image_size, patch_size)):
            raise base.invalid(
                "patch_size", f"a divisor of image_size={image_size}", patch_size
            )
        base.check_positive_int("hidden_dim", hidden_dim)
        base.check_positive_int("num_channels", num_channels)
        base.check_rate("dropout", dropout)
        if final_norm not in ("tokens", "pooled", None):
            raise base.invalid("final_norm", "'tokens', 'pooled' or None", final_norm)
        embed_class_token = check_bool("embed_class_token", embed_class_token)
        use_position_embedding = check_bool("use_position_embedding", use_position_embedding)
        patch_norm = check_bool("patch_norm", patch_norm)
        depths = (
            list(depth) if isinstance(depth, (list, tuple)) else [depth]
        )
        if not depths:
            raise base.invalid("depth", "a positive integer or a list", depth)
        for d in depths:
            base.check_positive_int("depth", d)
        heads = _per_stage("num_heads", num_heads, len(depths), 2)
        mlp_dims = _per_stage("mlp_dim", mlp_dim, len(depths), 2)
        attention = registry.check_name(attention, kinds=("tokens", "grid"))
        grid_attention = registry.input_kind(attention) == "grid"
        _check_attention_kwargs(attention_kwargs)
        if pooling == "auto":
            pooling = "cls" if len(depths) == 1 and not grid_attention else "mean"
        if pooling not in ("cls", "mean"):
            raise base.invalid("pooling", "'cls', 'mean' or 'auto'", pooling)
        if pooling == "cls" and (grid_attention or len(depths) > 1):
            raise base.invalid(
                "pooling",
                f"'mean' with the grid attention {attention!r} or with patch "
                "merging (the class token is not part of the patch grid)",
                pooling,
            )

        inputs = keras.Input(
            shape=image_size + (num_channels,), name="images"
        )
        x = PatchEmbedding(
            hidden_dim,
            patch_size,
            use_class_token=pooling == "cls",
            embed_class_token=embed_class_token,
            use_position_embedding=use_position_embedding,
            patch_norm_epsilon=layer_norm_epsilon if patch_norm else None,
            name="patch_embedding",
        )(inputs)
        chain = ["patch_embedding"]
        if dropout:
            x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
            chain.append("embedding_dropout")
        grid = (image_size[0] // patch_size[0], image_size[1] // patch_size[1])
        for stage, stage_depth in enumerate(depths):
            if stage:
                merging = PatchMerging(grid, name=f"patch_merging_{stage}")
                x = merging(x)
                grid = merging.output_grid_shape
                chain.append(merging.name)
            for index in range(stage_depth):
                shift = (window_size // 2) if index % 2 else 0
                name = (
                    f"block_{index}"
                    if len(depths) == 1
                    else f"block_{stage}_{index}"
                )
                x = TransformerEncoderBlock(
                    num_heads=heads[stage],
                    mlp_dim=mlp_dims[stage],
                    dropout=dropout,
                    attention_dropout=attention_dropout,
                    attention=attention,
                    attention_kwargs=attention_kwargs,
                    grid_shape=grid,
                    window_size=window_size,
                    shift_size=shift,
                    layer_norm_epsilon=layer_norm_epsilon,
                    name=name,
                )(x)
                chain.append(name)
        if final_norm == "tokens":
            x = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_norm"
            )(x)
            chain.append("final_norm")
        outputs = TokenPooling(pooling, name="pooling")(x)
        if final_norm == "pooled":
            outputs = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_norm"
            )(outputs)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        self.keep_config(locals())
        self.grid_shape = grid
        self._chain = chain


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class VisionTransformer(app_base.Classifier):
    """Vision Transformer image classifier (Dosovitskiy et al., 2021).

    A `VisionTransformerBackbone` and a head (dropout, `Dense(num_classes)`).
    Either give the backbone's arguments, or `backbone=` an existing one
    (fine-tuning: `VisionTransformer(backbone=pretrained.backbone,
    num_classes=2)`, with `backbone.trainable = False` to freeze it).

    Args:
        image_size, patch_size: the image and patch sides (see
            `VisionTransformerBackbone`); needed unless `backbone` is given.
        num_classes: number of classes.
        backbone: an existing `VisionTransformerBackbone`.
        **kwargs: the head's `activation` (`None` gives logits) and
            `head_dropout` (see `Classifier`), and the other arguments of
            `VisionTransformerBackbone` (`hidden_dim`, `depth`, ...; see
            it), ignored when `backbone` is given.

    Call arguments:
        images: `(B, H, W, num_channels)`, floats as the model was trained
            on: the digit presets take pixel values in `[0, 1]`
            (`datasets.load_digits_images`); the model does not
            rescale them (divide `uint8` images by 255).

    Returns:
        Logits (or `activation` outputs) `(B, num_classes)`.

    Raises:
        ValueError: naming the argument: `num_classes` not a positive
            integer, `head_dropout` outside `[0, 1)`, `backbone` not a
            `VisionTransformerBackbone`, or, without one, the backbone's
            arguments as `VisionTransformerBackbone` checks them (required
            ones missing too); inputs of another shape than the backbone's;
            in `fit` and `evaluate`, labels that are not one class id in
            `[0, num_classes)` per example (checked before anything is
            traced).

    Example:

    ```python
    model = VisionTransformer(
        image_size=8, patch_size=2, num_classes=10, hidden_dim=32, depth=2,
        num_heads=4, mlp_dim=64, num_channels=1,
    )
    model.compile(optimizer="adam")  # sparse cross-entropy, accuracy
    model.fit(np.random.rand(16, 8, 8, 1), np.arange(16) % 10, epochs=1)
    swin = VisionTransformer(
        image_size=16, patch_size=2, num_classes=10, hidden_dim=32,
        depth=[2, 2], num_heads=2, mlp_dim=64, num_channels=1,
        attention="local_window", window_size=4,
    )
    ```

    References:
        - Dosovitskiy et al., An Image is Worth 16x16 Words, 2021.
          https://arxiv.org/abs/2010.11929
    """

    backbone_class = VisionTransformerBackbone

    def __init__(
        self,
        image_size=None,
        patch_size=None,
        num_classes=None,
        backbone=None,
        **kwargs,
    ):
        super().__init__(
            backbone,
            num_classes,
            image_size=image_size,
            patch_size=patch_size,
            **kwargs,
        )

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Builds the preset `preset` and loads its shipped weights.

        As `PresetMixin.from_preset`, and another `image_size` (a multiple
        of the preset's `patch_size`) keeps the shipped weights: the
        learned position embedding is resampled to the new patch grid as
        timm does when it loads a checkpoint at another `img_size`
        (bicubic, antialiased; the class token's row kept), for
        fine-tuning at another resolution.

        Example:

        ```python
        model = VisionTransformer.from_preset("vit_digits", image_size=32)
        model.input_shape  # (None, 32, 32, 1)
        ```
        """
        spec = presets.get_preset(preset, cls.__name__)
        size = kwargs.get("image_size")
        same = size is None or base.check_pair("image_size", size) == (
            base.check_pair("image_size", spec.config["image_size"])
        )
        if same or not load_weights or spec.weights is None:
            return super().from_preset(preset, load_weights=load_weights, **kwargs)
        rest = {k: v for k, v in kwargs.items() if k != "image_size"}
        model = super().from_preset(preset, load_weights=False, **kwargs)
        source = super().from_preset(preset, **rest)
        _copy_resampled(source, model)
        return model

    @classmethod
    def from_timm(
        cls, source, model_name=None, config=None, num_classes=None,
        model_kwargs=None, **kwargs,
    ):
        """A `VisionTransformer` with the weights of a timm ViT or Swin.

        Converts timm's `VisionTransformer` exactly (the same logits within
        float rounding, on channels-last images): the patch convolution
        (to a channels-last kernel), class token, position embedding, the
        pre-norm blocks with the fused `qkv` split into the query, key and
        value projections, the LayerNorm epsilon, exact GELU, the final norm
        (`norm`, or `fc_norm` of the global-pool models) and the head.
        timm's `SwinTransformer` (`swin_*`) becomes the Swin mode
        (`attention="local_window"`, stages with `PatchMerging`,
        `patch_norm=True`, no absolute position embedding), its window
        attention loading into `LocalWindowAttention`. The images are
        normalized as timm's model expects (its `pretrained_cfg`
        mean and std); this model does not normalize them.

        Every tensor is checked before any is assigned.

        Args:
            source: a timm model (`timm.create_model(...)`, compiled with
                `torch.compile` or not), or a checkpoint file:
                `.safetensors` (read without torch) or a torch file
                (`.pth`, `.bin`, ...; names under DistributedDataParallel's
                `module.` are read without it).
            model_name: for a file, the timm model name that gives the
                architecture (`"vit_base_patch16_224"`); needs timm. The
                file goes through that model's `checkpoint_filter_fn`
                first, as timm's `load_checkpoint` does (original Swin
                files, another `img_size` in `model_kwargs`).
            config: for a ViT file without timm, `VisionTransformer`'s
                architecture arguments instead of `model_name` (a Swin file
                needs `model_name`).
            num_classes: a new head of this many classes (the checkpoint's
                head is not loaded) when it differs from the checkpoint's;
                needed when the checkpoint has no head.
            model_kwargs: extra arguments of `timm.create_model` for
                `model_name` (e.g. `img_size`).
            **kwargs: other `VisionTransformer` arguments that keep the
                weights' shapes (`dropout`, `attention_dropout`,
                `head_dropout`, `attention` of the same projections, ...),
                and `image_size`: a ViT for another image size, its
                position embedding resampled to the new patch grid as timm
                does (bicubic, antialiased; not for Swin).

        Returns:
            A `VisionTransformer`.

        Raises:
            ValueError: a model or options that the converter does not
                cover (naming the option), or a checkpoint with missing,
                extra or misshapen tensors (naming them); no weight is
                assigned then.

        Example:

        ```python
        import timm
        reference = timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=32,
            num_classes=10,
        )
        model = VisionTransformer.from_timm(reference)
        model(np.zeros((1, 32, 32, 3))).shape  # (1, 10)
        ```

        References:
            - Wightman, PyTorch Image Models (timm).
              https://github.com/huggingface/pytorch-image-models
            - Liu et al., Swin Transformer, 2021.
              https://arxiv.org/abs/2103.14030
        """
        from keras_attention.applications.converters import vit

        return vit.from_timm(
            cls, source, model_name=model_name, config=config,
            num_classes=num_classes, model_kwargs=model_kwargs, **kwargs,
        )

    @classmethod
    def from_transformers(cls, source, num_classes=None, **kwargs):
        """A `VisionTransformer` with the weights of a Hugging Face ViT.

        Converts `ViTForImageClassification` (head included) and `ViTModel`
        (a new head of `num_classes`; its pooler is not used, as Hugging
        Face's classifier does not use it either) exactly: the same logits
        within float rounding, on channels-last images. Every tensor is
        checked before any is assigned.

        Args:
            source: a `transformers` ViT model, or a local folder with
                `config.json` and `model.safetensors` (read without torch)
                or `pytorch_model.bin`: what `save_pretrained` writes, or a
                downloaded hub snapshot.
            num_classes: a new head of this many classes when it differs
                from the checkpoint's; needed for a `ViTModel`.
            **kwargs: other `VisionTransformer` arguments that keep the
                weights' shapes (`dropout`, `head_dropout`, ...), and
                `image_size`: a ViT for another image size, its position
                embedding resampled as Hugging Face's
                `interpolate_pos_encoding=True` does (plain bicubic).

        Returns:
            A `VisionTransformer`.

        Raises:
            ValueError: another architecture or an option not covered
                (`hidden_act` other than `"gelu"`), or missing, extra or
                misshapen tensors (naming them); no weight is assigned then.

        Example:

        ```python
        import transformers
        config = transformers.ViTConfig(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=128, num_labels=10,
        )
        reference = transformers.ViTForImageClassification(config)
        model = VisionTransformer.from_transformers(reference)
        ```

        References:
            - Hugging Face Transformers, ViT.
              https://huggingface.co/docs/transformers/model_doc/vit
        """
        from keras_attention.applications.converters import vit

        return vit.from_transformers(
            cls, source, num_classes=num_classes, **kwargs
        )


def _copy_resampled(source, target):
    """`source`'s weights into `target`, a model of the same configuration
    but its image size: the position embedding resampled to its grid."""
    from keras_attention.applications.converters import common

    source_patch = source.backbone.get_layer("patch_embedding")
    target_patch = target.backbone.get_layer("patch_embedding")
    resampled = None
    if target_patch.use_position_embedding:
        old_grid, new_grid = source_patch.grid_shape, target_patch.grid_shape
        embedding = keras.ops.convert_to_numpy(source_patch.position_embedding)
        prefix = embedding.shape[1] - old_grid[0] * old_grid[1]
        resampled = common.resample_position_embedding(
            embedding, old_grid, new_grid, prefix
        )
    for old, new in zip(source.weights, target.weights, strict=True):
        if resampled is not None and new is target_patch.position_embedding:
            new.assign(resampled)
        else:
            new.assign(old)


# The ViT of the digit presets (4x4 patches, 4 blocks of width 64), for
# one image size or another.
_DIGITS_VIT = dict(
    patch_size=4,
    num_classes=10,
    hidden_dim=64,
    depth=4,
    num_heads=4,
    mlp_dim=128,
    num_channels=1,
)
presets.register_preset(
    "vit_digits",
    "VisionTransformer",
    dict(image_size=16, **_DIGITS_VIT),
    weights="vit_digits.weights.h5",
    description="ViT, 16 patches of 4x4, 4 blocks of width 64, trained on "
    "scikit-learn's 8x8 digits resized to 16x16 (bilinear; "
    "`load_digits_images(image_size=16)`).",
)
presets.register_preset(
    "swin_digits",
    "VisionTransformer",
    dict(
        image_size=16,
        patch_size=2,
        num_classes=10,
        hidden_dim=32,
        depth=[2, 2],
        num_heads=2,
        mlp_dim=64,
        attention="local_window",
        window_size=4,
        num_channels=1,
    ),
    description="Swin-style two-stage ViT with shifted 4x4 windows for "
    "16x16 images (configuration only).",
)
presets.register_preset(
    "vit_mnist",
    "VisionTransformer",
    dict(image_size=28, **_DIGITS_VIT),
    description="ViT, 49 patches of 4x4, for 28x28 MNIST digits "
    "(configuration only).",
)
