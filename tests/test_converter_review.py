"""Checkpoints of real configurations convert exactly, or are refused by name.

Found by converting the configurations of published checkpoints (built
locally with random weights, no download): the hybrid ViTs, timm's other
attention layers and Swin's `head_dim`, Hugging Face's ViT at another image
size, a BERT classifier given `num_classes=0`, a model on the meta device or
under `torch.compile`, and the files timm itself reads through its
`checkpoint_filter_fn` (the original Swin layout, another `img_size`) or
with DistributedDataParallel's `module.` names.
"""

import sys

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the converters' tests need torch")
timm = pytest.importorskip("timm", reason="the converters' tests need timm")
transformers = pytest.importorskip(
    "transformers", reason="the converters' tests need transformers"
)

from timm.models import vision_transformer as timm_vit  # noqa: E402

from keras_attention.applications import TextClassifier  # noqa: E402
from keras_attention.applications import VisionTransformer  # noqa: E402
from keras_attention.applications.converters import common  # noqa: E402
from keras_attention.applications.converters import vit as vit_converters  # noqa: E402


def _randomize(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.2, generator=generator)
    return module.eval()


@pytest.mark.parametrize(
    "name", ["vit_base_r50_s16_224", "vit_base_mci_224"], ids=["r50", "mci"]
)
def test_a_hybrid_vit_is_refused_by_its_embed_layer(name):
    """A CNN stem (`HybridEmbed`) is not the one patch convolution: it
    raised an AttributeError (mci) or listed 150 tensors (r50)."""
    with torch.device("meta"):  # the structure only
        reference = timm.create_model(name, pretrained=False, depth=1)
    with pytest.raises(ValueError, match="embed_layer='HybridEmbed'"):
        VisionTransformer.from_timm(reference, num_classes=10)


def test_another_attention_layer_is_refused_by_name():
    """timm's `attn_layer="diff"` was refused only by a list of its extra
    tensors; one of the same tensors would have converted silently."""
    reference = timm_vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4,
        num_classes=10, attn_layer="diff",
    )
    with pytest.raises(ValueError, match=r"attn_layer='DiffAttention' .*blocks\.0"):
        VisionTransformer.from_timm(reference)


@pytest.mark.parametrize("size", [48, 24, (40, 56)])
def test_hf_vit_at_another_image_size_is_hugging_faces(size):
    """`from_transformers(..., image_size=)` gives Hugging Face's logits
    with `interpolate_pos_encoding=True` (plain bicubic); it resampled as
    timm does (antialiased), 4e-4 to 8e-4 off."""
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=128, num_labels=10,
    )
    reference = _randomize(transformers.ViTForImageClassification(config))
    size = (size, size) if isinstance(size, int) else size
    model = VisionTransformer.from_transformers(reference, image_size=size)
    images = np.random.RandomState(0).randn(2, *size, 3).astype("float32")
    with torch.no_grad():
        expected = reference(
            torch.from_numpy(images.transpose(0, 3, 1, 2)),
            interpolate_pos_encoding=True,
        ).logits.numpy()
    ours = keras.ops.convert_to_numpy(model(images))
    assert np.abs(expected - ours).max() < 1e-5


@pytest.mark.parametrize("new_grid", [(7, 7), (2, 3), (4, 4), (9, 5)])
def test_plain_bicubic_resampling_is_torchs(new_grid):
    embedding = np.random.RandomState(0).randn(1, 1 + 16, 8).astype("float32")
    ours = common.resample_position_embedding(
        embedding, (4, 4), new_grid, prefix_tokens=1, antialias=False
    )
    grid = torch.from_numpy(embedding[:, 1:]).reshape(1, 4, 4, 8).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(
        grid, size=new_grid, mode="bicubic", align_corners=False
    ).permute(0, 2, 3, 1).reshape(1, -1, 8).numpy()
    np.testing.assert_allclose(ours[:, 1:], expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(ours[:, :1], embedding[:, :1])


def test_bert_num_classes_zero_is_refused():
    """`num_classes=0` silently became the checkpoint's number of classes."""
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3,
    )
    reference = transformers.BertForSequenceClassification(config).eval()
    with pytest.raises(ValueError, match="num_classes=0"):
        TextClassifier.from_transformers(reference, num_classes=0, sequence_length=8)


def test_a_model_on_the_meta_device_is_named():
    """A structure without data (`torch.device("meta")`) raised torch's
    NotImplementedError ("Cannot copy out of meta tensor")."""
    with torch.device("meta"):
        reference = timm_vit.VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4,
            num_classes=10,
        )
    with pytest.raises(ValueError, match="meta device"):
        VisionTransformer.from_timm(reference)


