"""Hugging Face DETR checkpoints convert exactly into `DETR`, or not at all.

The references are `DetrForObjectDetection` / `DetrModel` built locally
from small `DetrConfig`s with random weights (no download): the timm
ResNet-18 backbone (the published checkpoints use timm's ResNets) and
Hugging Face's own ResNet; the full DETR-ResNet-50 layout under
`--run-large`. Logits and boxes are compared within 1e-4 in float32, NCHW
images for torch and NHWC for ours, with and without a pixel mask.
"""

import json
import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the converters' tests need torch")
pytest.importorskip("timm", reason="the converters' tests need timm")
transformers = pytest.importorskip(
    "transformers", reason="the converters' tests need transformers"
)
safetensors_numpy = pytest.importorskip(
    "safetensors.numpy", reason="the converters' tests need safetensors"
)

from keras_attention import visualization as vis  # noqa: E402
from keras_attention.applications import DETR  # noqa: E402

ATOL = 1e-4
HEIGHT, WIDTH = 96, 128  # a 3 x 4 feature grid
IMAGES = np.random.RandomState(0).randn(2, HEIGHT, WIDTH, 3).astype("float32")
MASK = np.ones((2, HEIGHT, WIDTH), "int64")
MASK[0, :, 90:] = 0  # padded on the right
MASK[1, 60:, :] = 0  # and at the bottom
SMALL = dict(
    d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
    num_queries=5, num_labels=3,
)
TIMM_RESNET18 = dict(backbone="resnet18", use_timm_backbone=True)


def _hf_resnet18():
    return dict(
        use_timm_backbone=False,
        backbone_config=transformers.ResNetConfig(
            depths=[2, 2, 2, 2], layer_type="basic",
            hidden_sizes=[64, 128, 256, 512], out_features=["stage4"],
        ),
    )


