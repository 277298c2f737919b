"""timm and Hugging Face ViT checkpoints convert exactly, or not at all.

The reference models are built locally with random weights (no download):
small configurations in the default run, the full `vit_base_patch16_224`
layout under `--run-large`. Logits are compared on the same images, NCHW
for torch and NHWC for ours, within 1e-4 in float32.
"""

import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the converters' tests need torch")
timm = pytest.importorskip("timm", reason="the converters' tests need timm")
transformers = pytest.importorskip(
    "transformers", reason="the converters' tests need transformers"
)
safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="the converters' tests need safetensors"
)

from timm.models import vision_transformer as timm_vit  # noqa: E402

from keras_attention.applications import VisionTransformer  # noqa: E402
from keras_attention.visualization import attention_rollout  # noqa: E402

ATOL = 1e-4
IMAGES = np.random.RandomState(0).randn(2, 32, 32, 3).astype("float32")


def _randomize(module, seed=0):
    """Weights far from their initial values (LayerNorm scales and biases
    too), so that a transposed or swapped tensor shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.2, generator=generator)
    return module.eval()


def _timm_vit(**options):
    config = dict(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
        num_classes=10,
    )
    config.update(options)
    return _randomize(timm_vit.VisionTransformer(**config))


def _hf_config(**options):
    config = dict(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, num_labels=10,
    )
    config.update(options)
    return transformers.ViTConfig(**config)


def _torch_logits(model, images=IMAGES):
    with torch.no_grad():
        out = model(torch.from_numpy(images.transpose(0, 3, 1, 2)))
    out = getattr(out, "logits", out)
    return out.numpy()


def _difference(reference, model, images=IMAGES):
    ours = keras.ops.convert_to_numpy(model(images))
    return np.abs(_torch_logits(reference, images) - ours).max()


def _weights(model):
    return [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize(
    "options",
    [
        {},  # class token, norm before the pooling
        dict(global_pool="avg", class_token=False),  # fc_norm after pooling
        dict(global_pool="avg", class_token=False, fc_norm=False),
        dict(qkv_bias=False),
        dict(no_embed_class=True),
        dict(patch_size=4, img_size=(32, 16), in_chans=1, mlp_ratio=2.0),
    ],
    ids=["token", "avg_fc_norm", "avg_norm", "no_qkv_bias", "no_embed_class",
         "rect_gray"],
)
def test_timm_vit_converts_exactly(options):
    reference = _timm_vit(**options)
    model = VisionTransformer.from_timm(reference)
    height, width = reference.patch_embed.img_size
    images = np.random.RandomState(1).randn(
        2, height, width, reference.patch_embed.proj.in_channels
    ).astype("float32")
    assert _difference(reference, model, images) < ATOL


@pytest.mark.parametrize(
    "options, new_size",
    [({}, 48), ({}, 24), (dict(no_embed_class=True), (40, 56)),
     (dict(global_pool="avg", class_token=False), 48)],
    ids=["up", "down", "no_embed_class_rect", "no_class_token"],
)
def test_timm_vit_at_another_image_size(options, new_size):
    """`from_timm(..., image_size=N)` resamples the position embedding as
    timm does when it loads a checkpoint at another `img_size`: the same
    logits as timm's model built for that size with timm's resampled
    state dict."""
    from timm.layers import resample_abs_pos_embed

    reference = _timm_vit(**options)
    size = (new_size, new_size) if isinstance(new_size, int) else new_size
    resized = timm_vit.VisionTransformer(**{
        **dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
               num_classes=10), **options, "img_size": size,
    })
    state = reference.state_dict()
    prefix = 0 if reference.no_embed_class else reference.num_prefix_tokens
    state["pos_embed"] = resample_abs_pos_embed(
        state["pos_embed"], list(resized.patch_embed.grid_size),
        list(reference.patch_embed.grid_size), num_prefix_tokens=prefix,
    )
    resized.load_state_dict(state)
    resized.eval()
    model = VisionTransformer.from_timm(reference, image_size=size)
    images = np.random.RandomState(2).randn(2, *size, 3).astype("float32")
    assert _difference(resized, model, images) < ATOL
    hf = VisionTransformer.from_transformers(
        transformers.ViTForImageClassification(_hf_config()).eval(), image_size=48
    )
    assert hf(np.zeros((1, 48, 48, 3), "float32")).shape == (1, 10)


def test_swin_keeps_its_image_size():
    reference = timm.create_model(
        "swin_tiny_patch4_window7_224", pretrained=False, num_classes=5,
        img_size=32, window_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
    )
    with pytest.raises(ValueError, match="image_size"):
        VisionTransformer.from_timm(reference, image_size=64)


def test_hf_vit_for_image_classification_converts_exactly():
    reference = _randomize(
        transformers.ViTForImageClassification(_hf_config(qkv_bias=False))
    )
    model = VisionTransformer.from_transformers(reference)
    assert model.backbone.layer_norm_epsilon == 1e-12
    assert _difference(reference, model) < ATOL


def test_hf_vit_model_gets_a_new_head_on_the_same_features():
    reference = _randomize(transformers.ViTModel(_hf_config()))
    with pytest.raises(ValueError, match="num_classes"):
        VisionTransformer.from_transformers(reference)
    model = VisionTransformer.from_transformers(reference, num_classes=3)
    with torch.no_grad():
        hidden = reference(
            torch.from_numpy(IMAGES.transpose(0, 3, 1, 2))
        ).last_hidden_state[:, 0].numpy()
    features = keras.ops.convert_to_numpy(model.backbone(IMAGES))
    assert np.abs(hidden - features).max() < ATOL


def test_hf_folder_and_timm_files(tmp_path):
    reference = _randomize(transformers.ViTForImageClassification(_hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    model = VisionTransformer.from_transformers(str(tmp_path / "hf"))
    assert _difference(reference, model) < ATOL

    timm_reference = _timm_vit()
    state = {k: v.contiguous() for k, v in timm_reference.state_dict().items()}
    safetensors_torch.save_file(state, str(tmp_path / "vit.safetensors"))
    torch.save(state, str(tmp_path / "vit.pth"))
    config = dict(
        image_size=32, patch_size=8, hidden_dim=64, depth=2, num_heads=4,
        mlp_dim=256,
    )
    from_safetensors = VisionTransformer.from_timm(
        str(tmp_path / "vit.safetensors"), config=config
    )
    assert _difference(timm_reference, from_safetensors) < ATOL
    from_pth = VisionTransformer.from_timm(
        str(tmp_path / "vit.pth"), config=config
    )
    assert _difference(timm_reference, from_pth) < ATOL

    # bfloat16 files (NumPy has no bfloat16) are read as float32.
    half = {k: v.to(torch.bfloat16) for k, v in state.items()}
    safetensors_torch.save_file(half, str(tmp_path / "bf16.safetensors"))
    from_bf16 = VisionTransformer.from_timm(
        str(tmp_path / "bf16.safetensors"), config=config
    )
    rounded = _timm_vit()
    rounded.load_state_dict({k: v.float() for k, v in half.items()})
    assert _difference(rounded.eval(), from_bf16) < ATOL


def test_timm_file_with_model_name(tmp_path):
    reference = _randomize(
        timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=32,
            num_classes=5,
        )
    )
    path = str(tmp_path / "tiny.safetensors")
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in reference.state_dict().items()}, path
    )
    model = VisionTransformer.from_timm(
        path, model_name="vit_tiny_patch16_224", model_kwargs={"img_size": 32}
    )
    assert model.num_classes == 5
    assert _difference(reference, model) < ATOL
    # The checkpoint's own class count is accepted in `model_kwargs` too
    # (timm's create_model was given it twice: a TypeError); another count,
    # or an argument timm does not take, is a ValueError naming them.
    same = VisionTransformer.from_timm(
        path, model_name="vit_tiny_patch16_224",
        model_kwargs={"img_size": 32, "num_classes": 5},
    )
    assert _difference(reference, same) < ATOL
    for kwargs, match in (({"num_classes": 7}, "num_classes=7.*5 classes"),
                          ({"no_such_option": 1}, "model_kwargs.*no_such_option")):
        with pytest.raises(ValueError, match=match):
            VisionTransformer.from_timm(
                path, model_name="vit_tiny_patch16_224",
                model_kwargs={"img_size": 32, **kwargs},
            )


def test_timm_vit_without_projection_biases(tmp_path):
    """timm's `proj_bias=False` (no attention output or MLP biases): ours
    are zero, from the model and from a file with `config`."""
    reference = _timm_vit(proj_bias=False)
    assert _difference(reference, VisionTransformer.from_timm(reference)) < ATOL
    path = _timm_file(tmp_path, reference.state_dict())
    model = VisionTransformer.from_timm(path, config=CONFIG)
    assert _difference(reference, model) < ATOL


@pytest.mark.parametrize(
    "options",
    [
        dict(img_size=32, window_size=2, embed_dim=16, depths=(2, 2),
             num_heads=(2, 4)),
        dict(img_size=64, window_size=4, embed_dim=16, depths=(2, 2, 2),
             num_heads=(2, 2, 4)),
        # No query/key/value biases (ours load zeros); the mask computed at
        # run time (`strict_img_size=False`) is the same at this size.
        dict(img_size=32, window_size=2, embed_dim=16, depths=(2, 2),
             num_heads=(2, 4), qkv_bias=False, strict_img_size=False),
        # Rectangular, both sides above the window at every stage.
        dict(img_size=(64, 96), window_size=4, embed_dim=16, depths=(2, 2),
             num_heads=(2, 4)),
    ],
    ids=["two_stages", "three_stages", "no_qkv_bias_dynamic_mask", "rectangular"],
)
def test_timm_swin_converts_exactly(options):
    reference = _randomize(
        timm.create_model(
            "swin_tiny_patch4_window7_224", pretrained=False, num_classes=5,
            **options,
        )
    )
    model = VisionTransformer.from_timm(reference)
    assert model.backbone.attention == "local_window"
    size = options["img_size"]
    height, width = (size, size) if isinstance(size, int) else size
    images = np.random.RandomState(3).randn(2, height, width, 3).astype("float32")
    assert _difference(reference, model, images) < ATOL


def test_timm_swin_file_with_model_name(tmp_path):
    options = dict(img_size=32, window_size=2, embed_dim=16, depths=(2, 2),
                   num_heads=(2, 4))
    reference = _randomize(
        timm.create_model(
            "swin_tiny_patch4_window7_224", pretrained=False, num_classes=5,
            **options,
        )
    )
    path = str(tmp_path / "swin.safetensors")
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in reference.state_dict().items()}, path
    )
    model = VisionTransformer.from_timm(
        path, model_name="swin_tiny_patch4_window7_224", model_kwargs=options
    )
    images = np.random.RandomState(3).randn(2, 32, 32, 3).astype("float32")
    assert _difference(reference, model, images) < ATOL
    scores = model.attention_scores(images)  # (B, nW, H, T, T) per block
    assert len(scores) == 4 and scores[0].shape == (2, 16, 2, 4, 4)


# ------------------------------------------------------------- bad input


def test_other_architectures_and_options_are_refused():
    with pytest.raises(ValueError, match="VisionTransformer"):
        VisionTransformer.from_timm(torch.nn.Linear(2, 2))
    deit = timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, img_size=32
    )
    with pytest.raises(ValueError, match="VisionTransformerDistilled"):
        VisionTransformer.from_timm(deit)
    with pytest.raises(ValueError, match="init_values"):
        VisionTransformer.from_timm(_timm_vit(init_values=1e-5))
    with pytest.raises(ValueError, match="reg_tokens"):
        VisionTransformer.from_timm(_timm_vit(reg_tokens=2))
    with pytest.raises(ValueError, match="dynamic_img_pad"):
        VisionTransformer.from_timm(_timm_vit(dynamic_img_pad=True))
    with pytest.raises(ValueError, match="qk_norm|q_norm"):
        VisionTransformer.from_timm(_timm_vit(qk_norm=True))
    # timm drops the pixels past the last whole patch (was an error about
    # VisionTransformer's own `patch_size`).
    with pytest.raises(ValueError, match=r"timm model's option img_size=\(36, 50\)"):
        VisionTransformer.from_timm(_timm_vit(img_size=(36, 50)))
    swin = dict(img_size=32, window_size=2, embed_dim=16, depths=(2, 2),
                num_heads=(2, 4))
    with pytest.raises(ValueError, match="global_pool"):
        VisionTransformer.from_timm(
            timm.create_model(
                "swin_tiny_patch4_window7_224", global_pool="max", **swin
            )
        )
    # Grid 4 < window 8: the window given is named (timm's shrunk (4, 4)
    # was).
    with pytest.raises(ValueError, match=r"window_size=\(8, 8\).*4 x 4 patch grid"):
        VisionTransformer.from_timm(
            timm.create_model(
                "swin_tiny_patch4_window7_224", **{**swin, "window_size": 8}
            )
        )
    # A 4 x 8 grid (second stage) in 4 x 4 windows: timm shifts the
    # windows along the longer axis only; ours both or neither. It converted
    # silently, 0.02-0.16 off timm's logits with trained-like weights.
    with pytest.raises(ValueError, match=r"img_size=\(32, 64\).*one axis only"):
        VisionTransformer.from_timm(
            timm.create_model(
                "swin_tiny_patch4_window7_224",
                **{**swin, "img_size": (32, 64), "window_size": 4, "patch_size": 4},
            )
        )
    # A 6 x 6 grid (second stage) in 4 x 4 windows: timm attends to its
    # zero padding, LocalWindowAttention masks it.
    with pytest.raises(ValueError, match="not a multiple of the window"):
        VisionTransformer.from_timm(
            timm.create_model(
                "swin_tiny_patch4_window7_224",
                **{**swin, "img_size": 48, "window_size": 4},
            )
        )
    with pytest.raises(ValueError, match="always_partition"):
        VisionTransformer.from_timm(
            timm.create_model(
                "swin_tiny_patch4_window7_224",
                **{**swin, "always_partition": True},
            )
        )
    with pytest.raises(ValueError, match="hidden_act"):
        VisionTransformer.from_transformers(
            transformers.ViTForImageClassification(_hf_config(hidden_act="relu"))
        )
    with pytest.raises(ValueError, match="ViTForImageClassification"):
        VisionTransformer.from_transformers(
            transformers.BertModel(
                transformers.BertConfig(
                    hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, vocab_size=50,
                )
            )
        )


def _timm_file(tmp_path, state=None):
    state = state if state is not None else _timm_vit().state_dict()
    path = str(tmp_path / "vit.safetensors")
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in state.items()}, path
    )
    return path


CONFIG = dict(
    image_size=32, patch_size=8, hidden_dim=64, depth=2, num_heads=4,
    mlp_dim=256,
)


def test_truncated_file(tmp_path):
    path = _timm_file(tmp_path)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        VisionTransformer.from_timm(path, config=CONFIG)
    with pytest.raises(ValueError, match="model_name"):
        VisionTransformer.from_timm(_timm_file(tmp_path))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_config_json_is_named(tmp_path, text):
    reference = transformers.ViTForImageClassification(_hf_config())
    reference.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(text)
    with pytest.raises(ValueError, match="config.json"):
        VisionTransformer.from_transformers(str(tmp_path / "hf"))


def test_missing_extra_and_misshapen_tensors_name_them(tmp_path):
    state = _timm_vit().state_dict()
    del state["blocks.1.mlp.fc2.bias"]
    state["blocks.0.attn.extra"] = torch.zeros(3)
    with pytest.raises(ValueError) as info:
        VisionTransformer.from_timm(_timm_file(tmp_path, state), config=CONFIG)
    assert "missing tensor 'blocks.1.mlp.fc2.bias'" in str(info.value)
    assert "unexpected tensor 'blocks.0.attn.extra'" in str(info.value)
    # A config that disagrees with the tensors: the MLP size.
    with pytest.raises(ValueError, match="blocks.0.mlp.fc1.weight"):
        VisionTransformer.from_timm(
            _timm_file(tmp_path), config={**CONFIG, "mlp_dim": 128}
        )


def test_a_mismatch_assigns_no_weight(tmp_path, assigned_variables):
    """Every tensor is checked before any is assigned: with one misshapen
    tensor (the last one, the head's bias), no variable is written."""
    state = _timm_vit().state_dict()
    state["head.bias"] = torch.zeros(11)
    path = _timm_file(tmp_path, state)
    with pytest.raises(ValueError, match="head.bias"):
        VisionTransformer.from_timm(path, config=CONFIG)
    assert assigned_variables == []


# ------------------------------------------------- a converted model works


def test_converted_vit_fine_tunes_saves_loads_and_draws_rollout(tmp_path):
    reference = _timm_vit()
    model = VisionTransformer.from_timm(reference)
    tuned = model.with_head(3)
    tuned.backbone.trainable = False
    tuned.compile(optimizer="adam", jit_compile=False)
    before = _weights(tuned.backbone)
    tuned.fit(IMAGES, np.array([0, 2]), epochs=1, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(tuned.backbone)))

    path = str(tmp_path / "vit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert _difference(reference, loaded) < ATOL

    maps = attention_rollout(loaded, IMAGES)
    assert maps.shape == (2, 4, 4)
    assert np.all(np.isfinite(maps))

    again = VisionTransformer.from_timm(reference, num_classes=4, dropout=0.1)
    assert again.num_classes == 4
    again.compile(optimizer="adam", jit_compile=False)
    again.fit(IMAGES, np.array([0, 3]), epochs=1, verbose=0)


def test_convert_command(tmp_path, capsys):
    from keras_attention import cli

    reference = _randomize(transformers.ViTForImageClassification(_hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    out = str(tmp_path / "hf.keras")
    assert cli.main(["convert", str(tmp_path / "hf"), "--out", out]) == 0
    assert "Saved" in capsys.readouterr().out
    assert _difference(reference, keras.saving.load_model(out)) < ATOL

    timm_file = _timm_file(tmp_path)
    assert cli.main(["convert", timm_file, "--out", out]) == cli.EXIT_USAGE
    assert "--timm-model" in capsys.readouterr().err
    assert cli.main(
        ["convert", str(tmp_path / "missing"), "--out", out]
    ) == cli.EXIT_USAGE
    # A checkpoint of another shape than the named model: exit 1, named.
    code = cli.main(
        ["convert", timm_file, "--timm-model", "vit_tiny_patch16_224",
         "--out", out]
    )
    assert code == cli.EXIT_FAILED
    assert "does not match" in capsys.readouterr().err
    # ... which --timm-kwargs sizes like the checkpoint: exact.
    sizes = ('{"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, '
             '"num_heads": 4}')
    code = cli.main(
        ["convert", timm_file, "--timm-model", "vit_tiny_patch16_224",
         "--timm-kwargs", sizes, "--out", out]
    )
    assert code == 0, capsys.readouterr().err
    reference = _timm_vit()
    reference.load_state_dict(safetensors_torch.load_file(timm_file))
    assert _difference(reference.eval(), keras.saving.load_model(out)) < ATOL
    for bad in ("{img_size: 32}", "[32]"):
        code = cli.main(
            ["convert", timm_file, "--timm-model", "vit_tiny_patch16_224",
             "--timm-kwargs", bad, "--out", out]
        )
        assert code == cli.EXIT_USAGE
        assert "--timm-kwargs: expected a JSON object" in capsys.readouterr().err


def test_lora_on_a_converted_vit():
    from keras_attention.layers import enable_lora

    reference = _timm_vit()
    model = VisionTransformer.from_timm(reference, num_classes=3)
    before = keras.ops.convert_to_numpy(model(IMAGES))
    assert enable_lora(model.backbone, rank=2)
    after = keras.ops.convert_to_numpy(model(IMAGES))
    np.testing.assert_allclose(after, before, atol=1e-6)
    model.compile(optimizer="adam", jit_compile=False)
    model.fit(IMAGES, np.array([0, 2]), epochs=1, verbose=0)


def test_options_round_trip_and_attention_swap(tmp_path):
    """The new architecture options survive `.keras`; the attention's
    implementation can change while the projection weights stay."""
    reference = _timm_vit(global_pool="avg", class_token=False)
    model = VisionTransformer.from_timm(reference)
    assert model.backbone.final_norm == "pooled"
    path = str(tmp_path / "gap.keras")
    model.save(path)
    assert _difference(reference, keras.saving.load_model(path)) < ATOL

    reference = _timm_vit(no_embed_class=True)
    blocked = VisionTransformer.from_timm(
        reference, attention_kwargs={"implementation": "blocked"}
    )
    assert not blocked.backbone.embed_class_token
    assert _difference(reference, blocked) < ATOL


@pytest.mark.large
def test_full_size_vit_base_and_swin_tiny():
    # The packages' own initialisation (trained-like scales); images scaled
    # like normalized photographs.
    reference = timm.create_model("vit_base_patch16_224", pretrained=False)
    reference.eval()
    model = VisionTransformer.from_timm(reference)
    images = np.random.RandomState(2).randn(2, 224, 224, 3).astype("float32")
    assert _difference(reference, model, images) < ATOL

    swin = timm.create_model(
        "swin_tiny_patch4_window7_224", pretrained=False
    ).eval()
    assert _difference(swin, VisionTransformer.from_timm(swin), images) < ATOL

    hf = transformers.ViTForImageClassification(
        transformers.ViTConfig(num_labels=1000)
    ).eval()
    model = VisionTransformer.from_transformers(hf)
    assert _difference(hf, model, images) < ATOL