def test_swin_heads_of_another_size_are_refused_by_name():
    """timm's `head_dim` (heads of another size than dim / heads) was
    refused only by a list of misshapen tensors."""
    from timm.models import swin_transformer as timm_swin

    reference = timm_swin.SwinTransformer(
        img_size=32, patch_size=4, window_size=2, embed_dim=16, depths=(2, 2),
        num_heads=(2, 4), num_classes=10, head_dim=4,
    )
    with pytest.raises(ValueError, match=r"head_dim=4 \(layers\.0\.blocks\.0\)"):
        VisionTransformer.from_timm(reference)


SWIN = dict(img_size=32, window_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4))


def test_an_original_swin_file_reads_as_timm_reads_it(tmp_path):
    """The original Swin `.pth` (downsampling at the end of a stage, `head`,
    the `relative_position_index` buffers) goes through timm's
    `checkpoint_filter_fn`, as timm loads it; it was refused."""
    import re

    name = "swin_tiny_patch4_window7_224"
    reference = _randomize(timm.create_model(name, num_classes=10, **SWIN))
    state = {"layers.0.blocks.0.attn.relative_position_index": torch.zeros(4, 4)}
    for key, value in reference.state_dict().items():
        key = re.sub(
            r"layers\.(\d+)\.downsample",
            lambda match: f"layers.{int(match.group(1)) - 1}.downsample", key,
        )
        state[key.replace("head.fc.", "head.")] = value
    path = str(tmp_path / "swin.pth")
    torch.save({"model": state}, path)
    model = VisionTransformer.from_timm(path, model_name=name, model_kwargs=SWIN)
    images = np.random.RandomState(1).randn(2, 32, 32, 3).astype("float32")
    with torch.no_grad():
        expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
    assert np.abs(keras.ops.convert_to_numpy(model(images)) - expected).max() < 1e-5


def test_a_vit_file_for_another_img_size_resamples_as_timm(tmp_path):
    """`model_kwargs={"img_size": 48}` with a file of a 32-pixel ViT: timm's
    filter resamples the position embedding; it was refused."""
    from timm.models import load_checkpoint

    options = dict(patch_size=8, embed_dim=64, depth=1, num_heads=4, num_classes=10)
    source = _randomize(timm_vit.VisionTransformer(img_size=32, **options))
    path = str(tmp_path / "vit.pth")
    torch.save(source.state_dict(), path)
    reference = timm_vit.VisionTransformer(img_size=48, **options)
    load_checkpoint(reference, path, filter_fn=timm_vit.checkpoint_filter_fn)
    model = VisionTransformer.from_timm(
        path, model_name="vit_base_patch16_224",
        model_kwargs=dict(img_size=48, **options),
    )
    images = np.random.RandomState(1).randn(2, 48, 48, 3).astype("float32")
    with torch.no_grad():
        expected = reference.eval()(
            torch.from_numpy(images.transpose(0, 3, 1, 2))
        ).numpy()
    assert np.abs(keras.ops.convert_to_numpy(model(images)) - expected).max() < 1e-5


def _small_vit(**options):
    return _randomize(timm_vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4,
        num_classes=10, **options,
    ))


def _difference(reference, model):
    images = np.random.RandomState(1).randn(2, 32, 32, 3).astype("float32")
    with torch.no_grad():
        expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2)))
    expected = getattr(expected, "logits", expected).numpy()
    return np.abs(keras.ops.convert_to_numpy(model(images)) - expected).max()


def test_a_compiled_model_converts():
    """`torch.compile(model)` was refused as an `OptimizedModule`."""
    reference = _small_vit()
    model = VisionTransformer.from_timm(torch.compile(reference))
    assert _difference(reference, model) < 1e-5
    hf = _randomize(transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=128, num_labels=10,
    )))
    assert _difference(hf, VisionTransformer.from_transformers(torch.compile(hf))) < 1e-5


def test_a_distributed_data_parallel_file_converts(tmp_path):
    """Names under `module.` (a model saved inside DistributedDataParallel)
    are read as timm's `load_checkpoint` reads them; it said "The checkpoint
    has no classification head"."""
    reference = _small_vit()
    path = str(tmp_path / "vit.pth")
    torch.save(
        {"state_dict": {"module." + k: v for k, v in reference.state_dict().items()}},
        path,
    )
    model = VisionTransformer.from_timm(
        path, model_name="vit_base_patch16_224",
        model_kwargs=dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4),
    )
    assert _difference(reference, model) < 1e-5


