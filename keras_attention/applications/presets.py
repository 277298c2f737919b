"""Presets, backbones and classifier heads shared by the applications.

In the manner of keras-hub, every application is split in two functional
models:

- a **backbone** (`Backbone` subclass) maps the inputs to one feature vector
  per sample (for node classification: per node);
- a **classifier** (`Classifier` subclass) puts a head (dropout, then a
  `Dense` layer with `num_classes` units) on a backbone.

Both are `keras.Model`s whose `get_config` holds their constructor
arguments, so they save and load as `.keras` files with no `custom_objects`.

A **preset** is a named configuration of a classifier, with or without
weights shipped inside the package (`keras_attention/presets/<name>.weights.h5`,
trained by `benchmarks/train_presets.py`, next to `<name>.json` that records
the configuration and how it was trained). `Classifier.from_preset(name)`
builds the configuration and loads the weights; `num_classes=` puts a fresh
head on the loaded backbone for fine-tuning:

```python
model = keras_attention.applications.VisionTransformer.from_preset(
    "vit_digits", num_classes=2
)
model.backbone.trainable = False  # keep the pre-trained features
model.compile(optimizer="adam")
model.fit(images, binary_labels, epochs=1)
```
"""

import dataclasses
import json
import os

import keras

PACKAGE = "keras_attention"
PRESET_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets"
)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One named configuration of a classifier.

    Attributes:
        name: the preset name, e.g. `"vit_digits"`.
        class_name: the classifier class it builds, e.g. `"VisionTransformer"`.
        config: the classifier's constructor arguments.
        weights: file name of the shipped weights inside `PRESET_DIR`, or
            `None` for a configuration without weights.
        description: one line for `presets()` listings.
    """

    name: str
    class_name: str
    config: dict
    weights: str = None
    description: str = ""

    @property
    def weights_path(self):
        return None if self.weights is None else os.path.join(
            PRESET_DIR, self.weights
        )

    @property
    def metadata_path(self):
        return os.path.join(PRESET_DIR, f"{self.name}.json")

    def metadata(self):
        """What `train_presets.py` recorded (config, metrics), or `{}`."""
        if not os.path.isfile(self.metadata_path):
            return {}
        with open(self.metadata_path, encoding="utf-8") as f:
            return json.load(f)


_PRESETS = {}


def register_preset(name, class_name, config, weights=None, description=""):
    """Record a preset under `name` (replacing any preset of that name)."""
    _PRESETS[name] = Preset(name, class_name, dict(config), weights, description)
    return _PRESETS[name]


def get_preset(name, class_name=None):
    """The `Preset` named `name`, checked to build `class_name` if given."""
    known = preset_names(class_name)
    if not isinstance(name, str) or name not in known:
        other = _PRESETS.get(name) if isinstance(name, str) else None
        hint = (
            f" The preset {name!r} builds a {other.class_name}; use "
            f"{other.class_name}.from_preset."
            if other is not None
            else ""
        )
        raise ValueError(
            "Received an invalid value for argument `preset`, expected one "
            f"of the known presets: {', '.join(known) or '(none)'}. "
            f"Received: preset={name!r}.{hint}"
        )
    return _PRESETS[name]


def preset_names(class_name=None):
    """The sorted names of every preset, or of those building `class_name`."""
    return sorted(
        name
        for name, preset in _PRESETS.items()
        if class_name is None or preset.class_name == class_name
    )


def fill_arguments(cls, defaults, overrides=None, method="__init__"):
    """The constructor arguments of `cls` from `defaults` and `overrides`.

    The applications build attention layers chosen by name. They offer each
    layer the arguments they know (`num_heads`, `key_dim`, `window_size`,
    `reduction`, ...), and this keeps those that the layer's constructor
    names; `overrides` (the user's `attention_kwargs`) are always passed.
    """
    import inspect

    parameters = inspect.signature(getattr(cls, method)).parameters
    arguments = {k: v for k, v in defaults.items() if k in parameters}
    arguments.update(overrides or {})
    return arguments


def call_accepts(layer, argument):
    """Whether `layer.call` has a parameter named `argument`."""
    import inspect

    return argument in inspect.signature(layer.call).parameters


def check_attention_name(attention, argument="attention", allow_none=False):
    """Raise the keras-worded error for an unknown attention name."""
    from keras_attention import registry

    if attention is None and allow_none:
        return None
    if isinstance(attention, type) and issubclass(attention, keras.layers.Layer):
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            "a registered name (a string; register classes with "
            "`keras_attention.register`). Received: "
            f"{argument}={attention.__name__}"
        )
    known = registry.names()
    if not isinstance(attention, str) or attention not in known:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a registered attention name, one of: {', '.join(known)}"
            f"{' or None' if allow_none else ''}. Received: "
            f"{argument}={attention!r}"
        )
    return attention


def check_image_inputs(inputs, image_shape, argument="images"):
    """Raise a ValueError if `inputs` is not `(B, *image_shape)`.

    Dimensions unknown while tracing are not compared.
    """
    shape = tuple(inputs.shape)
    expected = (None,) + tuple(image_shape)
    if len(shape) != len(expected) or any(
        e is not None and d is not None and d != e
        for d, e in zip(shape, expected)
    ):
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            f"a batch of images of shape {expected} (batch, height, width, "
            f"channels). Received: {argument}.shape={shape}"
        )


class InputChecks:
    """Checks the inputs of `call`, `fit`, `evaluate` and `predict`.

    `call` sees static shapes only on the first trace: `fit` and `predict`
    relax the traced shapes when they are called again with other shapes, so
    the data given to them is checked here too, before any tracing.
    Subclasses implement `check_inputs(inputs)`, which reads `inputs.shape`
    (or the shapes of a list of inputs) and raises a `ValueError`.
    """

    def check_inputs(self, inputs):
        pass

    def _check_data(self, x):
        spec = getattr(x, "element_spec", None)  # a tf.data.Dataset
        if spec is not None:
            x = spec[0] if isinstance(spec, tuple) else spec
        if isinstance(x, dict):
            return
        items = x if isinstance(x, (list, tuple)) else [x]
        if items and all(hasattr(item, "shape") for item in items):
            self.check_inputs(x)

    def fit(self, x=None, y=None, *args, **kwargs):
        self._check_data(x)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self._check_data(x)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_data(x)
        return super().predict(x, *args, **kwargs)

    def call(self, inputs, training=None, mask=None):
        self.check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask)


class Backbone(InputChecks, keras.Model):
    """A functional model from the inputs to one feature vector per sample.

    Subclasses build their graph in `__init__` and call
    `super().__init__(inputs=..., outputs=...)`; `get_config` returns their
    constructor arguments and `from_config` calls the constructor.
    `from_preset(name)` returns the backbone of a preset's classifier, with
    its weights.
    """

    # The classifier class whose presets hold this backbone.
    classifier_class = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Inputs are checked in `call`, with the expected and received shapes
        # (keras's own check squeezes a trailing 1 and compares prefixes).
        self.input_spec = None

    @property
    def feature_dim(self):
        """Size of the feature vector the backbone outputs."""
        return self.output.shape[-1]

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def presets(cls):
        """`{name: description}` of the presets holding this backbone."""
        return cls.classifier_class.presets()

    @classmethod
    def from_preset(cls, preset, load_weights=True):
        """The backbone of the classifier preset `preset`, with its weights."""
        return cls.classifier_class.from_preset(
            preset, load_weights=load_weights
        ).backbone


class Classifier(InputChecks, keras.Model):
    """A head (dropout, `Dense(num_classes)`) on a `Backbone`.

    Args:
        backbone: a `Backbone` instance.
        num_classes: number of classes, a positive integer.
        activation: activation of the output layer; `None` (the default)
            gives logits, for `from_logits=True` losses.
        head_dropout: dropout rate before the output layer.

    Subclasses take their backbone's arguments in their constructor and
    build the backbone when `backbone` is not given.
    """

    backbone_class = Backbone

    def __init__(
        self, backbone, num_classes, activation=None, head_dropout=0.0, **kwargs
    ):
        from keras_attention.layers import base

        if not isinstance(backbone, keras.Model):
            raise ValueError(
                "Received an invalid value for argument `backbone`, expected "
                f"a {self.backbone_class.__name__}. Received: "
                f"backbone={backbone!r}"
            )
        base.check_positive_int("num_classes", num_classes)
        base.check_rate("head_dropout", head_dropout)
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

    def compile(
        self,
        optimizer="adam",
        loss="auto",
        metrics=None,
        weighted_metrics="auto",
        jit_compile="auto",
        **kwargs,
    ):
        """`keras.Model.compile` with defaults for classification.

        `loss="auto"` is the sparse categorical cross-entropy (from logits
        when the head has no activation) and `weighted_metrics="auto"` the
        sparse categorical accuracy, weighted by `sample_weight` when one is
        given (Keras 3 ignores `sample_weight` for `metrics=`).
        """
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=self.activation is keras.activations.linear
            )
        if weighted_metrics == "auto":
            weighted_metrics = [
                keras.metrics.SparseCategoricalAccuracy(name="accuracy")
            ]
        super().compile(
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
            jit_compile=jit_compile,
            **kwargs,
        )

    def compile_from_config(self, config):
        # `compile` is overridden, so keras leaves this to the class.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def get_config(self):
        return {
            "backbone": keras.layers.serialize(self.backbone),
            "num_classes": self.num_classes,
            "activation": keras.activations.serialize(self.activation),
            "head_dropout": self.head_dropout,
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        return cls(**config)

    def with_head(self, num_classes, **kwargs):
        """A classifier of this class sharing this backbone, with a new head.

        The backbone's layers (and weights) are shared, not copied; freeze
        them with `new_model.backbone.trainable = False`.
        """
        return type(self)(backbone=self.backbone, num_classes=num_classes, **kwargs)

    @classmethod
    def presets(cls):
        """`{name: description}` of the presets of this class."""
        return {
            name: get_preset(name).description
            for name in preset_names(cls.__name__)
        }

    @classmethod
    def from_preset(cls, preset, load_weights=True, num_classes=None, **kwargs):
        """Builds the preset `preset` and loads its shipped weights.

        Args:
            preset: a preset name; see `presets()`.
            load_weights: load the shipped weights, where the preset has
                them.
            num_classes: if given and different from the preset's, the
                loaded backbone gets a fresh head with this many classes.
            **kwargs: other constructor arguments that override the preset's
                (ones that change the weights' shapes make loading fail).

        Raises:
            ValueError: for an unknown preset (the message lists the known
                ones).
        """
        spec = get_preset(preset, cls.__name__)
        config = dict(spec.config)
        config.update(kwargs)
        model = cls(**config)
        if load_weights and spec.weights is not None:
            if not os.path.isfile(spec.weights_path):
                raise ValueError(
                    f"The weights of preset {preset!r} are missing: expected "
                    f"the file {spec.weights_path} (made by "
                    "benchmarks/train_presets.py)."
                )
            model.load_weights(spec.weights_path)
        if num_classes is not None and num_classes != model.num_classes:
            model = model.with_head(
                num_classes,
                activation=config.get("activation"),
                head_dropout=config.get("head_dropout", 0.0),
            )
        return model
