"""Tests of the classification applications: ViT, CBAM-ResNet, text, presets.

Small configurations; every model trains a few steps under
`jit_compile=True`, saves and loads as `.keras`, swaps its attention by
registry name, and checks its pieces against NumPy references.
"""

import os

import keras
import numpy as np
import pytest
from scipy.special import erf

import keras_attention
from keras_attention import registry
from keras_attention.applications import presets
from keras_attention.applications.cbam_resnet import CBAMResNet
from keras_attention.applications.text_classifier import TextClassifier
from keras_attention.applications.text_classifier import TextClassifierPreprocessor
from keras_attention.applications.patches import PatchEmbedding
from keras_attention.applications.blocks import TransformerEncoderBlock
from keras_attention.applications.vision_transformer import VisionTransformer
from tests import benchmark_scripts

TINY_VIT = dict(
    image_size=8,
    patch_size=4,
    num_classes=3,
    hidden_dim=16,
    depth=1,
    num_heads=2,
    mlp_dim=32,
    num_channels=1,
)
TINY_RESNET = dict(
    image_size=8, num_channels=1, num_classes=3, filters=(8, 16)
)


def images(n=12, size=8, channels=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, size, size, channels)).astype("float32")
    y = (np.arange(n) % 3).astype("int32")
    # A learnable signal: the class brightens one image row.
    x[np.arange(n), y * 2, :, :] += 1.0
    return x, y


def fit_loss_goes_down(model, x, y, epochs=12):
    model.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=True)
    history = model.fit(x, y, batch_size=len(x), epochs=epochs, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0], losses
    return losses


def assert_round_trip(model, x, tmp_path):
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # no custom_objects
    assert type(loaded) is type(model)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(x, training=False)),
        keras.ops.convert_to_numpy(model(x, training=False)),
        atol=1e-6,
    )
    return loaded


# ------------------------------------------------------------ references


def layer_norm(x, layer, eps):
    gamma, beta = layer.get_weights()
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def softmax(x, axis=-1):
    x = x - x.max(axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis, keepdims=True)


def reference_block(block, x):
    """The pre-norm block with multi-head attention, from its weights."""
    eps = block.layer_norm_epsilon
    h = layer_norm(x, block.attention_norm, eps)
    wq, bq, wk, bk, wv, bv, wo, bo = block.attention_layer.get_weights()
    q = np.einsum("btc,chd->bthd", h, wq) + bq
    k = np.einsum("btc,chd->bthd", h, wk) + bk
    v = np.einsum("btc,chd->bthd", h, wv) + bv
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    weights = softmax(scores)
    heads = np.einsum("bhts,bshd->bthd", weights, v)
    x = x + np.einsum("bthd,hdc->btc", heads, wo) + bo
    h = layer_norm(x, block.mlp_norm, eps)
    w1, b1 = block.mlp_hidden.get_weights()
    w2, b2 = block.mlp_output.get_weights()
    return x + gelu(h @ w1 + b1) @ w2 + b2, weights


def test_patch_embedding_matches_numpy():
    x, _ = images(2, size=8, channels=3)
    layer = PatchEmbedding(hidden_dim=5, patch_size=4, use_class_token=True)
    out = keras.ops.convert_to_numpy(layer(x))
    kernel, bias = layer.projection.get_weights()  # (4, 4, 3, 5), (5,)
    token, position = layer.class_token.numpy(), layer.position_embedding.numpy()
    patches = x.reshape(2, 2, 4, 2, 4, 3).transpose(0, 1, 3, 2, 4, 5)
    expected = np.einsum("bijpqc,pqcd->bijd", patches, kernel) + bias
    expected = expected.reshape(2, 4, 5)  # row-major patches
    expected = np.concatenate([np.broadcast_to(token, (2, 1, 5)), expected], 1)
    np.testing.assert_allclose(out, expected + position, atol=1e-5)


def test_encoder_block_matches_numpy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block = TransformerEncoderBlock(num_heads=2, mlp_dim=16)
    out, scores = block(x, return_attention_scores=True)
    expected, expected_scores = reference_block(block, x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), expected, atol=1e-4)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(scores), expected_scores, atol=1e-5
    )


