"""Tokens <-> patch grid, resizing maps to an image, and the check of a
batch of images."""


import keras
import numpy as np

from keras_attention.ops.masks import widened


def model_grids(model):
    """The patch grids `(h, w)` the layers of `model` (and the model) know:
    a patch embedding's and a ViT's `grid_shape`, a Swin block's, a patch
    merging's `output_grid_shape`. Non-square patches (`patch_size=(2, 8)`)
    make a grid that the tokens and the image alone cannot tell."""
    from keras_attention.visualization._hooks import walk

    grids = []
    for layer in [model] + [layer for _, layer in walk(model)]:
        for name in ("grid_shape", "output_grid_shape"):
            grid = getattr(layer, name, None)
            if (
                isinstance(grid, (tuple, list)) and len(grid) == 2
                and all(isinstance(v, int) for v in grid)
                and tuple(grid) not in grids
            ):
                grids.append(tuple(grid))
    return grids


def token_grid(num_tokens, image_shape=None, grid_shape=None, class_token="auto",
               known_grids=()):
    """`(grid_shape, has_class_token)` for a sequence of `num_tokens` tokens.

    With `grid_shape` given, the class token is there when
    `num_tokens == h * w + 1`. Otherwise the first of `known_grids` (the
    model's, `model_grids`) that the tokens fill, else the grid whose
    cells have the image's aspect ratio (a square for a square image or no
    image), first without a class token, then with one in front.

    Args:
        num_tokens: `N`, the length of the token axis.
        image_shape: optional `(height, width)` of the images.
        grid_shape: optional `(h, w)`.
        class_token: `"auto"`, `True` (the first token is a class token) or
            `False`.
        known_grids: `(h, w)` grids to try first.
    """
    if class_token not in ("auto", True, False):
        raise ValueError(
            "Received an invalid value for argument `class_token`, expected "
            f"'auto', True or False. Received: class_token={class_token!r}"
        )
    candidates = {"auto": (0, 1), True: (1,), False: (0,)}[class_token]
    if grid_shape is None:
        grid_shape = next(
            (g for extra in candidates for g in known_grids
             if g[0] * g[1] + extra == num_tokens),
            None,
        )
    if grid_shape is not None:
        h, w = (int(v) for v in grid_shape)
        for extra in candidates:
            if h * w + extra == num_tokens:
                return (h, w), bool(extra)
        raise ValueError(
            "Received an invalid value for argument `grid_shape`, expected "
            f"h * w to be the number of tokens {num_tokens} (or one less, "
            f"with a class token). Received: grid_shape={tuple(grid_shape)}"
        )
    for extra in candidates:
        n = num_tokens - extra
        for rows in range(1, n + 1):
            if n % rows:
                continue
            cols = n // rows
            if image_shape is None:
                fits = rows == cols
            else:
                # Square patches tiling the image, e.g. 16x16 pixels each.
                height, width = image_shape
                fits = (
                    height % rows == 0
                    and width % cols == 0
                    and height // rows == width // cols
                )
            if fits:
                return (rows, cols), bool(extra)
    raise ValueError(
        f"Cannot lay out {num_tokens} tokens on a patch grid"
        + (f" of an image of size {tuple(image_shape)}" if image_shape else "")
        + "; pass `grid_shape=(h, w)` (and `class_token`). Received: "
        f"num_tokens={num_tokens}"
    )


def as_numpy(x, dtype=None):
    """`x` as a NumPy array: a backend tensor through keras (a torch tensor
    that records gradients is detached; float16 or bfloat16 widened to
    float32), anything else through NumPy; `None` stays `None`."""
    if x is None:
        return None
    if keras.ops.is_tensor(x):
        x = keras.ops.convert_to_numpy(widened(x))
    return np.asarray(x, dtype)


def resize_maps(maps, size):
    """Bilinear resize of maps `(B, h, w)` (or `(h, w)`) to `size`."""
    maps = as_numpy(maps, "float32")
    squeeze = maps.ndim == 2
    if squeeze:
        maps = maps[None]
    if tuple(maps.shape[1:3]) != tuple(size):
        maps = keras.ops.convert_to_numpy(
            keras.ops.image.resize(
                maps[..., None], tuple(size), interpolation="bilinear",
                data_format="channels_last",
            )
        )[..., 0]
    return maps[0] if squeeze else maps


def normalize_maps(maps):
    """Each map scaled to `[0, 1]` (min to 0, max to 1; flat maps give 0)."""
    maps = as_numpy(maps, "float32")
    axes = tuple(range(1, maps.ndim))
    low = maps.min(axis=axes, keepdims=True)
    span = maps.max(axis=axes, keepdims=True) - low
    return np.where(span > 0, (maps - low) / np.where(span > 0, span, 1), 0.0)


def check_image_batch(images):
    """Raise unless the array `images` is a batch `(B, height, width,
    channels)`."""
    if images.ndim != 4:
        raise ValueError(
            "Received an invalid value for argument `images`, expected a "
            "batch (B, height, width, channels). Received: "
            f"images.shape={images.shape}"
        )
