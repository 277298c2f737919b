"""Sharded attention on `keras.distribution` against one device (JAX backend).

Run by `tests/test_sharding.py` in a subprocess, because the backend and the
number of virtual devices are fixed before JAX initialises:

    KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python tests/sharding_check.py OUT.json [CASE ...]

For each case (a Sequential around each sequence layer of the registry,
grouped-query heads, the non-local block, local windows, a tiny ViT) the same initial weights run a forward
pass and one SGD step on one device, under `DataParallel` over the 8
devices and under `ModelParallel` on a `(2, 4)` mesh ("data", "model")
with `keras_attention.distribution.layout_map`. OUT.json gets the largest
differences from one device and the shardings of every projection kernel.
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras_attention  # noqa: E402
from keras_attention import distribution as attention_distribution  # noqa: E402

BATCH = 8


def sequence_model(name, **kwargs):
    def build():
        return keras.Sequential(
            [
                keras.Input((6, 16)),
                keras_attention.registry.get(name, **kwargs),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(3),
            ]
        )

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 6, 16)).astype("float32")
    return build, x


def feature_map_model(name, **kwargs):
    def build():
        return keras.Sequential(
            [
                keras.Input((4, 4, 16)),
                keras_attention.registry.get(name, **kwargs),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(3),
            ]
        )

    rng = np.random.default_rng(2)
    return build, rng.normal(size=(BATCH, 4, 4, 16)).astype("float32")


def vit():
    def build():
        return keras_attention.applications.VisionTransformer(
            image_size=8, patch_size=4, num_classes=3, hidden_dim=16, depth=1,
            num_heads=4, mlp_dim=32, num_channels=1,
        )

    rng = np.random.default_rng(1)
    return build, rng.random((BATCH, 8, 8, 1)).astype("float32")


CASES = {
    "multi_head": lambda: sequence_model("multi_head", num_heads=4, key_dim=4),
    "multi_head_grouped": lambda: sequence_model(
        "multi_head", num_heads=4, key_dim=4, num_key_value_heads=2
    ),
    "additive": lambda: sequence_model("additive", units=8),
    "scaled_dot_product": lambda: sequence_model("scaled_dot_product"),
    "non_local": lambda: feature_map_model("non_local"),
    "local_window": lambda: feature_map_model(
        "local_window", num_heads=4, window_size=2
    ),
    "vit": vit,
}


def run(build, x, y, initial, distribution):
    """`(outputs, loss, final weights, model)` of a forward pass and one step."""
    keras.utils.set_random_seed(0)
    if distribution is None:
        model = build()
    else:
        with distribution.scope():
            model = build()
    if initial is not None:
        model.set_weights(initial)
    outputs = keras.ops.convert_to_numpy(model(x, training=False))
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    loss = float(model.train_on_batch(x, y, return_dict=True)["loss"])
    return outputs, loss, model.get_weights(), model


def spec_of(variable):
    sharding = getattr(variable.value, "sharding", None)
    spec = getattr(sharding, "spec", None)
    return [None if s is None else str(s) for s in spec] if spec is not None else None


def main(out_path, names):
    devices = keras.distribution.list_devices()
    assert len(devices) == 8, devices
    data_parallel = keras.distribution.DataParallel(devices=devices)
    mesh = keras.distribution.DeviceMesh((2, 4), ["data", "model"], devices)
    results = {}
    for name in names:
        build, x = CASES[name]()
        y = (np.arange(BATCH) % 3).astype("int32")
        template = build()
        initial = template.get_weights()
        single_out, single_loss, single_weights, _ = run(build, x, y, initial, None)
        layouts = attention_distribution.layout_map(template, mesh)
        model_parallel = keras.distribution.ModelParallel(
            layout_map=layouts, batch_dim_name="data"
        )
        result = dict(
            keys=sorted(layouts.keys()),
            moved=max(
                float(np.abs(a - b).max()) for a, b in zip(single_weights, initial)
            ) if initial else 0.0,
        )
        for label, distribution in (
            ("data_parallel", data_parallel),
            ("model_parallel", model_parallel),
        ):
            out, loss, weights, model = run(build, x, y, initial, distribution)
            result[label] = dict(
                output_error=float(np.abs(out - single_out).max()),
                loss_error=abs(loss - single_loss),
                weight_error=max(
                    (float(np.abs(a - b).max()) for a, b in zip(weights, single_weights)),
                    default=0.0,
                ),
                kernels={
                    variable.path: spec_of(variable)
                    for _, variable, _, _ in attention_distribution.projection_kernels(
                        model
                    )
                },
            )
        results[name] = result
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(CASES))