# ------------------------------------------------------------ ViT


def test_vision_transformer_trains_saves_and_explains(tmp_path):
    x, y = images()
    model = VisionTransformer(**TINY_VIT)
    assert model.backbone.pooling == "cls"
    fit_loss_goes_down(model, x, y)
    assert_round_trip(model, x[:4], tmp_path)
    (scores,) = model.attention_scores(x[:4])
    scores = keras.ops.convert_to_numpy(scores)
    assert scores.shape == (4, 2, 5, 5)  # 4 patches + class token
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)
    # The classifier is the backbone's features through the head.
    features = keras.ops.convert_to_numpy(model.backbone(x[:4]))
    kernel, bias = model.get_layer("predictions").get_weights()
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(x[:4])), features @ kernel + bias, atol=1e-5
    )


def test_swin_style_hierarchy_with_local_window():
    model = VisionTransformer(
        image_size=8,
        patch_size=2,
        num_classes=3,
        hidden_dim=8,
        depth=[2, 1],
        num_heads=2,
        mlp_dim=16,
        num_channels=1,
        attention="local_window",
        window_size=2,
    )
    backbone = model.backbone
    assert backbone.pooling == "mean"
    assert backbone.get_layer("block_0_0").attention_layer.shift_size == 0
    assert backbone.get_layer("block_0_1").attention_layer.shift_size == 1
    assert backbone.get_layer("block_0_0").attention_layer.window_size == 2
    assert backbone.get_layer("block_1_0").attention_layer.num_heads == 4
    assert backbone.output.shape == (None, 16)  # width doubled by merging
    x, _ = images(2)
    scores = [keras.ops.convert_to_numpy(s) for s in model.attention_scores(x)]
    # 4x4 grid: 4 windows of 2x2; after merging a 2x2 grid: one window.
    assert [s.shape for s in scores] == [(2, 4, 2, 4, 4)] * 2 + [(2, 1, 4, 4, 4)]
    assert model(x).shape == (2, 3)


class TokenPlugin(keras.layers.Layer):
    """A test plugin: tokens `(B, N, C)` scaled by a learned gate."""

    def __init__(self, num_heads=1, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads

    def build(self, input_shape):
        self.received_shape = tuple(input_shape)
        self.gate = self.add_weight(name="gate", shape=(input_shape[-1],))

    def call(self, tokens):
        return tokens * self.gate

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads}


class GridPlugin(TokenPlugin):
    """A test plugin that asks for the patch grid `(B, h, w, C)`."""

    expects_grid = True


@pytest.fixture
def plugins():
    # Registered for this test only (the shared harness, parametrized over
    # the registry at collection time, should not see them).
    registry.register("test_token_plugin")(TokenPlugin)
    registry.register("test_grid_plugin")(GridPlugin)
    yield
    # Keep the registry as the other tests expect it.
    for name in ("test_token_plugin", "test_grid_plugin"):
        registry._REGISTRY.pop(name, None)
        registry._ORIGINS.pop(name, None)


def test_attention_swaps_by_registry_name_including_plugins(plugins, tmp_path):
    x, _ = images(3)
    tokens = VisionTransformer(**TINY_VIT, attention="test_token_plugin")
    layer = tokens.backbone.get_layer("block_0").attention_layer
    assert isinstance(layer, TokenPlugin)
    assert layer.received_shape == (None, 5, 16)
    assert layer.num_heads == 2  # filled in by name
    assert tokens.attention_scores(x) == [None]
    assert_round_trip(tokens, x, tmp_path)

    grid = VisionTransformer(**TINY_VIT, attention="test_grid_plugin")
    layer = grid.backbone.get_layer("block_0").attention_layer
    assert layer.received_shape == (None, 2, 2, 16)
    assert grid.backbone.pooling == "mean"

    resnet = CBAMResNet(**TINY_RESNET, attention="test_grid_plugin")
    assert resnet.backbone.get_layer("block_1_0").attention_layer.received_shape == (
        None, 4, 4, 16,
    )
    assert resnet(x).shape == (3, 3)


