"""The model's outputs while a class activation map is computed.

The layers that produce them (`output_layers`), their activations made
linear and restored after (`linear_outputs`, in place of tf-keras-vis's
`ReplaceToLinear`, which needs `model.output_names` and changes the model
for good), and `model.predict` silenced for tf-keras-vis's `Scorecam`
(`quiet_predict`).
"""

import contextlib
import warnings

import keras
import numpy as np

from keras_attention.visualization import _cam_inputs as inputs_lib
from keras_attention.visualization import _hooks


def output_layers(model, images=None):
    """The layers that produce the model's outputs: read from a graph
    model's outputs or, for a subclassed model, the layers whose output the
    model returns in one eager pass on `images` (empty if unknown). A
    nested graph model there (a `Sequential` head) gives its own output
    layers (its softmax is the model's)."""
    outputs = getattr(model, "outputs", None) or []
    layers = []
    for tensor in outputs:
        history = getattr(tensor, "_keras_history", None)
        if history is None:
            continue
        layer = history.operation
        if isinstance(layer, keras.Model) and getattr(layer, "outputs", None):
            layers.extend(output_layers(layer))
        else:
            layers.append(layer)
    if layers or images is None:
        return layers
    returned = []  # (layer, its output) of every call

    def make(layer):
        def factory(original):
            def call(*args, **kwargs):
                outputs = original(*args, **kwargs)
                returned.append((layer, outputs))
                return outputs

            return call

        return factory

    walked = _hooks.walk(model)
    with _hooks.patched_calls([(layer, make(layer)) for _, layer in walked]):
        result = model(inputs_lib.as_tensor(images), training=False)
    found = [layer for layer, outputs in returned if outputs is result]
    if not found and _look_like_probabilities(result):
        warnings.warn(
            f"{type(model).__name__}'s outputs look like probabilities made "
            "inside its `call` (rows of non-negative numbers summing to 1), "
            "with no output layer whose activation could be made linear: "
            "the class scores read are those probabilities, not the "
            "logits. Apply the softmax with a layer (an activation, or "
            "keras.layers.Softmax) to have it removed.",
            stacklevel=4,
        )
    return found


def _look_like_probabilities(result):
    try:
        values = np.asarray(keras.ops.convert_to_numpy(result), "float64")
    except Exception:  # a structure of outputs: not one score tensor
        return False
    if values.ndim < 2 or values.shape[-1] < 2 or not values.size:
        return False
    return bool(
        (values >= 0).all() and np.allclose(values.sum(-1), 1.0, atol=1e-4)
    )


@contextlib.contextmanager
def linear_outputs(model, images=None):
    """The output layers' activations linear inside the block, then restored.

    As tf-keras-vis's `ReplaceToLinear`, which needs `model.output_names`
    (absent from a Keras 3 `Sequential`) and does not restore them; an
    output `keras.layers.Softmax` passes its inputs through. A subclassed
    model's output layers are found by calling it on `images`.
    """
    layers = output_layers(model, images)
    saved = [
        (layer, layer.activation)
        for layer in layers
        if getattr(layer, "activation", None) is not None
    ]

    def identity(original):
        def call(inputs, *args, **kwargs):
            return inputs

        return call

    # A `keras.layers.Softmax` output has no `activation`: it passes its
    # logits through instead (tf-keras-vis leaves it a softmax).
    softmaxes = [
        (layer, identity) for layer in layers
        if isinstance(layer, keras.layers.Softmax)
    ]
    try:
        for layer, _ in saved:
            layer.activation = keras.activations.linear
        with _hooks.patched_calls(softmaxes):
            yield
    finally:
        for layer, activation in saved:
            layer.activation = activation


@contextlib.contextmanager
def quiet_predict():
    enabled = keras.config.is_interactive_logging_enabled()
    keras.config.disable_interactive_logging()
    try:
        with warnings.catch_warnings():
            # tf-keras-vis passes a one-element list to a one-input model.
            warnings.filterwarnings(
                "ignore", message="The structure of `inputs`", category=UserWarning
            )
            yield
    finally:
        if enabled:
            keras.config.enable_interactive_logging()
