"""The dense core on Keras's JAX backend (XLA on a CPU): its backward pair
by pair against whole `(B, H, T, S)` tensors.

On a CPU, JAX compiles everything with XLA, so the dense core takes the
forms of `ops/xla_cpu.py` there as under TensorFlow's `jit_compile=True`.
This times `dot_product_attention(implementation="dense")`, forward +
backward (`jax.jit(jax.grad(...))`), batch 8, 8 heads of 64, with the
backward pair by pair (`xla_cpu._backward_in_pairs`, taken above 1,024 x
1,024 scores a pair) and with it switched off (whole `dP` and `dS`, the
`dV`/`dK` products in `keys_product`'s loop); best wall ms of
`--repeats`, the two timed round-robin after one call each. BENCHMARKS.md,
"Intel Xeon with AMX", "The backward pair by pair".

    python benchmarks/bench_jax_core.py
    python benchmarks/bench_jax_core.py --lengths 1024 2048 4096
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402


def gradient_fn():
    """The core's gradient, jitted (traced at its `lower`)."""
    import jax

    from keras_attention import ops as attention_ops

    def loss(q, k, v):
        out = attention_ops.dot_product_attention(q, k, v, implementation="dense")
        return (out * out).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def timed(length, repeats):
    import jax
    import numpy as np

    from keras_attention.ops import xla_cpu

    rng = np.random.default_rng(0)
    q, k, v = (jax.numpy.asarray(rng.standard_normal((8, length, 8, 64)),
                                 "float32") for _ in range(3))
    compiled = {}
    for name, pair_by_pair in (("pair by pair", True), ("whole tensors", False)):
        rule = xla_cpu._backward_in_pairs_taken
        if not pair_by_pair:  # read while the function is traced
            xla_cpu._backward_in_pairs_taken = lambda e: False
        try:
            compiled[name] = gradient_fn().lower(q, k, v).compile()
        finally:
            xla_cpu._backward_in_pairs_taken = rule
        jax.block_until_ready(compiled[name](q, k, v))
    best = dict.fromkeys(compiled, float("inf"))
    for _ in range(repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            best[name] = min(best[name], 1000 * (time.perf_counter() - start))
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import jax

    print(f"# {describe()}; JAX device {jax.default_backend()}")
    print("# dense core forward + backward, batch 8, 8 heads of 64, float32, "
          f"best wall ms of {args.repeats}")
    print("\n| T = S | pair by pair | whole tensors | whole / pair by pair |")
    print("| ---: | ---: | ---: | ---: |")
    for length in args.lengths:
        ms = timed(length, args.repeats)
        pairs, whole = ms["pair by pair"], ms["whole tensors"]
        print(f"| {length} | {pairs:.1f} | {whole:.1f} | {whole / pairs:.2f} |",
              flush=True)
    print(f"\n# at the end: {describe()}")


if __name__ == "__main__":
    main()