def test_a_timm_training_checkpoint_converts_as_timm_loads_it(tmp_path):
    """timm's train.py writes `model_best.pth.tar` with the EMA weights
    beside the raw ones, and a compiled model's names under `_orig_mod.`:
    the `.tar` suffix was refused, the raw weights taken over timm's EMA
    (0.7 apart in the logits), and `_orig_mod.` read as "no head"."""
    from timm.models import load_checkpoint

    raw, ema = _small_vit(), _small_vit()
    _randomize(ema, seed=1)
    path = str(tmp_path / "model_best.pth.tar")
    torch.save(
        {"epoch": 9, "state_dict": raw.state_dict(),
         "state_dict_ema": {"_orig_mod." + k: v for k, v in ema.state_dict().items()}},
        path,
    )
    timm_loaded = _small_vit()
    load_checkpoint(timm_loaded, path)
    with pytest.warns(UserWarning, match="took the EMA's"):
        model = VisionTransformer.from_timm(
            path, model_name="vit_base_patch16_224",
            model_kwargs=dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4),
        )
    assert _difference(timm_loaded, model) < 1e-5
    assert _difference(raw, model) > 1e-2


def test_a_keyword_that_contradicts_the_checkpoint_is_refused():
    """Eight heads read from four, or another norm epsilon, keep every
    shape: they loaded with logits 1e-3 and 0.24 off timm's."""
    reference = _small_vit()
    for override in (dict(num_heads=8), dict(layer_norm_epsilon=1e-2)):
        (key,) = override
        with pytest.raises(ValueError, match=f"the checkpoint fixes {key}="):
            VisionTransformer.from_timm(reference, **override)
    # The checkpoint's own values, and dropout, may be given.
    model = VisionTransformer.from_timm(
        reference, num_heads=4, patch_size=(8, 8), dropout=0.1
    )
    assert _difference(reference, model) < 1e-5


def test_a_rectangular_swin_window_is_refused_as_such():
    """It was refused as a patch grid "smaller than the window" (16 x 16
    against 4 x 8)."""
    from timm.models import swin_transformer as timm_swin

    reference = timm_swin.SwinTransformer(
        img_size=64, patch_size=4, window_size=(4, 8), embed_dim=16,
        depths=(1,), num_heads=(2,), num_classes=5,
    ).eval()
    with pytest.raises(ValueError, match=r"window_size=\(4, 8\).*square windows only"):
        VisionTransformer.from_timm(reference)


def test_timm_s_own_exact_gelu_converts_and_its_tanh_form_is_refused():
    """`act_layer="gelu"` builds timm's `GELU` (`F.gelu`, exact), not
    torch's `nn.GELU`: it was refused as another activation."""
    reference = _small_vit(act_layer="gelu")
    assert _difference(reference, VisionTransformer.from_timm(reference)) < 1e-5
    with pytest.raises(ValueError, match="act_layer"):
        VisionTransformer.from_timm(_small_vit(act_layer="gelu_tanh"))


def test_a_tensor_of_the_right_size_but_another_shape_is_refused_by_name(tmp_path):
    """A flattened qkv weight, an attention output weight with a trailing
    axis of 1 or a 2-D bias reshaped to the kernels without a word and
    loaded wrong (logits 0.07 off); with `model_name`, timm's own filter
    failed on a misshapen position embedding with an IndexError."""
    reference = _small_vit()
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    config, _, _ = vit_converters.timm_arguments(reference)
    cases = {
        "blocks.0.attn.qkv.weight": lambda a: a.reshape(-1),
        "blocks.0.attn.proj.weight": lambda a: a[..., None],
        "blocks.0.attn.qkv.bias": lambda a: a.reshape(3, -1),
    }
    for key, change in cases.items():
        path = str(tmp_path / "bad.pth")
        torch.save({k: torch.from_numpy(change(v) if k == key else v)
                    for k, v in state.items()}, path)
        with pytest.raises(ValueError, match=f"tensor '{key}' of shape"):
            VisionTransformer.from_timm(path, config=config)
    torch.save({k: torch.from_numpy(v[0] if k == "pos_embed" else v)
                for k, v in state.items()}, path)
    with pytest.raises(ValueError, match="tensor 'pos_embed' of shape"):
        VisionTransformer.from_timm(
            path, model_name="vit_base_patch16_224",
            model_kwargs=dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4),
        )
    # One block's missing bias is named as missing (it was read from
    # block 0 alone: the others' were "unexpected").
    reference = _randomize(timm_vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
        num_classes=10,
    ))
    config, _, _ = vit_converters.timm_arguments(reference)
    torch.save({k: v for k, v in reference.state_dict().items()
                if k != "blocks.0.attn.qkv.bias"}, path)
    with pytest.raises(ValueError, match="missing tensor 'blocks.0.attn.qkv.bias'"):
        VisionTransformer.from_timm(path, config=config)


def test_a_missing_safetensors_or_torch_is_named_with_what_to_install(
    tmp_path, monkeypatch
):
    # A bare ModuleNotFoundError before (and a traceback from the command).
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    (tmp_path / "model.pth").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(ValueError, match="needs the safetensors package: pip install safetensors"):
        common.read_checkpoint(str(tmp_path / "model.safetensors"))
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ValueError, match=r"needs torch.*keras-attention-layers\[convert\]"):
        common.read_checkpoint(str(tmp_path / "model.pth"))
