"""The maps of `tape_cam` from the captured features, in NumPy.

Grad-CAM++'s weights and Score-CAM's masked scores as tf-keras-vis
computes them, and token features laid out on the patch grid
(`on_grid`) before any of them (`tape_cam` scales each map to [0, 1]
with `_grid.normalize_maps`).
"""

import keras
import numpy as np

from keras_attention.visualization import _cam_inputs as inputs_lib
from keras_attention.visualization import _grid


def grad_cam_plus_plus(features, grads, scores):
    """Grad-CAM++ weights as tf-keras-vis computes them (exp of the score)."""
    spatial = (1, 2)
    first = np.exp(scores)[:, None, None, None] * grads
    second = first * grads
    third = second * grads
    total = features.sum(axis=spatial, keepdims=True)
    denominator = 2.0 * second + third * total
    denominator = denominator + (second == 0.0)
    alphas = second / denominator
    norm = alphas.sum(axis=spatial, keepdims=True)
    alphas = alphas / (norm + (norm == 0.0))
    weights = (np.maximum(first, 0.0) * alphas).sum(axis=spatial, keepdims=True)
    return np.maximum((weights * features).sum(axis=-1), 0.0)


def score_cam(model, images, indices, features, max_channels, batch_size):
    """Score-CAM as tf-keras-vis computes it (softmax of the outputs, which
    `linear_outputs` makes the logits). A single output (a sigmoid
    classifier's one logit) takes its sigmoid: a softmax over one class is
    1 for every masked copy, a constant map."""
    from scipy.ndimage import zoom

    channels = features.shape[-1]
    if max_channels is not None and max_channels < channels:
        spread = features.std(axis=(1, 2))  # (B, C)
        top = np.argsort(-spread, axis=-1, kind="stable")[:, :max_channels]
        # tf-keras-vis keeps the union over the batch, in first-seen order.
        keep = list(dict.fromkeys(top.reshape(-1).tolist()))
        features = features[..., keep]
    count, channels = len(images), features.shape[-1]
    factors = (1,) + tuple(
        float(s) / float(c) for c, s in zip(features.shape[1:3], images.shape[1:3])
    ) + (1,)
    masks = zoom(features, factors, order=1, mode="nearest")  # (B, H, W, K)
    low = masks.min(axis=(1, 2), keepdims=True)
    high = masks.max(axis=(1, 2), keepdims=True)
    masks = (masks - low) / (high - low + keras.config.epsilon())
    # (K, B, H, W, 1) * (B, H, W, c): one masked copy per channel.
    masked = np.transpose(masks, (3, 0, 1, 2))[..., None] * images[None]
    masked = masked.reshape((-1,) + images.shape[1:])
    outputs = []
    for start in range(0, len(masked), batch_size):
        batch = model(
            inputs_lib.as_tensor(masked[start : start + batch_size]), training=False
        )
        outputs.append(keras.ops.convert_to_numpy(batch))
    outputs = np.concatenate(outputs).reshape(channels, count, -1)
    squash = keras.ops.sigmoid if outputs.shape[-1] == 1 else keras.ops.softmax
    probabilities = keras.ops.convert_to_numpy(squash(outputs.astype("float32")))
    weights = probabilities[:, np.arange(count), indices].T  # (B, K)
    return np.maximum(np.einsum("bhwk,bk->bhw", features, weights), 0.0)


def on_grid(x, images, options):
    """Features or gradients as `(B, h, w, C)` float32 NumPy (tokens laid
    out by `options.class_token` and `options.grid_shape`)."""
    x = np.asarray(keras.ops.convert_to_numpy(x), "float32")
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise ValueError(
            "Expected a feature map (B, h, w, C) or tokens (B, N, C) for "
            f"the class activation map. Received: shape={x.shape}"
        )
    (h, w), has_class_token = _grid.token_grid(
        x.shape[1], images.shape[1:3], options.grid_shape, options.class_token,
        options.known_grids,
    )
    if has_class_token:
        x = x[:, 1:]
    return x.reshape(x.shape[0], h, w, x.shape[-1])
