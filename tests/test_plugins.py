"""A plugin layer registered here is used by name in every application.

Each application takes its attention by registry name, so a layer that
registers with `keras_attention.register(name, input_kind=...)` works
wherever its input kind fits: a `"tokens"` plugin in ViT, the text
classifier, both translators and DETR's transformer; a `"grid"` plugin in
CBAM-ResNet, ViT and DETR's backbone; a `"graph"` plugin in GAT. Every model
trains one step and round-trips `.keras` with identical outputs.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras import ops  # noqa: E402

from keras_attention import registry  # noqa: E402
from keras_attention import applications  # noqa: E402
from keras_attention.applications import TranslationPreprocessor  # noqa: E402
from keras_attention.layers import GraphAttention  # noqa: E402


class TokenPlugin(keras.layers.Layer):
    """Multi-head dot-product attention with no value or output projection.

    Follows the `"tokens"` call contract of `keras.layers.MultiHeadAttention`:
    `(query, value=None, key=None, query_mask, value_mask, use_causal_mask,
    return_attention_scores, training)`; the output has the value's width
    and the scores are `(B, H, T, S)`.
    """

    def __init__(self, num_heads=1, key_dim=8, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.supports_masking = True

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        units = self.num_heads * self.key_dim
        self.query_dense = keras.layers.Dense(units, name="query_dense")
        self.query_dense.build(query_shape)
        self.key_dense = keras.layers.Dense(units, name="key_dense")
        self.key_dense.build(key_shape)

    def _heads(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, self.key_dim))

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
    ):
        if value is None:  # self-attention: the queries' mask masks the keys
            value = query
            value_mask = query_mask if value_mask is None else value_mask
        key = value if key is None else key
        q = self._heads(self.query_dense(query))
        k = self._heads(self.key_dense(key))
        scores = ops.einsum("bthd,bshd->bhts", q, k) / self.key_dim**0.5
        visible = ops.ones_like(scores, dtype="bool")
        if value_mask is not None:
            visible = visible & ops.cast(value_mask, "bool")[:, None, None, :]
        if use_causal_mask:
            t, s = ops.shape(query)[1], ops.shape(value)[1]
            causal = ops.arange(t)[:, None] >= ops.arange(s)[None, :]
            visible = visible & causal[None, None]
        scores = ops.where(visible, scores, -1e9)
        weights = ops.softmax(scores, axis=-1)
        if query_mask is not None:
            weights = weights * ops.cast(query_mask, weights.dtype)[:, None, :, None]
        output = ops.einsum("bhts,bsc->btc", weights, value) / self.num_heads
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + ((value_shape or query_shape)[-1],)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
        }


class GridPlugin(keras.layers.Layer):
    """A learned channel gate on `(B, H, W, C)` feature maps."""

    def build(self, input_shape):
        self.gate = self.add_weight(
            name="gate", shape=(input_shape[-1],), initializer="zeros"
        )

    def call(self, inputs):
        return inputs * ops.sigmoid(ops.cast(self.gate, inputs.dtype))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


class GraphPlugin(GraphAttention):
    """The library's graph attention, registered as a third-party name."""


class PlainBuildPlugin(TokenPlugin):
    """The same attention with the ordinary `build(input_shape)` of a Keras
    layer: its projections build at their first call."""

    def build(self, input_shape):
        units = self.num_heads * self.key_dim
        self.query_dense = keras.layers.Dense(units, name="query_dense")
        self.key_dense = keras.layers.Dense(units, name="key_dense")


class NoValueMaskPlugin(keras.layers.Layer):
    """Self-attention of one tensor only: no `value`, no `value_mask`."""

    def call(self, query, return_attention_scores=False):
        return (query, None) if return_attention_scores else query


PLUGINS = {
    "test_plain_build_plugin": (PlainBuildPlugin, "tokens"),
    "test_no_value_mask_plugin": (NoValueMaskPlugin, "tokens"),
    "test_tokens_plugin": (TokenPlugin, "tokens"),
    "test_grid_plugin": (GridPlugin, "grid"),
    "test_graph_plugin": (GraphPlugin, "graph"),
}


@pytest.fixture(scope="module", autouse=True)
def plugins():
    for name, (cls, kind) in PLUGINS.items():
        # Its own package: test_classification registers other classes
        # named TokenPlugin and GridPlugin (package "tests").
        registry.register(name, package="tests.test_plugins", input_kind=kind)(cls)
    yield
    for name in PLUGINS:
        registry.unregister(name)