@pytest.mark.parametrize(
    "name", [n for n in registry.names_of_kind("tokens") if not n.startswith("test_")]
)
def test_every_token_layer_runs_in_vit_with_the_offered_arguments(name):
    # Each built-in token layer takes what the block offers (heads, sizes,
    # additive's units), with no attention_kwargs.
    x, y = images(4)
    model = VisionTransformer(**TINY_VIT, attention=name)
    model.compile(optimizer="adam")
    loss = model.train_on_batch(x, y)
    assert np.all(np.isfinite(loss)) and model(x).shape == (4, 3)


# ------------------------------------------------------------ CBAM-ResNet


def test_cbam_resnet_trains_and_saves(tmp_path):
    x, y = images()
    model = CBAMResNet(**TINY_RESNET, attention="cbam")
    fit_loss_goes_down(model, x, y)
    assert_round_trip(model, x[:4], tmp_path)
    maps = model.attention_scores(x[:2])
    channel, spatial = [keras.ops.convert_to_numpy(m) for m in maps[1]]
    assert channel.shape == (2, 16) and spatial.shape == (2, 4, 4, 1)
    # Sigmoid gates: in [0, 1] (a trained gate may round to 0 or 1 in
    # float32), and not one value for every channel.
    assert ((channel >= 0) & (channel <= 1)).all() and channel.std() > 0


@pytest.mark.parametrize("attention", ["channel", "spatial", "non_local", None])
def test_cbam_resnet_attention_modules(attention):
    x, _ = images(2)
    model = CBAMResNet(**TINY_RESNET, attention=attention)
    block = model.backbone.get_layer("block_0_0")
    if attention is None:
        assert block.attention_layer is None
        assert model.attention_scores(x) == [None, None]
    else:
        assert isinstance(block.attention_layer, registry.get_class(attention))
    assert model(x).shape == (2, 3)


def test_resnet_block_without_attention_is_a_basic_block():
    from keras_attention.applications.blocks import ResidualAttentionBlock

    x = np.random.default_rng(2).normal(size=(2, 4, 4, 3)).astype("float32")
    block = ResidualAttentionBlock(3, attention=None)
    out = keras.ops.convert_to_numpy(block(x))
    conv = lambda y, k: keras.ops.convert_to_numpy(  # noqa: E731
        keras.ops.conv(y, k, padding="same")
    )

    def bn(y, layer):
        gamma, beta, mean, var = layer.get_weights()
        return (y - mean) / np.sqrt(var + layer.epsilon) * gamma + beta

    h = np.maximum(bn(conv(x, block.conv1.kernel), block.norm1), 0)
    h = bn(conv(h, block.conv2.kernel), block.norm2)
    np.testing.assert_allclose(out, np.maximum(h + x, 0), atol=1e-4)


# ------------------------------------------------------------ text


TEXTS = [
    "the film was good",
    "the film was bad",
    "a truly good movie",
    "a truly bad movie",
    "the show was not good",
    "the show was not bad",
] * 8  # keras-hub's WordPiece learner keeps words seen ~10 times or more
LABELS = np.array([1, 0, 1, 0, 0, 1] * 8, dtype="int32")


def test_text_classifier_trains_saves_and_explains(tmp_path):
    preprocessor = TextClassifierPreprocessor.from_texts(
        TEXTS, vocabulary_size=100, sequence_length=8
    )
    ids = preprocessor(TEXTS)
    assert ids.shape == (48, 8) and (ids[0, 4:] == 0).all()
    assert preprocessor.tokens(["the film was good"]) == [["the", "film", "was", "good"]]
    model = TextClassifier(
        num_classes=2,
        preprocessor=preprocessor,
        hidden_dim=16,
        depth=1,
        num_heads=2,
        mlp_dim=16,
        dropout=0.0,
        pooling_units=8,
    )
    fit_loss_goes_down(model, ids, LABELS, epochs=15)
    loaded = assert_round_trip(model, ids[:6], tmp_path)
    assert loaded.preprocessor.vocabulary == preprocessor.vocabulary
    weights = loaded.token_weights(ids[:6])
    assert weights.shape == (6, 8)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert (weights[ids[:6] == 0] == 0).all()
    tokens, token_weights = loaded.explain(["the film was bad"])
    assert tokens == [["the", "film", "was", "bad"]] and len(token_weights[0]) == 4
    probabilities = loaded.predict_texts(["the film was bad"])
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)


