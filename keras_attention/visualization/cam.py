"""Grad-CAM, Grad-CAM++ and Score-CAM of any image classifier.

Built on tf-keras-vis (`Gradcam`, `GradcamPlusPlus`, `Scorecam` with a
`CategoricalScore`) where it applies: on the TensorFlow backend, a
functional or `Sequential` model whose feature layer is one of its own
top-level layers with a 4-D output. tf-keras-vis builds
`keras.Model(model.inputs, model.outputs + [layer.output])`, which needs
exactly that. For everything else (JAX and torch, subclassed models, a
layer inside a nested model, the tokens of a Vision Transformer, a
half-precision feature map) the same formulas run here: the feature
layer's `call` is patched for one eager pass so that its output (or, for
tokens, the input of the last attention layer) is watched and recorded,
its gradient taken by the backend (`_cam_gradients`: `tf.GradientTape`,
`jax.grad`, `torch.autograd`); tokens are laid out on the patch grid (the
class token dropped) before the map is computed. Both paths share the
score and the upsampling (`scipy` zoom of order 1) of tf-keras-vis, and
each map scaled to [0, 1] (its `normalize`, to its epsilon), and agree to float precision on a model that both can
handle (tested).

Two workarounds for tf-keras-vis 0.8 under Keras 3: its `ReplaceToLinear`
reads `model.output_names`, which a Keras 3 `Sequential` lacks, and it
changes the model for good; the output layers' activations are set to
linear instead (`_cam_outputs.linear_outputs`), only while the map is
computed, and restored after.
Its `Scorecam` calls `model.predict`, whose progress bar is silenced.
"""

import collections
import inspect

import keras
import numpy as np

from keras_attention.visualization import _cam_gradients
from keras_attention.visualization import _cam_inputs as inputs_lib
from keras_attention.visualization import _cam_maps
from keras_attention.visualization import _grid
from keras_attention.visualization import _hooks
from keras_attention.visualization import maps as maps_lib
from keras_attention.visualization._cam_inputs import class_indices
from keras_attention.visualization._cam_outputs import linear_outputs
from keras_attention.visualization._cam_outputs import output_layers  # noqa: F401
from keras_attention.visualization._cam_outputs import quiet_predict

METHODS = ("gradcam", "gradcam++", "scorecam")

# The options of the maps (`grad_cam`'s arguments of the same names), for
# both engines: tf-keras-vis (`tf_keras_vis_cam`, which reads the first
# four) and the `GradientTape` (`tape_cam`); `known_grids`: the model's
# patch grids (`_grid.model_grids`), tried before a token grid is guessed.
CamOptions = collections.namedtuple(
    "CamOptions",
    "expand normalize max_channels batch_size class_token grid_shape known_grids",
    defaults=(True, True, None, 32, "auto", None, ()),
)


class CamTarget:
    """The tensor a class activation map is computed on.

    Attributes:
        layer: the Keras layer.
        path: its path in the model (`"backbone/block_3/attention"`).
        use_input: whether the map uses the layer's first input (the tokens
            entering the last attention layer) instead of its output.
        grid_shape: the `(h, w)` grid of a token output, when the layer
            knows it (a Swin block's window grid); else `None`.
    """

    def __init__(self, layer, path, use_input=False, grid_shape=None):
        self.layer = layer
        self.path = path
        self.use_input = use_input
        self.grid_shape = grid_shape

    def __repr__(self):
        where = "input" if self.use_input else "output"
        return f"CamTarget({self.path!r}, {where})"