def _randomize(module, seed=0):
    """Weights far from their initial values, batch norm statistics too
    (frozen batch norm keeps them in buffers), so a swap shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.2, generator=generator)
        for name, buffer in module.named_buffers():
            if name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5, generator=generator)
            elif name.endswith(("running_mean", "weight", "bias")):
                buffer.normal_(0.0, 0.2, generator=generator)
    return module.eval()


def _reference(kind=transformers.DetrForObjectDetection, **options):
    config = transformers.DetrConfig(**{**SMALL, **TIMM_RESNET18, **options})
    return _randomize(kind(config))


def _torch_outputs(reference, images=IMAGES, mask=None):
    with torch.no_grad():
        out = reference(
            pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2)),
            pixel_mask=None if mask is None else torch.from_numpy(mask),
        )
    return out


def _differences(reference, model, images=IMAGES, mask=None):
    expected = _torch_outputs(reference, images, mask)
    ours = model(images, pixel_mask=mask)
    return (
        np.abs(expected.logits.numpy() - np.asarray(ours["logits"])).max(),
        np.abs(expected.pred_boxes.numpy() - np.asarray(ours["boxes"])).max(),
    )


@pytest.fixture(scope="module")
def timm_reference():
    return _reference()


@pytest.fixture(scope="module")
def converted(timm_reference):
    return DETR.from_transformers(timm_reference, image_size=(HEIGHT, WIDTH))


@pytest.mark.parametrize("backbone", ["timm", "transformers"])
def test_detr_converts_exactly(backbone, timm_reference):
    reference = (
        timm_reference if backbone == "timm" else _reference(**_hf_resnet18())
    )
    model = DETR.from_transformers(reference, image_size=(HEIGHT, WIDTH))
    assert model.backbone_type == "resnet" and model.resnet_block == "basic"
    assert model.resnet_depths == (2, 2, 2, 2)
    assert model.transformer_attention == "multi_head"
    for mask in (None, MASK):
        logits, boxes = _differences(reference, model, mask=mask)
        assert logits < ATOL and boxes < ATOL, (mask is not None, logits, boxes)
    # The mask changes the answer (the padded cells are not attended).
    plain = np.asarray(model(IMAGES)["logits"])
    masked = np.asarray(model(IMAGES, pixel_mask=MASK)["logits"])
    assert np.abs(plain - masked).max() > 1e-3


def test_predict_boxes_of_a_padded_batch_equal_transformers_post_processing(
    converted, timm_reference
):
    # Before: predict_boxes took no pixel_mask, so a padded batch attended
    # its padding and scaled every box by the padded size.
    from transformers import DetrImageProcessor

    found = converted.predict_boxes(
        IMAGES, score_threshold=0.0, pixel_mask=MASK, return_attention=True,
        upsample_attention=True,
    )
    sizes = [(HEIGHT, 90), (60, WIDTH)]
    expected = DetrImageProcessor().post_process_object_detection(
        _torch_outputs(timm_reference, mask=MASK), threshold=0.0,
        target_sizes=sizes,
    )
    for ours, theirs, (h, w) in zip(found, expected, sizes):
        order = np.argsort(-theirs["scores"].numpy(), kind="stable")
        np.testing.assert_allclose(ours["scores"], theirs["scores"].numpy()[order], atol=1e-5)
        np.testing.assert_allclose(ours["boxes"], theirs["boxes"].numpy()[order], atol=1e-3)
        assert ours["attention"].shape[1:] == (h, w)  # cropped to the image
        np.testing.assert_allclose(ours["attention"].sum(axis=(1, 2)), 1.0, atol=1e-5)
    # Without attention maps too (the same boxes).
    plain = converted.predict_boxes(IMAGES, score_threshold=0.0, pixel_mask=MASK)
    np.testing.assert_allclose(plain[1]["boxes"], found[1]["boxes"], atol=1e-4)
    with pytest.raises(ValueError, match=r"`pixel_mask`, expected shape \(2, 96, 128\)"):
        converted.predict_boxes(IMAGES, pixel_mask=MASK[:, :, :5])
    empty = MASK.copy()
    empty[1] = 0
    with pytest.raises(ValueError, match="`pixel_mask`.*no pixel of image 1"):
        converted.predict_boxes(IMAGES, pixel_mask=empty)


def test_explorer_page_of_a_padded_image(converted, tmp_path):
    from keras_attention.visualization import explore
    from tests.test_explorer import dequantised
    from tests.test_explorer import page_data

    path = explore(converted, IMAGES, tmp_path / "detr.html", index=1,
                   pixel_mask=MASK, score_threshold=0.0)
    data = page_data(path)
    found = converted.predict_boxes(IMAGES, score_threshold=0.0, pixel_mask=MASK)[1]
    boxes = np.array([o["box"] for o in data["objects"]])
    np.testing.assert_allclose(boxes, found["boxes"], atol=0.02)  # 60 x 128 pixels
    # The padded rows of the feature grid (the bottom one of 3 x 4) unseen.
    layer = data["layers"][0]
    weights = dequantised(layer).reshape(layer["heads"], layer["rows"], *layer["grid"])
    assert weights[..., 2, :].max() == 0.0 and weights[..., :2, :].max() > 0.0


def test_odd_image_sizes_pad_as_pytorch(converted, timm_reference):
    """PyTorch pads its stride-2 convolutions and max pool on both sides
    (Keras's "same" pads more at the end): odd sizes show a difference."""
    images = np.random.RandomState(5).randn(1, 75, 101, 3).astype("float32")
    logits, boxes = _differences(timm_reference, converted, images)
    assert logits < ATOL and boxes < ATOL
    backbone = converted.backbone
    assert backbone(images).shape == backbone.compute_output_shape(images.shape)
    clone = type(backbone).from_config(backbone.get_config())
    assert clone.get_config() == backbone.get_config()


def test_frozen_batch_norm_and_training_call(converted, timm_reference):
    """Batch norm uses the checkpoint's statistics in a training call too,
    and its scale and shift are not trainable, as in DETR."""
    norms = [n for _, _, n in converted.backbone.named_units()]
    assert not any(n.trainable for n in norms)
    before = [np.array(n.moving_mean) for n in norms]
    converted(IMAGES, training=True)
    assert all(
        np.array_equal(a, np.array(n.moving_mean)) for a, n in zip(before, norms)
    )
    trainable = {id(v) for v in converted.trainable_variables}
    assert not any(id(n.gamma) in trainable for n in norms)


def test_detr_model_and_a_new_class_head(timm_reference):
    bare = _reference(kind=transformers.DetrModel)
    with pytest.raises(ValueError, match="num_classes"):
        DETR.from_transformers(bare)
    model = DETR.from_transformers(bare, num_classes=4, image_size=64)
    assert model(IMAGES[:1, :64, :64])["logits"].shape == (1, 5, 5)

    # Another number of classes: a new class head, the checkpoint's boxes.
    model = DETR.from_transformers(
        timm_reference, num_classes=7, image_size=(HEIGHT, WIDTH)
    )
    assert model(IMAGES)["logits"].shape == (2, 5, 8)
    expected = _torch_outputs(timm_reference).pred_boxes.numpy()
    assert np.abs(expected - np.asarray(model(IMAGES)["boxes"])).max() < ATOL


def test_hub_folder(tmp_path, timm_reference):
    """What `save_pretrained` writes (hub names: `conv_encoder`,
    `out_proj`, `layers.N.fc1`), read with safetensors into NumPy."""
    timm_reference.save_pretrained(tmp_path / "detr")
    model = DETR.from_transformers(
        str(tmp_path / "detr"), image_size=(HEIGHT, WIDTH)
    )
    logits, boxes = _differences(timm_reference, model, mask=MASK)
    assert logits < ATOL and boxes < ATOL

    # The config of the published checkpoints (transformers 4): no
    # backbone_config, `use_timm_backbone` and `backbone` at the top.
    with open(tmp_path / "detr" / "config.json") as f:
        config = json.load(f)
    del config["backbone_config"]
    config.update(use_timm_backbone=True, backbone="resnet18",
                  use_pretrained_backbone=True)
    with open(tmp_path / "detr" / "config.json", "w") as f:
        json.dump(config, f)
    model = DETR.from_transformers(str(tmp_path / "detr"), image_size=64)
    logits, boxes = _differences(timm_reference, model)
    assert logits < ATOL and boxes < ATOL


def _edited_folder(tmp_path, reference, edit_tensors=None, edit_config=None):
    folder = tmp_path / "edited"
    reference.save_pretrained(folder)
    path = os.path.join(folder, "model.safetensors")
    tensors = safetensors_numpy.load_file(path)
    if edit_tensors:
        edit_tensors(tensors)
    safetensors_numpy.save_file(tensors, path, metadata={"format": "pt"})
    if edit_config:
        with open(folder / "config.json") as f:
            config = json.load(f)
        edit_config(config)
        with open(folder / "config.json", "w") as f:
            json.dump(config, f)
    return str(folder)


def test_mismatches_name_the_tensor_and_assign_nothing(
    tmp_path, timm_reference, assigned_variables
):
    def damage(tensors):
        del tensors["model.decoder.layers.1.fc2.bias"]
        tensors["model.encoder.layers.0.extra"] = np.zeros(3, "float32")
        tensors["bbox_predictor.layers.2.bias"] = np.zeros(5, "float32")

    folder = _edited_folder(tmp_path, timm_reference, damage)
    with pytest.raises(ValueError) as info:
        DETR.from_transformers(folder, image_size=64)
    message = str(info.value)
    assert "missing tensor 'model.decoder.layers.1.fc2.bias'" in message
    assert "unexpected tensor 'model.encoder.layers.0.extra'" in message
    assert "bbox_predictor.layers.2.bias" in message and "(5,)" in message
    assert assigned_variables == []

    # A config that disagrees with the tensors: more layers, another width,
    # another ResNet.
    for edit, name in (
        (lambda c: c.update(decoder_layers=3), "model.decoder.layers.2"),
        (lambda c: c.update(encoder_ffn_dim=128, decoder_ffn_dim=128),
         "model.encoder.layers.0.fc1.weight"),
        (lambda c: c["backbone_config"].update(backbone="resnet34"),
         "model.backbone.conv_encoder.model.layer1.2.conv1.weight"),
    ):
        folder = _edited_folder(tmp_path, timm_reference, edit_config=edit)
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            DETR.from_transformers(folder, image_size=64)
    assert assigned_variables == []


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(position_embedding_type="learned"), "position_embedding_type"),
        (dict(activation_function="gelu"), "activation_function"),
        (dict(decoder_attention_heads=8), "decoder_attention_heads"),
        (dict(backbone="resnet18d"), "resnet18d"),
        (dict(dilation=True), "dilation"),
        # Hugging Face then normalizes between decoder layers (logits 0.4 off).
        (dict(auxiliary_loss=True), "auxiliary_loss"),
    ],
)
def test_options_not_covered(options, match):
    config = transformers.DetrConfig(**{**SMALL, **TIMM_RESNET18, **options})
    reference = transformers.DetrForObjectDetection(config)
    with pytest.raises(ValueError, match=match):
        DETR.from_transformers(reference)