def test_text_token_weights_of_a_mixed_precision_model_are_float32():
    preprocessor = TextClassifierPreprocessor.from_texts(
        TEXTS, vocabulary_size=100, sequence_length=8
    )
    model = TextClassifier(
        num_classes=2, preprocessor=preprocessor, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, pooling_units=4, dtype="mixed_bfloat16",
    )
    weights = model.token_weights(preprocessor(TEXTS[:2]))
    assert weights.dtype == np.float32
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-2)


def test_text_token_weights_take_python_lists():
    # A list was mapped over as a structure: `'list' object has no
    # attribute 'shape'`, for ids and texts alike.
    preprocessor = TextClassifierPreprocessor.from_texts(
        TEXTS, vocabulary_size=100, sequence_length=8
    )
    model = TextClassifier(
        num_classes=2, preprocessor=preprocessor, hidden_dim=8, depth=1,
        num_heads=2, mlp_dim=8, pooling_units=4,
    )
    ids = np.asarray(preprocessor(TEXTS[:2]))
    np.testing.assert_array_equal(
        model.token_weights(ids.tolist()), model.token_weights(ids)
    )
    with pytest.raises(ValueError, match="not text"):
        model.token_weights(TEXTS[:1])


def test_attention_pooling_matches_numpy():
    from keras_attention.applications.text_classifier import AttentionPooling

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 6)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    layer = AttentionPooling(units=4)
    pooled, weights = layer(x, mask=mask, return_attention_scores=True)
    attention = layer.attention
    w1, w2, b, v = (
        keras.ops.convert_to_numpy(w)
        for w in (attention.query_kernel, attention.key_kernel, attention.bias, attention.score_kernel)
    )
    query = layer.query.numpy()[0]  # (1, C)
    scores = np.tanh(query @ w1 + x @ w2 + b) @ v  # (B, T)
    scores = np.where(mask, scores, -np.inf)
    expected = softmax(scores)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected, atol=1e-5)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(pooled),
        np.einsum("bt,btc->bc", expected, x),
        atol=1e-5,
    )


# ------------------------------------------------------------ presets


@pytest.mark.parametrize(
    "cls, name", [(VisionTransformer, "vit_digits"), (CBAMResNet, "cbam_resnet_digits")]
)
def test_presets_with_weights_predict_digits(cls, name):
    spec = presets.get_preset(name)
    if not os.path.isfile(spec.weights_path):
        pytest.skip(f"{spec.weights_path} not trained yet")
    # 40 digits of the shipped split's test side (seed 0, 20 %), at the
    # preset's input size.
    size = spec.config["image_size"]
    (_, _), (x, y) = keras_attention.datasets.load_digits_images(
        seed=0, image_size=None if size == 8 else size
    )
    model = cls.from_preset(name)
    predicted = np.argmax(keras.ops.convert_to_numpy(model(x[:40])), -1)
    assert (predicted == y[:40]).mean() >= 0.95


def test_from_preset_errors_and_new_head():
    with pytest.raises(ValueError, match="known presets: .*vit_digits"):
        VisionTransformer.from_preset("vit_nonexistent")
    with pytest.raises(ValueError, match="builds a CBAMResNet"):
        VisionTransformer.from_preset("cbam_resnet_digits")
    assert "vit_digits" in VisionTransformer.presets()
    assert set(presets.preset_names("CBAMResNet")) >= {"cbam_resnet_digits"}
    model = VisionTransformer.from_preset("vit_digits", load_weights=False, num_classes=2)
    assert model.num_classes == 2 and model.output.shape == (None, 2)
    model.backbone.trainable = False
    assert len(model.trainable_weights) == 2  # only the new head