def find_cam_target(model, images, layer=None):
    """The feature tensor that `grad_cam` uses for `model`.

    With `layer=None`: the output of the last layer (in the order the calls
    finish, so a residual block wins over the convolution inside it) whose
    output is a 4-D feature map `(B, h, w, C)`, unless a token attention
    layer runs after it (a Vision Transformer); then the tokens `(B, N, C)`
    entering the last such attention layer, as usual for ViTs, because
    after it only the class token (or the pooled tokens) reaches the
    output. A grid attention inside a Transformer block (Swin's window
    attention) is a residual branch, not the feature stream: the last
    such block's output tokens, on its grid, are used instead.

    Args:
        model: the classifier.
        images: a batch it can be called on (one eager pass is run to see
            the shapes when `layer` is `None`).
        layer: `None`, a layer, or its name or path.

    Returns:
        A `CamTarget`.
    """
    _hooks.ensure_built(model, inputs_lib.as_tensor(images), training=False)
    walked = _hooks.walk(model)
    if layer is not None:
        for path, candidate in walked:
            if candidate is layer or (
                isinstance(layer, str)
                and (path == layer or candidate.name == layer)
            ):
                return CamTarget(candidate, path)
        known = ", ".join(path for path, _ in walked)
        raise ValueError(
            "Received an invalid value for argument `layer`, expected a "
            f"layer of the model or its name or path ({known}). Received: "
            f"layer={layer!r}"
        )
    classes = maps_lib.attention_classes()
    finished = []  # (path, layer, output rank, input rank) in finishing order

    def make(path, candidate):
        def factory(original):
            def call(*args, **kwargs):
                outputs = original(*args, **kwargs)
                rank = _rank(outputs)
                first = _first_input(candidate, args, kwargs)
                finished.append((path, candidate, rank, _rank(first)))
                return outputs

            return call

        return factory

    with _hooks.patched_calls(
        [(candidate, make(path, candidate)) for path, candidate in walked]
    ):
        model(inputs_lib.as_tensor(images), training=False)
    last_map = last_tokens = None
    for order, (path, candidate, rank, input_rank) in enumerate(finished):
        if rank == 4:
            last_map = (order, path, candidate)
        if isinstance(candidate, classes) and input_rank == 3:
            last_tokens = (order, path, candidate)
    if last_tokens is not None and (
        last_map is None or last_tokens[0] > last_map[0]
    ):
        return CamTarget(last_tokens[2], last_tokens[1], use_input=True)
    if last_map is not None:
        return _stream_target(walked, last_map[1], last_map[2], classes)
    raise ValueError(
        f"The model {model.name!r} has no layer with a 4-D feature map "
        "(B, h, w, C) and no attention over tokens; pass `layer=`."
    )


def grad_cam(
    model,
    images,
    class_index=None,
    layer=None,
    method="gradcam",
    expand=True,
    normalize=True,
    max_channels=None,
    batch_size=32,
    class_token="auto",
    grid_shape=None,
):
    """Class activation maps: Grad-CAM, Grad-CAM++ or Score-CAM.

    Grad-CAM weights each channel `k` of a feature map `A` by the mean
    gradient of the class score `y_c`, `w_k = mean_ij dy_c / dA_ij^k`, and
    keeps `ReLU(sum_k w_k A^k)`; Grad-CAM++ weights the positive gradients
    with second- and third-order terms; Score-CAM weights each channel by
    the (softmax) class score of the image masked by that channel's
    normalised, upsampled map (the softmax of the logits, as in the
    paper). Scores are read before the output activation: a softmax or
    sigmoid of the output layer is made linear while the map is computed,
    then restored.

    Args:
        model: an image classifier with one output `(B, num_classes)`: a
            user CNN (with `CBAM` layers, say), `CBAMResNet`,
            `VisionTransformer`, any functional, `Sequential`, nested or
            subclassed model.
        images: `(B, height, width, channels)`.
        class_index: the class to explain: `None` (each image's predicted
            class), an int for all images, or one per image.
        layer: the feature layer (a layer, its name or path); default: see
            `find_cam_target` (the last 4-D feature map, or for a ViT the
            tokens entering the last attention layer). A layer with a token
            output `(B, N, C)` is laid out on its patch grid.
        method: `"gradcam"`, `"gradcam++"` or `"scorecam"`.
        expand: upsample the maps to the image size.
        normalize: scale each map to `[0, 1]`.
        max_channels: Score-CAM only: use the channels with the largest
            spatial standard deviation (Faster Score-CAM); default all.
        batch_size: Score-CAM only: batch size of the masked images.
        class_token, grid_shape: for token features: whether the first
            token is a class token (`"auto"` infers it from the number of
            tokens) and the patch grid `(h, w)` (inferred when `None`).

    Returns:
        A NumPy array `(B, height, width)` (`(B, h, w)` without `expand`).

    Example:

    ```python
    inputs = keras.Input((32, 32, 1))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras_attention.layers.CBAM(reduction=4)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    grad_cam(model, np.random.rand(2, 32, 32, 1)).shape  # (2, 32, 32)
    ```

    References:
        - Selvaraju et al., Grad-CAM, ICCV 2017.
          https://arxiv.org/abs/1610.02391
        - Chattopadhyay et al., Grad-CAM++, WACV 2018.
          https://arxiv.org/abs/1710.11063
        - Wang et al., Score-CAM, CVPR Workshops 2020.
          https://arxiv.org/abs/1910.01279
    """
    if method not in METHODS:
        raise ValueError(
            "Received an invalid value for argument `method`, expected one "
            f"of {METHODS}. Received: method={method!r}"
        )
    inputs_lib.check_score_cam_options(max_channels, batch_size)
    images = inputs_lib.check_images(images)
    target = find_cam_target(model, images, layer)
    if getattr(target.layer, "data_format", None) == "channels_first":
        # Its map (B, C, h, w) was read as (B, h, w, C): maps of (C, w).
        raise ValueError(
            "Grad-CAM reads channels-last feature maps (B, h, w, C), and "
            f"the layer {target.path!r} is channels_first: build the model "
            "channels-last, or pass `layer=` a channels-last one. Received: "
            f"data_format={target.layer.data_format!r}"
        )
    indices = class_indices(model, images, class_index)
    options = CamOptions(
        expand,
        normalize,
        max_channels,
        batch_size,
        class_token,
        target.grid_shape if grid_shape is None else grid_shape,
        _grid.model_grids(model),
    )
    # tf-keras-vis's Score-CAM takes a softmax of a single output too (a
    # constant map); ours its sigmoid.
    single = [tuple(o.shape)[-1:] for o in getattr(model, "outputs", None) or []] == [(1,)]
    applies = _tf_keras_vis_applies(model, target) and not (
        method == "scorecam" and single
    )
    engine = tf_keras_vis_cam if applies else tape_cam
    return engine(model, images, indices, target, method, options)


