"""The one config mechanism (`keras_attention._config`): every registered
layer's config holds exactly its constructor's arguments and keras's base
keys, keras objects serialized, and rebuilds the same layer."""

import inspect
import json

import keras
import pytest

import keras_attention
from keras_attention import _config
from keras_attention.applications.blocks.residual import ResidualAttentionBlock
from keras_attention.applications.blocks.transformer import TransformerEncoderBlock
from keras_attention.layers import HashDropout
from tests.harness import load_cases
from tests.harness import make_layer

CASES = load_cases()
NAMES = [name for name in keras_attention.names() if name in CASES]
BASE_KEYS = {"name", "trainable", "dtype"}

# A non-default value for each argument a layer may take, where it does:
# keras objects as instances, so the config must serialize them.
CUSTOM = {
    "kernel_initializer": lambda: keras.initializers.HeNormal(seed=3),
    "bias_initializer": lambda: keras.initializers.Constant(0.5),
    "kernel_regularizer": lambda: keras.regularizers.L2(0.01),
    "bias_regularizer": lambda: keras.regularizers.L1(0.02),
    "kernel_constraint": lambda: keras.constraints.NonNeg(),
    "bias_constraint": lambda: keras.constraints.MaxNorm(2.0),
    "activation": lambda: keras.activations.elu,
    "use_bias": lambda: False,
    "seed": lambda: 5,
    "dropout": lambda: 0.1,
}


