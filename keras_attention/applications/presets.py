"""The one preset registry of every application.

A **preset** is a named configuration of an application class (classifier,
translator, DETR, GAT), with or without weights shipped inside the package
(`keras_attention/presets/<name>.weights.h5`, trained by
`benchmarks/train_presets.py`, next to `<name>.json` that records the
configuration and how it was trained). Each application module registers its
presets with `register_preset`; `keras-attention list` and
`keras_attention.applications.presets()` list them all, and
`Class.from_preset(name)` (`base.PresetMixin`) builds one and loads its
weights. For classifiers `num_classes=` puts a fresh head on the loaded
backbone for fine-tuning:

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
import sys
import types

PACKAGE = "keras_attention"
PRESET_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets"
)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One named configuration of an application class.

    Attributes:
        name: the preset name, unique over all applications, e.g.
            `"vit_digits"`.
        class_name: the class it builds, e.g. `"VisionTransformer"`.
        config: the class's constructor arguments.
        weights: file name of the shipped weights inside `PRESET_DIR`, or
            `None` for a configuration without weights.
        description: one line for `presets()` listings.
        input_shape: the input shape that builds a subclassed model before
            its weights load (`None` for functional models).
        alias: a shorter name that `from_preset` of `class_name` also
            takes (the translators' `"tiny"` and `"small"`).
    """

    name: str
    class_name: str
    config: dict
    weights: str = None
    description: str = ""
    input_shape: tuple = None
    alias: str = None

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


def register_preset(
    name,
    class_name,
    config,
    weights=None,
    description="",
    input_shape=None,
    alias=None,
):
    """Record a preset under `name` (replacing any preset of that name)."""
    _PRESETS[name] = Preset(
        name, class_name, dict(config), weights, description, input_shape, alias
    )
    return _PRESETS[name]


def get_preset(name, class_name=None):
    """The `Preset` named `name`, checked to build `class_name` if given."""
    known = preset_names(class_name)
    if class_name is not None and isinstance(name, str) and name not in known:
        for preset in _PRESETS.values():
            if preset.class_name == class_name and preset.alias == name:
                return preset
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


def load_weights(model, spec):
    """Load the shipped weights of preset `spec` into `model`."""
    if not os.path.isfile(spec.weights_path):
        raise ValueError(
            f"The weights of preset {spec.name!r} are missing: expected "
            f"the file {spec.weights_path} (made by "
            "benchmarks/train_presets.py)."
        )
    if spec.input_shape is not None and not model.built:
        model.build(spec.input_shape)
    model.load_weights(spec.weights_path)


def presets(class_name=None):
    """`{name: Preset}` of every preset, or of those building `class_name`."""
    return {name: _PRESETS[name] for name in preset_names(class_name)}


class _CallableModule(types.ModuleType):
    """`keras_attention.applications.presets()` lists the presets; the
    module's functions stay reachable as `presets.get_preset` etc."""

    def __call__(self, class_name=None):
        return presets(class_name)


sys.modules[__name__].__class__ = _CallableModule