def test_fine_tuning_swaps_the_head_and_keeps_the_backbone():
    x, y = images()
    model = VisionTransformer(**TINY_VIT)
    new = model.with_head(2)
    assert new.backbone is model.backbone
    new.backbone.trainable = False
    before = [w.copy() for w in model.backbone.get_weights()]
    # (XLA training is covered above; a graph step is enough here.)
    new.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False)
    new.fit(x, y % 2, epochs=2, verbose=0)
    for a, b in zip(before, model.backbone.get_weights()):
        np.testing.assert_array_equal(a, b)



@pytest.mark.parametrize(
    "cls, kwargs",
    [(VisionTransformer, TINY_VIT), (CBAMResNet, TINY_RESNET)],
    ids=["vit", "cbam_resnet"],
)
def test_frozen_backbone_stays_frozen_after_loading(cls, kwargs, tmp_path):
    model = cls(**kwargs)
    model.backbone.trainable = False
    trainable = len(model.trainable_weights)
    loaded = assert_round_trip(model, images(n=2)[0], tmp_path)
    assert not loaded.backbone.trainable
    assert len(loaded.trainable_weights) == trainable  # only the head
    # Built with `trainable=False`, the backbone's layers are frozen too.
    backbone = cls.backbone_class.from_config(model.backbone.get_config())
    assert backbone.trainable_weights == []
    assert len(cls(backbone=backbone, num_classes=2).trainable_weights) == 2


@pytest.mark.parametrize(
    "cls, kwargs, frozen",
    [(VisionTransformer, TINY_VIT, ("patch_embedding", "block_0")),
     (CBAMResNet, TINY_RESNET, ("stem_conv", "stem_norm", "block_0_0"))],
    ids=["vit", "cbam_resnet"],
)
def test_frozen_layers_stay_frozen_after_loading(cls, kwargs, frozen, tmp_path):
    # As for a plain functional model, whose config keeps each layer's
    # `trainable`: some of the backbone's layers and the head frozen.
    model = cls(**kwargs)
    for name in frozen:
        model.backbone.get_layer(name).trainable = False
    model.get_layer("predictions").trainable = False
    trainable = len(model.trainable_weights)
    loaded = assert_round_trip(model, images(n=2)[0], tmp_path)
    assert loaded.backbone.trainable and loaded.trainable
    assert [layer.name for layer in loaded.backbone.layers
            if not layer.trainable] == list(frozen)
    assert not loaded.get_layer("predictions").trainable
    assert len(loaded.trainable_weights) == trainable
    # Nothing frozen: the config is unchanged (no new key).
    assert "frozen_layers" not in cls(**kwargs).get_config()


# ------------------------------------------------------------ bad input


def test_bad_images_raise_expected_versus_received():
    model = VisionTransformer(**TINY_VIT)
    for shape in [(2, 9, 9, 1), (2, 8, 8, 3)]:
        with pytest.raises(ValueError, match=r"expected .*\(None, 8, 8, 1\).*Received: images.shape="):
            model.predict(np.zeros(shape, "float32"), verbose=0)
        with pytest.raises(ValueError, match=r"\(None, 8, 8, 1\)"):
            model(np.zeros(shape, "float32"))
    resnet = CBAMResNet(**TINY_RESNET, attention=None)
    with pytest.raises(ValueError, match=r"Received: images.shape=\(2, 8, 8, 3\)"):
        resnet.fit(np.zeros((2, 8, 8, 3)), np.zeros(2), verbose=0)
    # Text of the right shape: named, not keras's "Invalid dtype: str32".
    with pytest.raises(ValueError, match="`images`, expected images of numbers"):
        model.predict(np.full((2, 8, 8, 1), "a"), verbose=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(patch_size=3), r"expected a divisor of image_size=\(8, 8\). Received: patch_size=\(3, 3\)"),
        (dict(attention="no_such_layer"), r"one of: .*multi_head.*Received: attention='no_such_layer'"),
        (dict(num_heads=3), r"divisor of the token size 16. Received: num_heads=3"),
        (dict(pooling="max"), r"Received: pooling='max'"),
        (dict(attention="local_window", pooling="cls"), r"expected 'mean'"),
        # Before: the shift of the model's window (4 // 2) with this window
        # of 2, an error naming shift_size, never given.
        (dict(attention="local_window", attention_kwargs={"window_size": 2}),
         r"`attention_kwargs`, expected no window_size.*pass `window_size=`"),
    ],
)
def test_bad_vit_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VisionTransformer(**{**TINY_VIT, **kwargs})


