"""Base classes of the applications: backbone, classifier task, mixins.

In the manner of keras-hub, a classification application is split in two
functional models:

- a **backbone** (`Backbone` subclass) maps the inputs to one feature vector
  per sample;
- a **classifier** (`Classifier` subclass) puts a head (dropout, then a
  `Dense` layer with `num_classes` units) on a backbone.

Both are `keras.Model`s whose `get_config` holds their constructor
arguments, so they save and load as `.keras` files with no `custom_objects`.
Every application (classifiers, translators, DETR, GAT) takes its presets
from `PresetMixin`; those with compile defaults (classifiers, translators,
GAT) take `compile` and `compile_from_config` from `CompileDefaults`
(`compiling.py`, with `xla_slower_here` and the decoding loops'
`CompiledLoops`). A preprocessor (text,
translation) is a plain serializable object with `__call__(inputs)` and
`get_config()` / `from_config()`; the task holding it keeps it in its
config.
"""



import inspect
import warnings

import keras
from keras import ops

from keras_attention import _validation
from keras_attention.layers import base as layer_base
from keras_attention.applications import presets as preset_registry
from keras_attention.applications.compiling import CompileDefaults
from keras_attention.applications.input_checks import InputChecks
from keras_attention.applications.input_checks import batch_size
from keras_attention._config import DTypeArgument
from keras_attention._weights import AllOrNothingWeights
from keras_attention._config import FunctionalConfig
from keras_attention._config import dtype_config
from keras_attention._config import build_with_graph_state
from keras_attention._config import collections_of_new_objects
from keras_attention._config import graph_state_config

PACKAGE = preset_registry.PACKAGE


