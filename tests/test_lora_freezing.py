"""`enable_lora` on a model with frozen layers: the same weights train on
every backend, and the `.keras` file freezes what its user froze (CI runs
this on TensorFlow, and through `tests/test_backends.py` on JAX and torch;
a wholly frozen backbone: `tests/test_lora_quantization.py`)."""

import keras
import numpy as np

from keras_attention.applications.vision_transformer import VisionTransformer

TINY_VIT = dict(
    image_size=8, patch_size=4, num_classes=3, hidden_dim=8, depth=2,
    num_heads=2, mlp_dim=8, num_channels=1,
)


def frozen_layers(backbone):
    return [layer.name for layer in backbone.layers if not layer.trainable and layer.weights]


def test_enable_lora_keeps_the_layers_its_user_froze_frozen(tmp_path):
    # On JAX and torch `enable_lora` unfroze them (`model.trainable = True`
    # reset every sublayer there): block_0's factors trained, and the
    # loaded file froze nothing; on TensorFlow they stayed frozen.
    keras.utils.set_random_seed(0)
    model = VisionTransformer(**TINY_VIT)
    model.backbone.get_layer("block_0").trainable = False  # the user's
    model.backbone.enable_lora(rank=2)
    trained = sorted(v.path for v in model.backbone.trainable_weights)
    assert trained == [  # LoRA's targets keep their bias trainable
        f"block_1/attention/{name}/{weight}"
        for name in ("query", "value")
        for weight in ("bias", "lora_kernel_a", "lora_kernel_b")
    ]
    x = np.random.default_rng(0).random((4, 8, 8, 1)).astype("float32")
    path = str(tmp_path / "lora.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert frozen_layers(loaded.backbone) == ["block_0"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)),
                               keras.ops.convert_to_numpy(model(x)), atol=1e-5)
    loaded.backbone.enable_lora(rank=2)  # LoRA again, on the merged kernels
