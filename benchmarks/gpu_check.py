"""One short check on a GPU: XLA-compiled training and attention timings.

Runs on Keras's JAX backend (XLA is JAX's only compiler, so every step here
is XLA-compiled), for GPU machines that have JAX with CUDA but no
TensorFlow. Prints, and writes to `$OUT/gpu_check.json` when `OUT` is set:

1. the machine line (`benchmarks/machine.py`) and the devices;
2. our `MultiHeadAttention` against `keras.layers.MultiHeadAttention` with
   the same weights on the GPU (largest difference);
3. `VisionTransformer` on scikit-learn digits (16x16): a few epochs of
   `fit(jit_compile=True)`, test accuracy and steps/s; `DETR` on generated
   canvases: a few epochs, loss before and after;
4. self-attention forward+backward time (batch 8, 8 heads, head size 64,
   lengths 512 and 2048; batch 1 at 16,384), float32 and bfloat16: ours
   versus `keras.layers.MultiHeadAttention` (both jitted) and PyTorch's
   `scaled_dot_product_attention` when torch sees a GPU.

    KERAS_BACKEND=jax python benchmarks/gpu_check.py
"""

import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import describe  # noqa: E402
from keras_attention import datasets  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402

RESULTS = {}
# GPU_CHECK_QUICK=1: tiny sizes, to try the script on a CPU first.
QUICK = os.environ.get("GPU_CHECK_QUICK") == "1"


def report(key, value):
    RESULTS[key] = value
    print(f"{key}: {value}", flush=True)


def peer_equality():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 64, 128)).astype("float32")
    ours = MultiHeadAttention(8, 16)
    peer = keras.layers.MultiHeadAttention(8, 16)
    ours(x, x)
    peer(x, x)
    peer.set_weights(ours.get_weights())
    diff = np.max(np.abs(np.asarray(ours(x, x)) - np.asarray(peer(x, x))))
    report("mha_vs_keras_max_abs_diff", float(diff))


def train_vit():
    from keras_attention.applications import VisionTransformer

    (x, y), (xt, yt) = datasets.load_digits_images(seed=0, image_size=16)
    keras.utils.set_random_seed(0)
    model = VisionTransformer.from_preset("vit_digits", load_weights=False)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), jit_compile=True)
    start = time.time()
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    first = time.time() - start
    start = time.time()
    epochs = 1 if QUICK else 20
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    steps = epochs * -(-len(x) // 64)
    accuracy = model.evaluate(xt, yt, verbose=0)[1]
    report("vit_first_epoch_s_incl_compile", round(first, 2))
    report("vit_steps_per_s", round(steps / (time.time() - start), 1))
    report(f"vit_test_accuracy_{epochs + 1}_epochs", round(float(accuracy), 4))


def train_detr():
    from keras_attention.applications import DETR

    data = datasets.make_detection_set(64 if QUICK else 512, seed=0, digit_split="train")
    keras.utils.set_random_seed(0)
    model = DETR.from_preset("detr_digits", load_weights=False)
    model.compile(optimizer=keras.optimizers.AdamW(5e-4), jit_compile=True)
    history = model.fit(
        data.images, {"boxes": data.boxes, "labels": data.labels},
        epochs=2 if QUICK else 5, batch_size=32, verbose=0,
    )
    losses = [round(float(v), 3) for v in history.history["loss"]]
    report("detr_losses_5_epochs", losses)


def attention_step(layer, x):
    """A jitted forward+backward of `sum(layer(x, x))` on JAX."""
    trainable = [v.value for v in layer.trainable_variables]
    fixed = [v.value for v in layer.non_trainable_variables]

    def loss(trainable, x):
        out, _ = layer.stateless_call(trainable, fixed, x, x)
        return keras.ops.sum(keras.ops.cast(out, "float32"))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return lambda: jax.block_until_ready(grad(trainable, x))


def best_of(fn, repeats=5):
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def torch_step(batch, length, dtype):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    # JAX computes float32 products in TF32 on such a GPU by default
    # (`jax_default_matmul_precision` unset); torch's default is full
    # float32 ("highest"): give torch the same TF32 products.
    torch.set_float32_matmul_precision("high")
    report("float32_matmul_precision", {
        "jax": jax.config.jax_default_matmul_precision or "default (TF32 on GPU)",
        "torch": torch.get_float32_matmul_precision(),
    })
    tdtype = torch.float32 if dtype == "float32" else torch.bfloat16
    q, k, v = (
        torch.randn(batch, 8, length, 64, device="cuda", dtype=tdtype,
                    requires_grad=True)
        for _ in range(3)
    )

    def step():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out.float().sum().backward()
        torch.cuda.synchronize()

    return step


def attention_table():
    rows = []
    sizes = ((2, 64),) if QUICK else ((8, 512), (8, 2048), (1, 16384))
    for batch, length in sizes:
        for dtype in ("float32", "bfloat16"):
            x = jax.numpy.asarray(
                np.random.default_rng(0).normal(size=(batch, length, 512)),
                dtype=dtype,
            )
            row = {"batch": batch, "length": length, "dtype": dtype}
            for name, cls in (
                ("ours", MultiHeadAttention),
                ("keras", keras.layers.MultiHeadAttention),
            ):
                layer = cls(8, 64, dtype=dtype)
                layer(x[:1, :8], x[:1, :8])
                try:
                    row[f"{name}_ms"] = round(
                        1e3 * best_of(attention_step(layer, x)), 2
                    )
                except Exception as error:  # e.g. out of memory
                    row[f"{name}_ms"] = f"failed: {type(error).__name__}"
            step = torch_step(batch, length, dtype)
            if step is not None:
                row["torch_sdpa_core_ms"] = round(1e3 * best_of(step), 2)
            if isinstance(row.get("ours_ms"), float) and isinstance(
                row.get("keras_ms"), float
            ):
                row["keras_over_ours"] = round(row["keras_ms"] / row["ours_ms"], 2)
            print(row, flush=True)
            rows.append(row)
    RESULTS["attention"] = rows


def main():
    report("machine", describe())
    report("devices", [str(d) for d in jax.devices()])
    report("versions", {"jax": jax.__version__, "keras": keras.__version__})
    for check in (peer_equality, train_vit, train_detr, attention_table):
        start = time.time()
        try:
            check()
        except Exception as error:
            report(f"{check.__name__}_failed", f"{type(error).__name__}: {error}"[:800])
        print(f"[{check.__name__}: {time.time() - start:.1f} s]", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_check.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