def test_a_backbone_read_before_its_last_stage_is_refused(tmp_path, timm_reference):
    """DETR reads the backbone's last feature map: with `out_features` (or
    `out_indices`) ending before the last stage, that is another one."""
    hf_reference = _reference(
        use_timm_backbone=False,
        backbone_config=transformers.ResNetConfig(
            depths=[1, 1, 1, 1], layer_type="basic",
            hidden_sizes=[64, 128, 256, 512], out_features=["stage3"],
        ),
    )
    with pytest.raises(ValueError, match=r"out_features=\['stage3'\]"):
        DETR.from_transformers(hf_reference)
    folder = _edited_folder(
        tmp_path, timm_reference,
        edit_config=lambda c: c["backbone_config"].update(out_indices=[1, 2, 3]),
    )
    with pytest.raises(ValueError, match=r"backbone\.out_indices=\[1, 2, 3\]"):
        DETR.from_transformers(folder)


def test_other_architectures_are_refused(tmp_path):
    vit = transformers.ViTForImageClassification(
        transformers.ViTConfig(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=32,
        )
    )
    with pytest.raises(ValueError, match="DetrForObjectDetection"):
        DETR.from_transformers(vit)
    vit.save_pretrained(tmp_path / "vit")
    with pytest.raises(ValueError, match="ViTForImageClassification"):
        DETR.from_transformers(str(tmp_path / "vit"))
    with pytest.raises(ValueError, match="source"):
        DETR.from_transformers(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="image_size"):
        DETR.from_transformers(str(tmp_path / "vit"), image_size=(0, 64))
    with pytest.raises(ValueError, match="backbone_type"):
        DETR(num_classes=3, backbone_type="vgg")
    with pytest.raises(ValueError, match="resnet_depths"):
        DETR(num_classes=3, backbone_type="resnet", resnet_depths=(3, 0))


