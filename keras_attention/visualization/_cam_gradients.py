"""The gradients of Grad-CAM and Grad-CAM++ on the backend in use.

`features_and_gradients(run, indices)` differentiates each image's class
score with respect to the feature tensor that `grad_cam` watches: with a
`tf.GradientTape` on TensorFlow, `jax.grad` on JAX and `torch.autograd` on
torch. `run(watch)` is one eager pass of the model in which the feature
tensor goes through `watch` (which returns the tensor the model goes on
with); it returns `(features, outputs)`. On JAX and torch `watch` adds a
zero tensor and the gradient is taken with respect to that zero, so a
feature tensor that holds no gradient history of its own is covered too.
"""

import keras
import numpy as np

from keras_attention.visualization import _cam_inputs as inputs_lib


def class_scores(outputs, indices):
    """`outputs[b, indices[b]]` in float32: one score per image, `(B,)`."""
    outputs = keras.ops.cast(outputs, "float32")
    picked = keras.ops.take_along_axis(
        outputs, keras.ops.convert_to_tensor(np.asarray(indices)[:, None]), axis=-1
    )
    return picked[:, 0]


def features_and_gradients(run, indices, where):
    """`(features, gradients, scores)` as NumPy arrays.

    Args:
        run: `run(watch) -> (features, outputs)`, see the module docstring.
        indices: the class of each image, `(B,)` ints.
        where: the feature tensor in words, for the error when the scores do
            not depend on it.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        features, grads, scores = _tensorflow(run, indices)
    elif backend == "jax":
        features, grads, scores = _jax(run, indices)
    elif backend == "torch":
        features, grads, scores = _torch(run, indices)
    else:
        raise ValueError(
            "Grad-CAM and Grad-CAM++ need gradients, taken on the TensorFlow, "
            f"JAX or torch backend. Received: backend={backend!r}; use "
            "method='scorecam' (no gradients) or set KERAS_BACKEND."
        )
    if grads is None:
        raise ValueError(
            f"The class score does not depend on the output of {where}; "
            "pick another `layer`."
        )
    as_numpy = keras.ops.convert_to_numpy
    return as_numpy(features), as_numpy(grads), as_numpy(scores)


def _checked_scores(outputs, indices):
    inputs_lib.check_outputs(outputs)
    return class_scores(outputs, indices)


def _tensorflow(run, indices):
    import tensorflow as tf

    tape = tf.GradientTape(watch_accessed_variables=False)

    def watch(tensor):
        tape.watch(tensor)
        return tensor

    with tape:
        features, outputs = run(watch)
        scores = _checked_scores(outputs, indices)
    return features, tape.gradient(scores, features), scores


def _jax(run, indices):
    import jax
    import jax.numpy as jnp

    features, _ = run(lambda tensor: tensor)

    def total_score(zero):
        _, outputs = run(lambda tensor: tensor + zero)
        scores = _checked_scores(outputs, indices)
        return jnp.sum(scores), scores

    grads, scores = jax.grad(total_score, has_aux=True)(jnp.zeros_like(features))
    return features, grads, scores


def _torch(run, indices):
    import torch

    zeros = []

    def watch(tensor):
        zeros.append(torch.zeros_like(tensor, requires_grad=True))
        return tensor + zeros[-1]

    with torch.enable_grad():
        features, outputs = run(watch)
        scores = _checked_scores(outputs, indices)
        (grads,) = torch.autograd.grad(scores.sum(), zeros[:1], allow_unused=True)
    return features, grads, scores