def test_bad_resnet_and_text_arguments():
    with pytest.raises(ValueError, match=r"Received: attention='cbma'"):
        CBAMResNet(**TINY_RESNET, attention="cbma")
    with pytest.raises(ValueError, match=r"Received: filters=0"):
        CBAMResNet(**{**TINY_RESNET, "filters": (8, 0)})
    model = TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8,
    )
    with pytest.raises(ValueError, match=r"\(None, 6\).*at most 6.*Received: token_ids.shape=\(2, 7\)"):
        model.predict(np.ones((2, 7), "int32"), verbose=0)


def test_text_classifier_new_head_keeps_the_preprocessor():
    preprocessor = TextClassifierPreprocessor.from_texts(
        TEXTS, vocabulary_size=100, sequence_length=32
    )
    model = TextClassifier.from_preset(
        "text_sentiment_small", preprocessor=preprocessor, depth=1
    )
    assert model.with_head(3).preprocessor is preprocessor
    other = TextClassifierPreprocessor.from_texts(
        TEXTS, vocabulary_size=50, sequence_length=32
    )
    assert model.with_head(3, preprocessor=other).preprocessor is other
    new = TextClassifier.from_preset(
        "text_sentiment_small", preprocessor=preprocessor, depth=1, num_classes=3
    )
    assert new.num_classes == 3 and new.preprocessor is preprocessor
    assert new.predict_texts(["the film was good"]).shape == (1, 3)
    assert new.predict_texts([]).shape == (0, 3)  # was NumPy's concatenate error


def test_text_token_ids_outside_the_vocabulary_are_refused():
    model = TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8,
    )
    ids = np.ones((2, 6), "int32")
    ids[1, 2] = 20  # an embedding's gather error on TF, garbage under XLA
    match = r"`token_ids`.*\[0, 20\) for vocabulary_size=20.*\[1, 20\]"
    for call in (model.predict, model.evaluate):
        with pytest.raises(ValueError, match=match):
            call(ids, verbose=0) if call is model.predict else call(
                ids, np.zeros(2), verbose=0
            )
    with pytest.raises(ValueError, match=match):
        model.token_weights(ids)
    with pytest.raises(ValueError, match=match):
        model(keras.ops.convert_to_tensor(ids))
    bert = TextClassifier(
        vocabulary_size=20, sequence_length=6, num_classes=2, hidden_dim=8,
        depth=1, num_heads=2, mlp_dim=8, token_types=2, pooling="cls",
    )
    types = np.zeros((2, 6), "int32")
    types[0, 0] = 2
    with pytest.raises(ValueError, match=r"`token_type_ids`.*token_types=2"):
        bert.predict({"token_ids": np.ones((2, 6), "int32"),
                      "token_type_ids": types}, verbose=0)
    assert model.predict(ids % 20, verbose=0).shape == (2, 2)



def test_text_benchmark_scores_sentences_it_never_trained_on():
    # The sentiment generator repeats sentences across seeds: 94 of the
    # 1,000 test sentences (seed 1) were among the 4,000 training ones.
    bench = benchmark_scripts.load("bench_classification")
    train, test = bench.text_splits("test")
    train_again, validation = bench.text_splits("validation")
    assert train[0] == train_again[0] and len(train[0]) == 4000
    assert len(test[0]) == len(validation[0]) == 1000
    assert not set(train[0]) & set(test[0])
    assert not set(train[0]) & set(validation[0])
    assert not set(validation[0]) & set(test[0])


def test_finetune_benchmark_has_no_validation_split():
    # Its validation images would come out of the training split, on which
    # the shipped backbones were trained: a score that flatters.
    import argparse

    bench = benchmark_scripts.load("bench_classification")
    with pytest.raises(SystemExit, match="--evaluate-on test"):
        bench.finetune_task(argparse.Namespace(evaluate_on="validation"))