def tf_keras_vis_cam(model, images, indices, target, method, options=CamOptions()):
    """The map from tf-keras-vis, for a top-level 4-D layer of a graph model
    (`options`: a `CamOptions`)."""
    from tf_keras_vis.gradcam import Gradcam
    from tf_keras_vis.gradcam_plus_plus import GradcamPlusPlus
    from tf_keras_vis.scorecam import Scorecam
    from tf_keras_vis.utils.scores import CategoricalScore

    score = CategoricalScore(list(indices))
    kwargs = dict(
        penultimate_layer=target.layer,
        seek_penultimate_conv_layer=False,
        expand_cam=options.expand,
        # Scaled here as the tape path scales: tf-keras-vis divides by
        # `max - min + epsilon`, so a map of small raw values peaked at
        # 0.35 on TensorFlow and at 1 on JAX and torch.
        normalize_cam=False,
    )
    if method == "scorecam":
        # tf-keras-vis refuses a `max_N` above the channel count; all of
        # them is `None` there, as on the tape path (JAX, torch).
        max_n = options.max_channels
        if max_n is not None and max_n >= target.layer.output.shape[-1]:
            max_n = None
        # tf-keras-vis clones the model: the clone takes the linear outputs.
        with quiet_predict(), linear_outputs(model):
            cam = Scorecam(model)(
                score,
                images,
                max_N=max_n,
                batch_size=options.batch_size,
                **kwargs,
            )
    else:
        visualizer = Gradcam if method == "gradcam" else GradcamPlusPlus
        with linear_outputs(model):
            cam = visualizer(model)(score, images, **kwargs)
    cam = np.asarray(cam, "float32")
    return _grid.normalize_maps(cam) if options.normalize else cam


def _stream_target(walked, path, layer, classes):
    """The target for the last 4-D map: a Swin block's window attention
    is a residual branch (its Grad-CAM often negative everywhere, so a
    constant map), the block's output tokens are the feature stream."""
    from keras_attention.applications.blocks import TransformerEncoderBlock

    parent_path = path.rpartition("/")[0]
    parent = dict(walked).get(parent_path)
    if (
        isinstance(layer, classes)
        and isinstance(parent, TransformerEncoderBlock)
        and getattr(parent, "grid_shape", None) is not None
    ):
        return CamTarget(
            parent, parent_path, grid_shape=tuple(parent.grid_shape)
        )
    return CamTarget(layer, path)