class PresetMixin:
    """`presets()` and `from_preset(name)` from the one preset registry.

    A preset names its class (`Preset.class_name`), so `from_preset` only
    builds presets of the class it is called on. A task that can take a
    new head defines `with_preset_classes(num_classes, spec, config)`:
    `from_preset(name, num_classes=K)` with another `K` than the preset's
    then builds the preset and asks it for a model with `K` classes.
    """

    @classmethod
    def presets(cls):
        """`{name: description}` of the presets of this class."""
        return {
            name: preset_registry.get_preset(name).description
            for name in preset_registry.preset_names(cls.__name__)
        }

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Builds the preset `preset` and loads its shipped weights.

        Args:
            preset: a preset name; see `presets()`.
            load_weights: load the shipped weights, where the preset has
                them.
            **kwargs: constructor arguments that override the preset's
                (ones that change the weights' shapes make loading fail);
                for a task with `with_preset_classes` (the classifiers,
                DETR), a `num_classes` other than the preset's keeps every
                weight but the class head's, which starts fresh.

        Raises:
            ValueError: for an unknown preset (the message lists the known
                ones), and when the shipped weights do not fit the
                overridden configuration (the message names the overrides).
        """
        spec = preset_registry.get_preset(preset, cls.__name__)
        num_classes = kwargs.get("num_classes")
        if (
            hasattr(cls, "with_preset_classes")
            and num_classes is not None
            and num_classes != spec.config.get("num_classes")
        ):
            kwargs.pop("num_classes")
            model = cls.from_preset(preset, load_weights=load_weights, **kwargs)
            return model.with_preset_classes(
                num_classes, spec, {**spec.config, **kwargs}
            )
        config = dict(spec.config)
        config.update(kwargs)
        model = cls(**config)
        if spec.input_shape is not None and not model.built:
            # Built either way: `load_weights=False` gives the same model,
            # its weights made (summary(), count_params(), fine-tuning).
            model.build(spec.input_shape)
        if load_weights and spec.weights is not None:
            try:
                preset_registry.load_weights(model, spec)
            except ValueError as error:
                changed = sorted(
                    k for k, v in kwargs.items()
                    if spec.config.get(k) != v
                )
                if not changed:
                    raise
                ours = {k: spec.config[k] for k in changed if k in spec.config}
                raise ValueError(
                    f"The weights of preset {spec.name!r} do not fit the "
                    "arguments that override its configuration: "
                    f"{', '.join(changed)} (the preset's values: {ours}). "
                    "Keep the preset's values, or pass `load_weights=False` "
                    "to train this configuration from scratch. Keras said: "
                    f"{error}"
                ) from error
        return model


def deserialize_preprocessor(preprocessor):
    """`preprocessor`, made from its config when a task's config holds it
    as a dict (`TaskConfig.get_config` serializes it)."""
    if isinstance(preprocessor, dict):
        return keras.saving.deserialize_keras_object(preprocessor)
    return preprocessor


class TaskConfig(DTypeArgument):
    """`get_config` and `from_config` of a task built on a `backbone`.

    The config holds the backbone (serialized), the task's own
    `task_arguments()`, its `preprocessor` (serialized, or `None`) when the
    task has one, its name and trainability, and the state of its own
    layers (the head's) that the constructor does not make again: frozen
    and quantized layers (`_config.graph_state_config`); `from_config`
    deserializes the backbone, calls the constructor and freezes and
    quantizes those layers again.
    """

    def task_arguments(self):
        """The task's own constructor arguments, as its config holds them."""
        return {}

    def get_config(self):
        config = {
            "backbone": keras.layers.serialize(self.backbone),
            **self.task_arguments(),
        }
        if hasattr(self, "preprocessor"):
            config["preprocessor"] = (
                None
                if self.preprocessor is None
                else keras.saving.serialize_keras_object(self.preprocessor)
            )
        config.update(name=self.name, trainable=self.trainable)
        config.update(dtype_config(self))
        # The task's own layers (the head); the backbone's config lists its
        # own quantized layers.
        config.update(graph_state_config(self, skip=self.backbone))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        return build_with_graph_state(
            cls, config, skip=lambda model: model.backbone
        )


class QuickQuantize(AllOrNothingWeights):
    """`model.quantize(mode)` without Keras's full garbage collection per
    replaced kernel, which took seconds after TensorFlow's imports
    (`keras_attention._config.collections_of_new_objects`); the same
    arguments and result as `keras.Model.quantize`. (Every application has
    it, so it also brings `AllOrNothingWeights`: `set_weights` and
    `load_weights` that change nothing when they fail.) Keras's warning
    for each layer that has no quantized form (norms, dropout, the input:
    half a dozen per call, which read as failures) is left out, and so is
    NumPy 2's DeprecationWarning from Keras's own quantizers (its
    `convert_to_numpy` of a variable; Keras's own layers warn alike)."""

    def quantize(self, mode=None, *args, **kwargs):
        # Keras quantizes layer by layer and raised at an already quantized
        # one, half the model quantized: checked first here.
        config = kwargs.get("config", args[0] if args else None)
        filters = kwargs.get("filters", args[1] if len(args) > 1 else None)
        leaves = [
            layer for layer in self._flatten_layers()
            if len(list(layer._flatten_layers())) == 1
            and hasattr(layer, "quantization_mode")
            and _quantized_by(layer, filters)
        ]
        layer_base.check_quantizable(
            leaves, mode or getattr(config, "mode", None), f"{self.name!r}"
        )
        with collections_of_new_objects(), warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*does not have a `?quantize`? method implemented"
            )
            warnings.filterwarnings(
                "ignore", message="__array__ implementation doesn't accept a copy",
                category=DeprecationWarning,
            )
            return super().quantize(mode, *args, **kwargs)


def _quantized_by(layer, filters):
    """Whether `model.quantize(..., filters=filters)` reaches `layer`."""
    if filters is None:
        return True
    from keras.src.quantizers.utils import should_quantize_layer

    return should_quantize_layer(layer, filters)


class Backbone(FunctionalConfig, InputChecks, QuickQuantize, keras.Model):
    """A functional model from the inputs to one feature vector per sample.

    Subclasses build their graph in `__init__`, call
    `super().__init__(inputs=..., outputs=...)` and `keep_config(locals())`,
    which keeps each constructor argument as an attribute; `get_config`
    returns them and `from_config` calls the constructor
    (`FunctionalConfig`).
    `from_preset(name)` returns the backbone of a preset's classifier, with
    its weights.
    """

    # The classifier class whose presets hold this backbone.
    classifier_class = None

    def __init__(self, *args, **kwargs):
        trainable = kwargs.pop("trainable", True)
        super().__init__(*args, **kwargs)
        # keras's functional constructor sets `trainable` before its layers
        # are tracked, so `trainable=False` (a frozen backbone's config)
        # would leave them trainable inside a task: set it now.
        self.trainable = trainable
        # Inputs are checked in `call`, with the expected and received shapes
        # (keras's own check squeezes a trailing 1 and compares prefixes).
        self.input_spec = None

    # The block classes whose scores `attention_scores` collects, and the
    # names of the layers from the input to the features, in order.
    scored_blocks = ()
    _chain = ()

    def attention_scores(self, inputs):
        """The attention scores of every block, run eagerly.

        Returns:
            A list with one entry per block of `scored_blocks`, in order:
            what its attention layer returns as scores, or `None` for a
            layer that returns none.
        """
        inputs = ops.convert_to_tensor(inputs, dtype=self.compute_dtype)
        self.check_inputs(inputs)
        x, scores = inputs, []
        for name in self._chain:
            layer = self.get_layer(name)
            if isinstance(layer, self.scored_blocks):
                x, block_scores = layer(
                    x, return_attention_scores=True, training=False
                )
                scores.append(block_scores)
            else:
                x = layer(x)
        return scores

    @property
    def feature_dim(self):
        """Size of the feature vector the backbone outputs."""
        return self.output.shape[-1]

    def enable_lora(self, rank, lora_alpha=None, target_names=None):
        """LoRA fine-tuning of this backbone, as keras-hub's `Backbone`.

        The named projections of every attention layer (by default each
        layer's own `lora_targets`: query and value, or a Swin window
        attention's fused `qkv`) get trainable
        low-rank updates (their biases train too, as in keras-hub) and
        every other weight of the backbone is frozen (a classifier's head
        stays trainable). See `keras_attention.layers.enable_lora` for the
        arguments; a bad argument raises a `ValueError` and changes nothing.

        A `.keras` file holds the updates merged into the kernels: the
        loaded model has no LoRA and freezes only what was frozen before
        `enable_lora` (call it again to go on with LoRA).

        Example:

        ```python
        model = VisionTransformer.from_preset("vit_digits")
        model.backbone.enable_lora(rank=4)
        model.compile(optimizer="adam")
        ```
        """
        return layer_base.enable_lora(
            self, rank, lora_alpha=lora_alpha, target_names=target_names
        )

    @classmethod
    def presets(cls):
        """`{name: description}` of the presets holding this backbone."""
        return cls.classifier_class.presets()

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """The backbone of the classifier preset `preset`, with its weights.

        `**kwargs` override the preset's backbone arguments as in the
        classifier's `from_preset` (e.g. `image_size=32` for a ViT,
        `dtype=`).

        Example:

        ```python
        backbone = VisionTransformerBackbone.from_preset(
            "vit_digits", image_size=32
        )
        backbone.input_shape  # (None, 32, 32, 1)
        ```
        """
        return cls.classifier_class.from_preset(
            preset, load_weights=load_weights, **kwargs
        ).backbone


def make_backbone(task_name, backbone_class, arguments, hint=""):
    """A `backbone_class` named `"backbone"`, built from `arguments`.

    The backbone's arguments without a default must be in `arguments`;
    else a `ValueError` says that the task `task_name` needs them (or
    `hint`, what else gives them, or a `backbone`).
    """
    parameters = inspect.signature(backbone_class.__init__).parameters
    required = [
        name
        for name in backbone_class.config_keys
        if parameters[name].default is inspect.Parameter.empty
    ]
    if any(arguments.get(name) is None for name in required):
        raise ValueError(
            f"{task_name} needs "
            + " and ".join(f"`{name}`" for name in required)
            + f" (or {hint}a `backbone`). Received: "
            + ", ".join(f"{name}={arguments.get(name)}" for name in required)
        )
    return backbone_class(**arguments, name="backbone")


class ImageBackbone(Backbone):
    """A backbone of images `(B, *image_size, num_channels)`."""

    def check_inputs(self, inputs):
        _validation.check_image_inputs(
            inputs, tuple(self.image_size) + (self.num_channels,)
        )


class Classifier(
    TaskConfig, PresetMixin, CompileDefaults, InputChecks, QuickQuantize,
    keras.Model,
):
    """A head (dropout, `Dense(num_classes)`) on a `Backbone`.

    Args:
        backbone: a `Backbone` instance; `None` builds a `backbone_class`
            from the backbone's arguments among `**kwargs`.
        num_classes: number of classes, a positive integer.
        activation: activation of the output layer; `None` (the default)
            gives logits, for `from_logits=True` losses.
        head_dropout: dropout rate before the output layer.
        **kwargs: the arguments of `backbone_class` (ignored when
            `backbone` is given), and `keras.Model`'s (`name`, `dtype`, ...).

    Subclasses name their backbone's required arguments first (so that
    they can be given by position) and pass them on with the rest.
    """

    backbone_class = Backbone
    # What else than a `backbone` gives the backbone's required arguments
    # (for the error message).
    backbone_hint = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The backbone's `from_preset` reads the presets of its classifier.
        if cls.backbone_class is not Backbone and (
            cls.backbone_class.classifier_class is None
        ):
            cls.backbone_class.classifier_class = cls

    def __init__(
        self,
        backbone=None,
        num_classes=None,
        activation=None,
        head_dropout=0.0,
        **kwargs,
    ):
        backbone, kwargs = self.backbone_from(backbone, kwargs)
        if not isinstance(backbone, keras.Model):
            raise _validation.invalid(
                "backbone", f"a {self.backbone_class.__name__}", backbone
            )
        _validation.check_positive_int("num_classes", num_classes)
        _validation.check_rate("head_dropout", head_dropout)
        try:
            keras.activations.get(activation)
        except ValueError:  # Keras's message named no argument
            raise _validation.invalid(
                "activation", "a Keras activation or None", activation
            ) from None
        inputs = backbone.input
        features = backbone(inputs)
        x = features
        if head_dropout:
            x = keras.layers.Dropout(head_dropout, name="head_dropout")(x)
        outputs = keras.layers.Dense(
            num_classes, activation=activation, name="predictions"
        )(x)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.input_spec = None
        self.backbone = backbone
        self.num_classes = num_classes
        self.activation = keras.activations.get(activation)
        self.head_dropout = float(head_dropout)

    def check_inputs(self, inputs):
        self.backbone.check_inputs(inputs)

    def label_ids(self, x):
        """One class id per example, `(B,)`."""
        return (batch_size(x),), self.num_classes, f"num_classes={self.num_classes}"

    def attention_scores(self, inputs):
        """The attention scores of every block; see the backbone's method."""
        return self.backbone.attention_scores(inputs)

    @classmethod
    def backbone_from(cls, backbone, kwargs):
        """`(backbone, rest)`: the backbone, and the arguments it left.

        The arguments of `kwargs` that the constructor of `backbone_class`
        names build a new backbone when `backbone` is `None` (those without
        a default must be given); with a `backbone` they are ignored. The
        others are returned for `keras.Model` (`name`, `dtype`, ...).
        """
        names = cls.backbone_class.config_keys
        arguments = {k: v for k, v in kwargs.items() if k in names}
        rest = {k: v for k, v in kwargs.items() if k not in names}
        if backbone is not None:
            return backbone, rest
        backbone = make_backbone(
            cls.__name__, cls.backbone_class, arguments, cls.backbone_hint
        )
        return backbone, rest

    def compile_defaults(self):
        """Adam, the sparse categorical cross-entropy (from logits when the
        head has no activation) and the accuracy, weighted by
        `sample_weight` when one is given. The accuracy is Keras's
        `"accuracy"`, which reads the labels it gets: class ids (sparse) or
        one-hot rows, for a `loss=` of either kind."""
        return {
            "optimizer": "adam",
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=self.activation is keras.activations.linear
            ),
            "weighted_metrics": ["accuracy"],
        }

    def task_arguments(self):
        return {
            "num_classes": self.num_classes,
            "activation": keras.activations.serialize(self.activation),
            "head_dropout": self.head_dropout,
        }

    def with_head(self, num_classes, **kwargs):
        """A classifier of this class sharing this backbone, with a new head.

        The backbone's layers (and weights) are shared, not copied; freeze
        them with `new_model.backbone.trainable = False`. A task with a
        `preprocessor` (the text classifier) passes it on unless
        `preprocessor=` is given.
        """
        if getattr(self, "preprocessor", None) is not None:
            kwargs.setdefault("preprocessor", self.preprocessor)
        return type(self)(backbone=self.backbone, num_classes=num_classes, **kwargs)

    def with_preset_classes(self, num_classes, spec, config):
        """`from_preset(name, num_classes=K)`'s model: this preset's
        backbone (weights shared) with a fresh head of `K` classes."""
        return self.with_head(
            num_classes,
            activation=config.get("activation"),
            head_dropout=config.get("head_dropout", 0.0),
            name=config.get("name"),
        )