# ------------------------------------------------ a converted DETR works


def test_predict_boxes_pictures_and_keras_file(tmp_path, converted, timm_reference):
    detections = converted.predict_boxes(
        IMAGES, score_threshold=0.0, return_attention=True
    )
    assert len(detections) == 2
    first = detections[0]
    assert first["boxes"].shape == (5, 4) and first["attention"].shape == (5, 3, 4)
    assert np.allclose(first["attention"].sum(axis=(1, 2)), 1.0, atol=1e-5)
    figure = vis.plot_detections(
        IMAGES[0], first["boxes"], first["labels"], scores=first["scores"],
        attention_maps=first["attention"], box_format="xyxy",
        normalized=False, path=str(tmp_path / "detections.png"),
    )
    assert figure is not None and os.path.getsize(tmp_path / "detections.png")
    maps = vis.attention_maps(converted, IMAGES[:1])
    cross = [k for k in maps if "cross_attention" in k]
    assert len(cross) == 2 and maps[cross[-1]].shape == (1, 4, 5, 12)
    page = vis.explore(converted, IMAGES[:1], str(tmp_path / "detr.html"))
    assert os.path.getsize(page)

    path = str(tmp_path / "detr.keras")
    converted.save(path)
    loaded = keras.saving.load_model(path)
    for mask in (None, MASK):
        logits, boxes = _differences(timm_reference, loaded, mask=mask)
        assert logits < ATOL and boxes < ATOL


@pytest.mark.parametrize(
    "jit_compile", [False, pytest.param(True, marks=pytest.mark.large)]
)
def test_converted_detr_fine_tunes(timm_reference, jit_compile):
    """A new class head, one training epoch on padded targets (compiled by
    XLA under `--run-large`); the frozen batch norm's statistics stay the
    checkpoint's."""
    model = DETR.from_transformers(
        timm_reference, num_classes=2, image_size=(HEIGHT, WIDTH)
    )
    norms = [n for _, _, n in model.backbone.named_units()]
    before = [np.array(n.moving_variance) for n in norms]
    model.compile(optimizer="adam", jit_compile=jit_compile)
    targets = {
        "boxes": np.array([[[0.3, 0.4, 0.2, 0.2], [0, 0, 0, 0]]] * 2, "float32"),
        "labels": np.array([[1, -1], [0, -1]], "int32"),
    }
    history = model.fit(IMAGES, targets, epochs=1, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert all(
        np.array_equal(a, np.array(n.moving_variance))
        for a, n in zip(before, norms)
    )
    assert len(model.predict_boxes(IMAGES, score_threshold=0.0)) == 2


def test_convert_command(tmp_path, capsys, timm_reference):
    from keras_attention import cli

    timm_reference.save_pretrained(tmp_path / "detr")
    out = str(tmp_path / "detr.keras")
    assert cli.main(["convert", str(tmp_path / "detr"), "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "DETR: ResNet basic [2, 2, 2, 2]" in printed and "Saved" in printed
    logits, boxes = _differences(timm_reference, keras.saving.load_model(out))
    assert logits < ATOL and boxes < ATOL


@pytest.mark.large
def test_full_size_detr_resnet_50():
    """The layout of `facebook/detr-resnet-50` (timm ResNet-50, 6 + 6
    layers of width 256, 100 queries, 91 labels), transformers' own
    initialisation, on 320 x 480 images."""
    config = transformers.DetrConfig(num_labels=91)
    reference = transformers.DetrForObjectDetection(config).eval()
    model = DETR.from_transformers(reference)
    assert model.resnet_depths == (3, 4, 6, 3)
    assert model.resnet_block == "bottleneck"
    images = np.random.RandomState(1).randn(1, 320, 480, 3).astype("float32")
    mask = np.ones((1, 320, 480), "int64")
    mask[:, :, 400:] = 0
    for m in (None, mask):
        logits, boxes = _differences(reference, model, images, m)
        assert logits < ATOL and boxes < ATOL
