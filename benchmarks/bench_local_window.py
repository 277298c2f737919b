"""Swin window attention against global attention: training-step throughput.

On the same feature maps `(B, size, size, C)`, one forward and backward pass
(gradients of a mean-square loss with respect to the input and every
weight) of

- `LocalWindowAttention(num_heads, window_size, shift_size)`: attention
  inside `window x window` windows (cost linear in the number of pixels);
- `MultiHeadAttention(num_heads, key_dim=C // num_heads)` over all
  `size * size` pixels as one sequence (cost quadratic in the pixels; long
  sequences take the memory-efficient blocked core).

Both run compiled (`tf.function(jit_compile=True)`); the table gives the
median step time, images per second and the ratio global / window.

    python benchmarks/bench_local_window.py
    python benchmarks/bench_local_window.py --sizes 32 64 --channels 96 \
        --heads 3 --window 7 --shift 3 --batch 4 --repeats 3
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# This checkout's package, whichever one is installed (an installed copy
# elsewhere would be measured otherwise).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_attention.layers import LocalWindowAttention  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


def train_step(layer, flatten):
    """A compiled forward + backward pass of `layer` on an image batch."""

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            inputs = x
            if flatten:  # (B, size, size, C) -> (B, size * size, C)
                inputs = tf.reshape(x, (tf.shape(x)[0], -1, x.shape[-1]))
            loss = tf.reduce_mean(tf.square(layer(inputs)))
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        # The bias table's gradient comes from a gather: make it dense.
        return loss, [tf.convert_to_tensor(g) for g in grads]

    return step


def time_step(step, x, repeats):
    tf.nest.map_structure(lambda t: t.numpy(), step(x))  # trace + compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), step(x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--channels", type=int, default=96)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--shift", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    devices = [d.device_type for d in tf.config.list_logical_devices()]
    print(f"# {describe()}", flush=True)
    print(
        f"devices {sorted(set(devices))}; B={args.batch}, C={args.channels}, "
        f"heads={args.heads}, window={args.window}, shift={args.shift}, "
        f"forward+backward, median of {args.repeats}"
    )
    header = (
        f"{'size':>7} {'tokens':>6} {'window ms':>10} {'global ms':>10} "
        f"{'window img/s':>12} {'global img/s':>12} {'global/window':>13} "
        f"{'scores ratio':>12}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    for size in args.sizes:
        x = tf.constant(
            rng.normal(size=(args.batch, size, size, args.channels)), "float32"
        )
        local = LocalWindowAttention(
            num_heads=args.heads,
            window_size=args.window,
            shift_size=args.shift,
        )
        full = MultiHeadAttention(
            num_heads=args.heads, key_dim=args.channels // args.heads
        )
        local.build(x.shape)
        full.build((args.batch, size * size, args.channels))
        local_s = time_step(train_step(local, False), x, args.repeats)
        full_s = time_step(train_step(full, True), x, args.repeats)
        # Attention scores per image: windows of the padded map vs all pairs.
        window = min(args.window, size)
        padded = -(-size // window) * window
        local_scores = (padded // window) ** 2 * window**4
        full_scores = (size * size) ** 2
        print(
            f"{size:>3}x{size:<3} {size * size:>6} {local_s * 1e3:>10.1f} "
            f"{full_s * 1e3:>10.1f} {args.batch / local_s:>12.1f} "
            f"{args.batch / full_s:>12.1f} {full_s / local_s:>12.2f}x "
            f"{full_scores / local_scores:>11.1f}x"
        )


if __name__ == "__main__":
    main()
