"""Attention rollout (Abnar & Zuidema, 2020) for ViT-like models."""

import numpy as np

from keras_attention.layers.multi_head import MultiHeadAttention
from keras_attention.visualization import _grid
from keras_attention.visualization import maps as maps_lib

HEAD_FUSIONS = ("mean", "max", "min")


def _check_options(head_fusion, discard_ratio):
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(
            "Received an invalid value for argument `head_fusion`, expected "
            f"one of {HEAD_FUSIONS}. Received: head_fusion={head_fusion!r}"
        )
    if (
        isinstance(discard_ratio, bool)
        or not isinstance(discard_ratio, (int, float))
        or not 0.0 <= discard_ratio < 1.0
    ):
        raise ValueError(
            "Received an invalid value for argument `discard_ratio`, expected "
            f"a float in [0, 1). Received: discard_ratio={discard_ratio!r}"
        )


def _check_self_attention(path, weights):
    """Raise, naming the layer, unless `weights` are one self-attention
    over all tokens: `(B, H, N, N)` or `(B, N, N)`."""
    shape = np.shape(weights) if not isinstance(weights, tuple) else None
    if shape is None or len(shape) not in (3, 4) or shape[-1] != shape[-2]:
        raise ValueError(
            "Received an invalid value for argument `layers`, expected "
            "self-attention layers over all the tokens, with weights "
            f"(B, H, N, N) or (B, N, N); the layer {path!r} gives "
            f"{shape if shape is not None else 'several maps'} (a windowed or "
            "grid attention has no rollout; `grad_cam` works on any model). "
            f"Received: layers including {path!r}"
        )


def rollout_matrices(attentions, head_fusion="mean", discard_ratio=0.0):
    """The rolled-out attention `(B, N, N)` of a list of layers' weights.

    Each layer's weights `(B, H, N, N)` (or `(B, N, N)`) are fused over the
    heads, the `discard_ratio` fraction of the smallest entries of each
    `N x N` matrix is set to zero (off the diagonal), the residual
    connection is added as the identity, `A = W + I`, and the rows are
    normalised to sum to 1. The rollout is the product
    `A_L ... A_2 A_1`: row `i` says how much each input token flows into
    token `i` of the last layer.

    Args:
        attentions: list of arrays, first layer first.
        head_fusion: `"mean"`, `"max"` or `"min"` over the heads.
        discard_ratio: fraction in `[0, 1)` of the lowest weights dropped.

    Returns:
        A NumPy array `(B, N, N)`.
    """
    _check_options(head_fusion, discard_ratio)
    if not attentions:
        raise ValueError(
            "Received an invalid value for argument `attentions`, expected a "
            "non-empty list of attention weights. Received: attentions=[]"
        )
    rollout = None
    for weights in attentions:
        weights = _grid.as_numpy(weights, "float64")
        if weights.ndim == 4:  # (B, H, N, N)
            weights = getattr(np, head_fusion)(weights, axis=1)
        if weights.ndim != 3 or weights.shape[1] != weights.shape[2]:
            raise ValueError(
                "Received an invalid value for argument `attentions`, expected "
                "self-attention weights (B, H, N, N) or (B, N, N). Received: "
                f"shape={weights.shape}"
            )
        batch, n, _ = weights.shape
        eye = np.eye(n, dtype=bool)
        if discard_ratio > 0:
            count = int(n * (n - 1) * discard_ratio)
            off_diagonal = np.flatnonzero(~eye)
            flat = weights.reshape(batch, n * n).copy()
            lowest = np.argsort(
                flat[:, off_diagonal], axis=1, kind="stable"
            )[:, :count]
            np.put_along_axis(flat, off_diagonal[lowest], 0.0, axis=1)
            weights = flat.reshape(batch, n, n)
        mixed = weights + np.eye(n)  # the residual path
        mixed = mixed / mixed.sum(axis=-1, keepdims=True)
        if rollout is None:
            rollout = mixed
        elif rollout.shape != mixed.shape:
            raise ValueError(
                "Attention rollout needs every layer to attend over the same "
                f"tokens. Received weights of shapes {rollout.shape} and "
                f"{mixed.shape} (use `layers=` to pick the layers)."
            )
        else:
            rollout = mixed @ rollout
    return rollout