def signature_arguments(cls):
    """Every named constructor argument of `cls` and its own bases, read
    here without `config_keys` (which the mechanism itself computes)."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras_attention") and "__init__" in vars(klass):
            names.update(_config.constructor_arguments(klass))
    return names


def custom_layer(name):
    cls = keras_attention.get_class(name)
    taken = signature_arguments(cls)
    overrides = {key: make() for key, make in CUSTOM.items() if key in taken}
    return make_layer(name, CASES[name], **overrides)


@pytest.mark.parametrize("variant", ["default", "custom"])
@pytest.mark.parametrize("name", NAMES)
def test_config_is_the_constructor_arguments(name, variant):
    layer = (
        make_layer(name, CASES[name]) if variant == "default" else custom_layer(name)
    )
    config = layer.get_config()
    assert set(config) == signature_arguments(type(layer)) | BASE_KEYS
    # Keras objects are written as their configs, never as objects.
    for key in _config.KERAS_OBJECTS:
        if key in config:
            assert config[key] is None or isinstance(config[key], (str, dict)), key
    json.dumps(config)
    rebuilt = type(layer).from_config(config)
    assert rebuilt.get_config() == config


@pytest.mark.parametrize("name", NAMES)
def test_an_unbuilt_layer_copies_pickles_and_saves(name, tmp_path):
    # Never called, the layer has no sublayers yet: loading its (empty)
    # variables must not look for them.
    import copy
    import pickle

    layer = make_layer(name, CASES[name])
    config = layer.get_config()
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(twin) is type(layer) and not twin.built
        assert twin.get_config() == config
    path = str(tmp_path / "unbuilt.keras")
    keras.Sequential([layer]).save(path)
    loaded = keras.saving.load_model(path).layers[0]
    assert type(loaded) is type(layer) and loaded.get_config() == config


def test_custom_objects_survive_the_round_trip():
    layer = custom_layer("multi_head")
    config = layer.get_config()
    assert config["kernel_initializer"]["class_name"] == "HeNormal"
    assert config["bias_constraint"]["config"]["max_value"] == 2.0
    rebuilt = type(layer).from_config(config)
    assert rebuilt._kernel_initializer.seed == 3
    assert rebuilt.num_key_value_heads == layer.num_key_value_heads


def test_subclass_of_a_keras_layer_adds_only_new_keys():
    # keras's MultiHeadAttention writes its own arguments; ours adds the rest
    # after them, in its signature's order.
    layer = keras_attention.get("multi_head", num_heads=2, key_dim=4)
    keras_keys = list(
        keras.layers.MultiHeadAttention(num_heads=2, key_dim=4).get_config()
    )
    keys = list(layer.get_config())
    assert keys[: len(keras_keys)] == keras_keys
    assert keys[len(keras_keys):] == [
        "flash_attention", "num_key_value_heads", "use_causal_mask",
        "implementation", "position_encoding", "rope_max_wavelength",
        "rope_scaling_factor", "alibi_bias_max",
    ]


def test_application_layer_config_uses_the_same_mechanism():
    block = TransformerEncoderBlock(num_heads=2, mlp_dim=8, dropout=0.1)
    config = block.get_config()
    assert set(config) == signature_arguments(TransformerEncoderBlock) | BASE_KEYS
    # A subclass's own arguments come after those its base takes.
    assert list(config)[-4:] == [
        "grid_shape", "window_size", "shift_size", "attention_name",
    ]
    assert TransformerEncoderBlock.from_config(config).get_config() == config


@pytest.mark.parametrize(
    "make",
    [
        lambda: HashDropout(0.5, seed=1),
        lambda: ResidualAttentionBlock(
            8, strides=2, kernel_regularizer=keras.regularizers.L2(0.01),
            kernel_initializer=keras.initializers.HeNormal(seed=2),
        ),
    ],
    ids=["HashDropout", "ResidualAttentionBlock"],
)
def test_other_layers_use_the_same_mechanism(make):
    layer = make()
    config = layer.get_config()
    assert set(config) == signature_arguments(type(layer)) | BASE_KEYS
    json.dumps(config)
    assert type(layer).from_config(config).get_config() == config


def test_kwargs_never_count():
    class Plain(_config.ArgumentConfig):
        def __init__(self, size, *args, scale=1.0, **kwargs):
            self.size, self.scale = size, scale

    assert Plain.config_keys == ("size", "scale")
    assert Plain.from_config(Plain(3).get_config()).get_config() == {
        "size": 3, "scale": 1.0,
    }


def test_config_module_imports_nothing_of_the_package():
    # Layers and applications both import it: it must stay below both.
    source = inspect.getsource(_config)
    assert "keras_attention" not in "".join(
        line for line in source.splitlines() if line.startswith(("import", "from"))
    )


def test_a_users_subclass_keeps_keras_way_of_writing_its_config():
    # A subclass outside the package that keeps its argument under another
    # name and writes it itself (keras's convention) is not broken by the
    # mechanism; one that keeps it under its own name gets it written.
    class Scaled(keras_attention.layers.MultiHeadAttention):
        def __init__(self, scale=2.0, **kwargs):
            super().__init__(**kwargs)
            self._scale = scale

        def get_config(self):
            return {**super().get_config(), "scale": self._scale}

    layer = Scaled(scale=3.0, num_heads=2, key_dim=4)
    config = layer.get_config()
    assert config["scale"] == 3.0 and config["num_heads"] == 2
    assert Scaled.from_config(config).get_config() == config

    class Kept(keras_attention.layers.MultiHeadAttention):
        def __init__(self, scale=2.0, **kwargs):
            super().__init__(**kwargs)
            self.scale = scale

    config = Kept(scale=5.0, num_heads=2, key_dim=4).get_config()
    assert config["scale"] == 5.0
    assert Kept.from_config(config).get_config() == config


def test_an_application_file_loads_after_importing_only_the_package(tmp_path):
    """As a keras-hub file loads after `import keras_hub`: the application
    classes and the schedules register when the package is imported."""
    import subprocess
    import sys

    import numpy as np

    from keras_attention.applications import VisionTransformer
    from keras_attention.training import InverseSqrt

    model = VisionTransformer(
        image_size=8, patch_size=4, hidden_dim=8, depth=1, num_heads=2,
        mlp_dim=8, num_channels=1, num_classes=2,
    )
    model.compile(keras.optimizers.Adam(InverseSqrt(1e-3, 10)), "mse")
    model.fit(np.zeros((2, 8, 8, 1)), np.zeros((2, 2)), verbose=0)
    path = str(tmp_path / "vit.keras")
    model.save(path)
    script = (
        "import keras_attention, keras, sys\n"
        f"model = keras.saving.load_model({path!r})\n"
        "print(type(model).__name__, type(model.optimizer.learning_rate"
        "_schedule if hasattr(model.optimizer, 'learning_rate_schedule') "
        "else model.optimizer._learning_rate).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["VisionTransformer", "InverseSqrt"]


def _dtype_cases():
    from keras_attention.applications import CausalLM
    from keras_attention.applications import CBAMResNet
    from keras_attention.applications import GATNodeClassifier
    from keras_attention.applications import TextClassifier
    from keras_attention.applications import VisionTransformer
    import numpy as np

    from keras_attention.applications import Seq2SeqTranslator
    from keras_attention.applications import TranslationPreprocessor
    from keras_attention.applications import TransformerTranslator

    image = np.zeros((2, 8, 8, 1), "float32")
    ids = np.ones((2, 6), "int32")
    words = TranslationPreprocessor(source_length=4, target_length=5)
    pairs = words.encode_pairs(["abc", "de"], ["abc", "de"])[0]
    return {
        "vit": (lambda **k: VisionTransformer(
            image_size=8, patch_size=4, hidden_dim=8, depth=1, num_heads=2,
            mlp_dim=8, num_channels=1, num_classes=2, **k), image),
        "cbam_resnet": (lambda **k: CBAMResNet(
            image_size=8, num_channels=1, num_classes=2, filters=(4,), **k),
            image),
        "text": (lambda **k: TextClassifier(
            vocabulary_size=20, sequence_length=6, hidden_dim=8, depth=1,
            num_heads=2, mlp_dim=8, num_classes=2, **k), ids),
        "causal_lm": (lambda **k: CausalLM(
            vocabulary_size=20, hidden_dim=8, depth=1, num_heads=2,
            mlp_dim=8, **k), ids),
        "gat": (lambda **k: GATNodeClassifier(
            num_features=3, num_classes=2, hidden_units=4, **k), None),
        # Subclassed models: their sublayers took the global policy in
        # force when built or loaded (a mixed_bfloat16 translator computed
        # in float32, a loaded mixed_float16 one too).
        "transformer_translator": (lambda **k: TransformerTranslator(
            words, num_layers=1, hidden_dim=8, num_heads=2,
            intermediate_dim=8, **k), pairs),
        "seq2seq_translator": (lambda **k: Seq2SeqTranslator(
            words, embedding_dim=8, hidden_dim=8, **k), pairs),
    }


@pytest.mark.parametrize("name", [
    "vit", "cbam_resnet", "text", "causal_lm", "gat", "transformer_translator",
    "seq2seq_translator",
])
def test_dtype_argument_of_an_application_is_honoured_and_saved(name, tmp_path):
    """`dtype=` reaches every layer (it was silently ignored: keras's
    functional constructor does not pass it on), the global policy is left
    as it was, and the `.keras` file keeps it."""
    make, x = _dtype_cases()[name]
    before = keras.config.dtype_policy().name
    model = make(dtype="mixed_bfloat16")
    assert keras.config.dtype_policy().name == before
    policies = {
        layer.dtype_policy.name
        for layer in model._flatten_layers()
        if not isinstance(layer, keras.layers.InputLayer)
    }
    assert policies == {"mixed_bfloat16"}, [
        (layer.path, layer.dtype_policy.name) for layer in model._flatten_layers()
        if layer.dtype_policy.name != "mixed_bfloat16"]
    if x is not None:
        # CausalLM's logits are float32, as keras-hub's GPT2CausalLM's (its
        # embedding lookup runs without autocast).
        expected = "float32" if name == "causal_lm" else "bfloat16"
        assert keras.backend.standardize_dtype(model(x).dtype) == expected
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.dtype_policy.name == "mixed_bfloat16"
    assert {
        layer.dtype_policy.name
        for layer in loaded._flatten_layers()
        if not isinstance(layer, keras.layers.InputLayer)
    } == {"mixed_bfloat16"}
    if hasattr(model, "with_head"):
        # A new head on the backbone takes the backbone's policy.
        assert model.with_head(3).dtype_policy.name == "mixed_bfloat16"
    # Without `dtype=`: the global policy, written as keras-hub's backbones
    # write theirs (loaded in another process, it stays the same).
    assert make().get_config()["dtype"]["config"]["name"] == before


def test_a_failing_constructor_restores_the_global_dtype_policy():
    from keras_attention.applications import VisionTransformer

    before = keras.config.dtype_policy().name
    with pytest.raises(ValueError):
        VisionTransformer(image_size=8, patch_size=3, hidden_dim=8, depth=1,
                          num_heads=2, mlp_dim=8, num_channels=1,
                          num_classes=2, dtype="mixed_bfloat16")
    assert keras.config.dtype_policy().name == before


_APPLICATIONS = {
    "VisionTransformer": dict(image_size=8, patch_size=4, num_classes=2, hidden_dim=8,
                              depth=1, num_heads=2, mlp_dim=8),
    "VisionTransformerBackbone": dict(image_size=8, patch_size=4, hidden_dim=8,
                                      depth=1, num_heads=2, mlp_dim=8),
    "CBAMResNet": dict(image_size=8, num_classes=2),
    "TextClassifier": dict(num_classes=2, vocabulary_size=50, sequence_length=8,
                           hidden_dim=8, depth=1, num_heads=2, mlp_dim=8),
    "GATNodeClassifier": dict(num_features=4, num_classes=2),
    "CausalLM": dict(vocabulary_size=20, hidden_dim=8, depth=1, num_heads=2, mlp_dim=8),
    "TransformerTranslator": {},
    "DETR": dict(num_classes=2),
}


@pytest.mark.parametrize("name", sorted(_APPLICATIONS))
def test_a_misspelt_keyword_of_an_application_is_refused(name):
    # keras's functional constructor drops what it does not know: the
    # functional applications took `dropout_rate=0.5` (or a test's
    # `num_layers=1` for `depth`) without a word and built the defaults.
    cls = getattr(keras_attention.applications, name)
    with pytest.raises(ValueError, match=r"Unrecognized keyword arguments.*dropout_rate"):
        cls(**_APPLICATIONS[name], dropout_rate=0.5)
    model = cls(**_APPLICATIONS[name], name="mine", trainable=False)
    assert model.name == "mine" and not model.trainable


def test_building_an_application_leaves_keras_global_policy_unset():
    # Restoring `keras.config.dtype_policy()` after a `dtype=` build set the
    # global policy where it was unset: a later `set_floatx` changed no new
    # layer's dtype in the whole process.
    from keras.src.backend.common import global_state

    from keras_attention.applications import VisionTransformer

    previous = global_state.get_global_attribute("dtype_policy", None)
    global_state.set_global_attribute("dtype_policy", None)
    try:
        # (Any Keras layer built without `dtype` sets it, Keras's own way:
        # only the `dtype=` build is ours to keep from it.)
        VisionTransformer(image_size=8, patch_size=4, num_classes=2,
                          hidden_dim=8, depth=1, num_heads=2, mlp_dim=8,
                          num_channels=1, dtype="bfloat16")
        assert global_state.get_global_attribute("dtype_policy", None) is None
        keras.config.set_floatx("float64")
        assert keras.layers.Dense(2).dtype_policy.name == "float64"
    finally:
        keras.config.set_floatx("float32")
        global_state.set_global_attribute("dtype_policy", previous)