def numpy(x):
    if isinstance(x, dict):
        return {k: numpy(v) for k, v in x.items()}
    return keras.ops.convert_to_numpy(x)


def assert_round_trip(model, x, tmp_path):
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode, no custom_objects
    assert type(loaded) is type(model)
    expected, received = numpy(model(x, training=False)), numpy(loaded(x, training=False))
    if isinstance(expected, dict):
        for k in expected:
            np.testing.assert_allclose(received[k], expected[k], atol=1e-6)
    else:
        np.testing.assert_allclose(received, expected, atol=1e-6)
    return loaded


def one_step(model, x, y, **compile_kwargs):
    model.compile(**compile_kwargs)
    history = model.fit(x, y, batch_size=len(x) if not isinstance(x, dict) else 4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def images(n=4, size=8):
    rng = np.random.default_rng(0)
    return rng.random((n, size, size, 1)).astype("float32"), np.arange(n) % 3


def find(model, cls):
    found = [layer for layer in model._flatten_layers() if isinstance(layer, cls)]
    assert found, f"no {cls.__name__} in {model.name}"
    return found


@pytest.mark.parametrize("attention", ["test_tokens_plugin", "test_grid_plugin"])
def test_vision_transformer(attention, tmp_path):
    x, y = images()
    model = applications.VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
        num_heads=2, mlp_dim=32, num_channels=1, attention=attention,
    )
    find(model, PLUGINS[attention][0])
    one_step(model, x, y, jit_compile=True)
    assert_round_trip(model, x, tmp_path)


def test_cbam_resnet(tmp_path):
    x, y = images()
    model = applications.CBAMResNet(
        image_size=8, num_channels=1, num_classes=3, filters=(8, 16),
        attention="test_grid_plugin",
    )
    find(model, GridPlugin)
    one_step(model, x, y, jit_compile=False)  # XLA with a plugin: ViT's test
    assert_round_trip(model, x, tmp_path)


def test_text_classifier(tmp_path):
    texts = ["good film", "bad film", "a good good day", "bad"] * 2
    labels = np.array([1, 0, 1, 0] * 2)
    preprocessor = applications.TextClassifierPreprocessor.from_texts(
        texts, sequence_length=6
    )
    model = applications.TextClassifier(
        preprocessor=preprocessor, num_classes=2, hidden_dim=16, depth=1,
        num_heads=2, mlp_dim=32, attention="test_tokens_plugin",
    )
    find(model, TokenPlugin)
    ids = preprocessor(texts)
    one_step(model, ids, labels, jit_compile=False)  # XLA: ViT's test
    assert_round_trip(model, ids, tmp_path)


@pytest.mark.parametrize(
    "cls, config",
    [
        ("Seq2SeqTranslator", dict(embedding_dim=8, hidden_dim=16)),
        (
            "TransformerTranslator",
            dict(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32),
        ),
    ],
)
def test_translators(cls, config, tmp_path):
    words = ["abc", "bca", "cab", "aab"]
    model = getattr(applications, cls)(
        TranslationPreprocessor(source_length=6, target_length=6),
        attention="test_tokens_plugin",
        **config,
    )
    find(model, TokenPlugin)
    x, y = model.prepare(words, words)
    one_step(model, x, y, jit_compile=False)  # XLA with a plugin: ViT's test
    loaded = assert_round_trip(model, x, tmp_path)
    options = dict(jit_compile=False)
    assert loaded.translate(words, **options) == model.translate(words, **options)


@pytest.mark.parametrize("cls", ["Seq2SeqTranslator", "TransformerTranslator"])
def test_translators_take_a_layer_with_the_ordinary_build(cls, tmp_path):
    # They built every attention layer as `build(query_shape, value_shape,
    # ...)`: a layer with keras's `build(input_shape)` failed with a
    # TypeError. It gets the query's shape now, as Keras gives it.
    words = ["abc", "bca", "cab", "aab"]
    config = dict(embedding_dim=8, hidden_dim=16) if cls == "Seq2SeqTranslator" else dict(
        num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32
    )
    model = getattr(applications, cls)(
        TranslationPreprocessor(source_length=6, target_length=6),
        attention="test_plain_build_plugin", **config,
    )
    find(model, PlainBuildPlugin)
    x, y = model.prepare(words, words)
    one_step(model, x, y, jit_compile=False)
    loaded = assert_round_trip(model, x, tmp_path)
    options = dict(jit_compile=False)
    assert loaded.translate(words, **options) == model.translate(words, **options)