def attention_rollout(
    model,
    images,
    head_fusion="mean",
    discard_ratio=0.0,
    layers=None,
    class_token="auto",
    grid_shape=None,
    upsample=False,
):
    """Attention rollout (Abnar & Zuidema, 2020) of a ViT-like model.

    The self-attention weights of the model's `MultiHeadAttention` layers
    (in the order they run, from `attention_maps`) are fused over the heads,
    mixed with the identity for the residual connections, renormalised and
    multiplied through the layers (see `rollout_matrices`). The map of an
    image is the class token's row over the patch tokens when the model has
    a class token, else the mean of all rows, laid out on the patch grid.

    Args:
        model: a model whose attention layers attend over the patch tokens
            (`VisionTransformer`, or any model of `MultiHeadAttention`
            self-attention layers on tokens of the same length).
        images: `(B, height, width, channels)`, what the model is called on.
        head_fusion: `"mean"`, `"max"` or `"min"` over the heads.
        discard_ratio: fraction in `[0, 1)` of the lowest attention weights
            of each layer set to zero (Gildenblat's filtering); `0` is the
            paper's rollout.
        layers: optional paths or names of the layers to use (multiplied
            in the order the model runs them, whatever the order given);
            default every `MultiHeadAttention` layer.
        class_token: `"auto"` (a class token first when the number of
            tokens is one more than a patch grid), `True` or `False`.
        grid_shape: optional `(h, w)` of the patch grid; inferred from the
            number of tokens and the image size otherwise.
        upsample: resize the maps to the image size (bilinear).

    Returns:
        A NumPy array `(B, h, w)` (or `(B, height, width)` with `upsample`):
        how much of each patch flows into the class token (rows sum to at
        most 1).

    Example:

    ```python
    model = keras_attention.applications.VisionTransformer(
        image_size=8, patch_size=2, num_classes=10, hidden_dim=32, depth=2,
        num_heads=4, mlp_dim=64, num_channels=1,
    )
    attention_rollout(model, np.random.rand(3, 8, 8, 1)).shape  # (3, 4, 4)
    ```

    References:
        - Abnar & Zuidema, Quantifying Attention Flow in Transformers, ACL
          2020. https://arxiv.org/abs/2005.00928
    """
    _check_options(head_fusion, discard_ratio)
    images = _grid.as_numpy(images)
    _grid.check_image_batch(images)
    if layers is not None and not len(layers):
        raise ValueError(
            "Received an invalid value for argument `layers`, expected `None` "
            "(every `MultiHeadAttention` layer) or at least one path or name. "
            f"Received: layers={layers!r}"
        )
    if layers is None:
        layers = [
            path
            for path, layer in maps_lib.attention_layers(model).items()
            if isinstance(layer, MultiHeadAttention)
        ]
        if not layers:
            raise ValueError(
                "Attention rollout needs `MultiHeadAttention` layers; the "
                f"model {model.name!r} has none (pass `layers=`, or use "
                "`grad_cam` for a model of windowed or grid attention)."
            )
    weights = maps_lib.attention_maps(model, images, layers=layers)
    attentions = []
    for path, value in weights.items():
        for call in value if isinstance(value, list) else [value]:
            _check_self_attention(path, call)
            attentions.append(call)
    rollout = rollout_matrices(attentions, head_fusion, discard_ratio)
    num_tokens = rollout.shape[-1]
    (h, w), has_class_token = _grid.token_grid(
        num_tokens, images.shape[1:3], grid_shape, class_token,
        _grid.model_grids(model),
    )
    if has_class_token:
        flow = rollout[:, 0, 1:]
    else:
        flow = rollout.mean(axis=1)
    result = flow.reshape(-1, h, w).astype("float32")
    if upsample:
        result = _grid.resize_maps(result, images.shape[1:3])
    return result
