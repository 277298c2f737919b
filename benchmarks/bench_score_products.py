"""The dense core's `(B, H, T, S)` products alone: TensorFlow against torch.

Times the three kinds of batched product the dense attention core is made
of, at one shape (batch 8, 8 heads of 64, length 2,048 by default), in
TensorFlow (`tf.function`, oneDNN where TensorFlow turns it on) and in
torch (`torch.bmm`, eager), each the best of `--repeats` calls:

- `Q K^T`: a `(T, D) x (D, S)` product per head, whose `(T, S)` output is
  written to memory;
- `P V`: `(T, S) x (S, D)`, reading the `(T, S)` weights;
- `P^T dO`: `(S, T) x (T, D)`, the backward's `dV` (and `dK`), reading
  the weights transposed;

and a 2-D `(L, L)` float32 matmul, the machine's peak. A fused attention
kernel (torch's SDPA on a CPU) never writes the `(T, S)` tensors, so
comparing these rates with the whole cores' (`bench_attention.py`) tells
whether a peer's lead comes from its products or from the fusion.
BENCHMARKS.md, "Intel Xeon with AMX".

    python benchmarks/bench_score_products.py
    python benchmarks/bench_score_products.py --length 512 --repeats 10
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras_attention  # noqa: E402,F401  (before TensorFlow: triton)
from machine import describe  # noqa: E402


def best_ms(fn, repeats):
    fn()  # traces, and allocates once
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return 1000.0 * best


def tensorflow_products(b, h, t, d, length, repeats):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    q, k = (tf.constant(rng.standard_normal((b, h, t, d)), "float32") for _ in range(2))
    p = tf.constant(rng.random((b, h, t, t)), "float32")
    a = tf.constant(rng.standard_normal((length, length)), "float32")

    def timed(product):
        # A slice of the result leaves the process: the product runs whole.
        fn = tf.function(lambda: tf.reduce_sum(product()[..., :1]))
        return best_ms(lambda: fn().numpy(), repeats)

    return {
        "Q K^T": timed(lambda: tf.matmul(q, k, transpose_b=True)),
        "P V": timed(lambda: tf.matmul(p, k)),
        "P^T dO": timed(lambda: tf.matmul(p, q, transpose_a=True)),
        "2-D matmul": timed(lambda: tf.matmul(a, a)),
    }


def torch_products(b, h, t, d, length, repeats):
    import torch

    torch.set_num_threads(os.cpu_count())
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b * h, t, d, generator=generator) for _ in range(2))
    p = torch.rand(b * h, t, t, generator=generator)
    a = torch.randn(length, length, generator=generator)
    with torch.no_grad():
        return {
            "Q K^T": best_ms(lambda: torch.bmm(q, k.transpose(1, 2)), repeats),
            "P V": best_ms(lambda: torch.bmm(p, k), repeats),
            "P^T dO": best_ms(lambda: torch.bmm(p.transpose(1, 2), q), repeats),
            "2-D matmul": best_ms(lambda: a @ a, repeats),
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}")
    print(f"# {describe()}")
    b, h, t, d = args.batch, args.heads, args.length, args.head_dim
    flops = {name: 2.0 * b * h * t * t * d for name in ("Q K^T", "P V", "P^T dO")}
    flops["2-D matmul"] = 2.0 * t ** 3
    results = {
        "TensorFlow": tensorflow_products(b, h, t, d, t, args.repeats),
        "torch": torch_products(b, h, t, d, t, args.repeats),
    }
    print(f"# B={b}, H={h}, T=S={t}, D={d}, float32; best of {args.repeats}; "
          f"2-D matmul {t} x {t}")
    print("| product | TensorFlow ms | GFLOP/s | torch ms | GFLOP/s | TF / torch speed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, work in flops.items():
        tf_ms, torch_ms = results["TensorFlow"][name], results["torch"][name]
        print(f"| {name} | {tf_ms:.1f} | {work / tf_ms / 1e6:.0f} | {torch_ms:.1f} | "
              f"{work / torch_ms / 1e6:.0f} | {torch_ms / tf_ms:.2f}x |")
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