def test_seq2seq_refuses_a_layer_without_its_call_arguments_at_construction():
    with pytest.raises(ValueError, match="`attention`.*NoValueMaskPlugin.*`value`, `value_mask`"):
        applications.Seq2SeqTranslator(
            TranslationPreprocessor(source_length=6, target_length=6),
            embedding_dim=8, hidden_dim=16, attention="test_no_value_mask_plugin",
        )


def test_detr_transformer_and_backbone(tmp_path):
    from keras_attention.datasets import make_detection_set

    data = make_detection_set(4, image_size=32, max_objects=2)
    model = applications.DETR(
        num_classes=10, num_queries=3, hidden_dim=16, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, feedforward_dim=32,
        backbone_filters=(8, 16), transformer_attention="test_tokens_plugin",
        attention_module="test_grid_plugin",
    )
    model.compile(optimizer="adam", jit_compile=False)
    model.fit(
        data.images, {"boxes": data.boxes, "labels": data.labels},
        batch_size=4, epochs=1, verbose=0,
    )
    assert len(find(model, TokenPlugin)) == 3  # encoder; decoder self, cross
    find(model, GridPlugin)
    assert_round_trip(model, data.images, tmp_path)


def test_gat_takes_graph_plugins_and_refuses_other_kinds(tmp_path):
    graph_data = applications.node_classification_data
    from keras_attention.datasets import load_karate_club

    data = graph_data(load_karate_club())
    model = applications.GATNodeClassifier(
        num_features=data.inputs[0].shape[-1], num_classes=2, hidden_units=4,
        num_heads=2, attention="test_graph_plugin",
    )
    find(model, GraphPlugin)
    model.compile()
    model.fit(
        data.inputs, data.labels, sample_weight=data.train_weights,
        batch_size=1, epochs=1, verbose=0,
    )
    assert_round_trip(model, data.inputs, tmp_path)
    with pytest.raises(ValueError, match="input kind graph"):
        applications.GATNodeClassifier(
            num_features=4, num_classes=2, attention="test_tokens_plugin"
        )
    with pytest.raises(ValueError, match="input kind tokens"):
        applications.TextClassifier(
            vocabulary_size=10, sequence_length=4, num_classes=2,
            attention="test_graph_plugin",
        )
    with pytest.raises(ValueError, match="input kind grid"):
        applications.CBAMResNet(
            image_size=8, num_channels=1, num_classes=3,
            attention="test_tokens_plugin",
        )


def test_get_takes_every_keyword_and_layers_declare_their_input_kind():
    layer = registry.get("multi_head", num_heads=2, key_dim=4, name="attn")
    assert layer.name == "attn"
    assert registry.input_kind("multi_head") == "tokens"
    assert registry.input_kind("test_grid_plugin") == "grid"
    assert set(registry.names_of_kind("grid")) >= {
        "cbam", "channel", "spatial", "local_window", "non_local",
        "test_grid_plugin",
    }
    assert registry.names_of_kind("graph") == ["graph", "test_graph_plugin"]
    with pytest.raises(ValueError, match="input_kind"):
        registry.register("test_bad_kind", input_kind="image")


def test_one_preset_registry_lists_every_application(capsys):
    from keras_attention import cli

    listed = applications.presets()
    by_class = {preset.class_name for preset in listed.values()}
    assert by_class >= {
        "VisionTransformer", "CBAMResNet", "TextClassifier", "DETR",
        "GATNodeClassifier", "Seq2SeqTranslator", "TransformerTranslator",
    }
    assert listed["detr_digits"].weights == "detr_digits.weights.h5"
    assert applications.TransformerTranslator.from_preset("tiny").num_layers == 2
    assert "transformer_tiny" in applications.TransformerTranslator.presets()
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("detr_digits", "seq2seq_tiny", "transformer_small", "gat_cora"):
        assert name in out


def test_backbone_lora_reaches_plugin_layers():
    """`Backbone.enable_lora` adapts a plugin layer's projections (it is an
    attention layer of the backbone like ours); a name it lacks is refused
    with the names it has."""
    model = applications.VisionTransformer(
        image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
        num_heads=2, mlp_dim=32, num_channels=1, attention="test_tokens_plugin",
    )
    with pytest.raises(ValueError, match="key_dense.*query_dense"):
        model.backbone.enable_lora(rank=2)  # no "query"/"value" projections
    adapted = model.backbone.enable_lora(rank=2, target_names=["query_dense"])
    assert list(adapted) == ["block_0/attention/query_dense"]
    assert adapted["block_0/attention/query_dense"].lora_enabled