def tape_cam(model, images, indices, target, method, options=CamOptions()):
    """The same maps as tf-keras-vis, for any model, on any backend: the
    gradients from `tf.GradientTape`, `jax.grad` or `torch.autograd`
    (`options`: a `CamOptions`)."""
    from scipy.ndimage import zoom

    images = inputs_lib.check_images(images)
    indices = np.asarray(indices)
    if method == "scorecam":
        features = _capture(model, images, target)
        features = _cam_maps.on_grid(features, images, options)
        with linear_outputs(model, images):
            cam = _cam_maps.score_cam(
                model, images, indices, features, options.max_channels,
                options.batch_size,
            )
    else:
        def run(watch):
            return _capture(model, images, target, watch, return_outputs=True)

        with linear_outputs(model, images):
            features, grads, scores = _cam_gradients.features_and_gradients(
                run, indices, target
            )
        features = _cam_maps.on_grid(features, images, options)
        grads = _cam_maps.on_grid(grads, images, options)
        if method == "gradcam":
            weights = grads.mean(axis=(1, 2), keepdims=True)
            cam = np.maximum((features * weights).sum(axis=-1), 0.0)
        else:
            cam = _cam_maps.grad_cam_plus_plus(features, grads, scores)
    if options.expand:
        factors = (1,) + tuple(
            float(s) / float(c) for c, s in zip(cam.shape[1:], images.shape[1:3])
        )
        cam = zoom(cam, factors, order=1)
    return (_grid.normalize_maps(cam) if options.normalize else cam).astype("float32")


def _capture(model, images, target, watch=None, return_outputs=False):
    """The target tensor of one eager pass; `watch(tensor)` (see
    `_cam_gradients`), if given, replaces it for the rest of the pass."""
    captured = []

    def factory(original):
        def call(*args, **kwargs):
            if target.use_input:
                if not captured:
                    args, kwargs, tensor = _watch_first_input(
                        target.layer, args, kwargs, watch
                    )
                    captured.append(tensor)
                return original(*args, **kwargs)
            outputs = original(*args, **kwargs)
            if not captured:
                if not keras.ops.is_tensor(outputs):
                    raise ValueError(
                        f"The layer {target.path!r} returns {type(outputs)}, "
                        "not one tensor; pick another `layer`."
                    )
                if watch is not None:
                    outputs = watch(outputs)
                captured.append(outputs)
            return outputs

        return call

    with _hooks.patched_calls([(target.layer, factory)]):
        outputs = model(inputs_lib.as_tensor(images), training=False)
    if not captured:
        raise ValueError(f"The layer {target.path!r} did not run in the model.")
    inputs_lib.check_features(captured[0], target)
    if return_outputs:
        return captured[0], outputs
    return captured[0]


def _watch_first_input(layer, args, kwargs, watch):
    """`(args, kwargs, tensor)` with the query tensor replaced by
    `watch(query)`."""
    args, kwargs = list(args), dict(kwargs)
    if args:
        holder, key = args, 0
    else:
        holder, key = kwargs, next(iter(inspect.signature(layer.call).parameters))
    first = holder[key]
    tensor = first[0] if isinstance(first, (list, tuple)) else first
    if watch is not None:
        tensor = watch(tensor)
        if isinstance(first, (list, tuple)):
            holder[key] = type(first)([tensor, *first[1:]])
        else:
            holder[key] = tensor
    return tuple(args), kwargs, tensor


def _tf_keras_vis_applies(model, target):
    """Whether tf-keras-vis can extract the target from the model's graph
    (in float32: its Grad-CAM++ and Score-CAM mix a half-precision feature
    map with float32 weights, which TensorFlow refuses)."""
    inputs = getattr(model, "inputs", None)
    outputs = getattr(model, "outputs", None)
    if keras.backend.backend() != "tensorflow":  # tf-keras-vis runs TF ops
        return False
    if target.use_input or not inputs or not outputs:
        return False
    if len(inputs) != 1 or len(outputs) != 1:
        return False
    if not any(layer is target.layer for layer in model.layers):
        return False
    # A layer called more than once, in this model or in another one that
    # shares it: its `output` is the first call's, maybe of another graph
    # ("Output with path `1` is not connected to `inputs`").
    if len(getattr(target.layer, "_inbound_nodes", ())) != 1:
        return False
    try:
        output = target.layer.output
        return len(output.shape) == 4 and output.dtype == "float32"
    except (AttributeError, ValueError):
        return False


def _rank(x):
    shape = getattr(x, "shape", None)
    return None if shape is None else len(shape)


def _first_input(layer, args, kwargs):
    if args:
        first = args[0]
    elif kwargs:
        try:
            name = next(iter(inspect.signature(layer.call).parameters))
            first = kwargs.get(name)
        except (TypeError, ValueError, StopIteration):
            return None
    else:
        return None
    return first[0] if isinstance(first, (list, tuple)) and first else first
