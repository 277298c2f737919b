"""The dense core on Keras's JAX backend (XLA on a CPU): pair by pair
against whole `(B, H, T, S)` tensors.

On a CPU, JAX compiles everything with XLA, so the dense core takes the
forms of `ops/xla_cpu.py` there as under TensorFlow's `jit_compile=True`.
This times `dot_product_attention(implementation="dense")`, forward +
backward (`jax.jit(jax.grad(...))`), batch 8, 8 heads of 64, with the
forward and the backward pair by pair (`xla_cpu._forward_in_pairs`,
`xla_cpu._backward_in_pairs`, taken above 1,024 x 1,024 scores a pair),
with the backward alone pair by pair (whole scores), and with both
switched off (whole `dP` and `dS`, the `dV`/`dK` products in
`keys_product`'s loop); best wall ms of
`--repeats`, timed round-robin after one call each; then the blocked
path, and `implementation="auto"`, which on JAX measures the dense and
blocked paths while it is traced (its trace's seconds, and what it
took). BENCHMARKS.md, "Intel Xeon with AMX", "The backward pair by
pair".

    python benchmarks/bench_jax_core.py
    python benchmarks/bench_jax_core.py --lengths 1024 2048 4096
    python benchmarks/bench_jax_core.py --lengths 2048 --forward
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402


def gradient_fn(implementation="dense", forward=False):
    """The core's gradient (`forward`: its output's sum alone), jitted
    (traced at its `lower`)."""
    import jax

    from keras_attention import ops as attention_ops

    def loss(q, k, v):
        out = attention_ops.dot_product_attention(
            q, k, v, implementation=implementation)
        return (out * out).sum()

    return jax.jit(loss if forward else jax.grad(loss, argnums=(0, 1, 2)))


def timed(length, repeats, forward=False):
    import jax
    import numpy as np

    from keras_attention.ops import xla_cpu

    rng = np.random.default_rng(0)
    q, k, v = (jax.numpy.asarray(rng.standard_normal((8, length, 8, 64)),
                                 "float32") for _ in range(3))
    compiled = {}
    for name, forward_pairs, backward_pairs in (
        ("pair by pair", True, True),
        ("backward pair by pair", False, True),
        ("whole tensors", False, False),
    ):
        rules = xla_cpu._forward_in_pairs_taken, xla_cpu._backward_in_pairs_taken
        # Read while the function is traced.
        if not forward_pairs:
            xla_cpu._forward_in_pairs_taken = lambda q, k: False
        if not backward_pairs:
            xla_cpu._backward_in_pairs_taken = lambda e: False
        try:
            compiled[name] = gradient_fn(forward=forward).lower(q, k, v).compile()
        finally:
            xla_cpu._forward_in_pairs_taken, xla_cpu._backward_in_pairs_taken = rules
        jax.block_until_ready(compiled[name](q, k, v))
    # `implementation="auto"`: long enough, it measures the dense and the
    # blocked paths while it is traced, and keeps the faster.
    start = time.perf_counter()
    compiled["auto"] = gradient_fn("auto", forward).lower(q, k, v).compile()
    first = time.perf_counter() - start
    jax.block_until_ready(compiled["auto"](q, k, v))
    compiled["blocked"] = gradient_fn("blocked", forward).lower(q, k, v).compile()
    jax.block_until_ready(compiled["blocked"](q, k, v))
    best = dict.fromkeys(compiled, float("inf"))
    for _ in range(repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            best[name] = min(best[name], 1000 * (time.perf_counter() - start))
    return best, first


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forward", action="store_true",
                        help="the forward pass alone (no gradient, as in inference)")
    args = parser.parse_args(argv)
    import jax

    print(f"# {describe()}; JAX device {jax.default_backend()}")
    what = "forward" if args.forward else "forward + backward"
    print(f"# dense core {what}, batch 8, 8 heads of 64, float32, "
          f"best wall ms of {args.repeats}")
    print("\n| T = S | dense, pair by pair | dense, backward pair by pair "
          "| dense, whole tensors | whole / pair by pair | blocked | auto "
          "| auto's trace s (measuring) | what auto took |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    from keras_attention.ops import autotune

    for length in args.lengths:
        autotune.clear_dispatch_choices()
        ms, first = timed(length, args.repeats, args.forward)
        pairs, whole = ms["pair by pair"], ms["whole tensors"]
        took = "; ".join(f"{c.implementation} ({c.reason})"
                         for c in autotune.dispatch_choices() if c.key[0] == "jax")
        print(f"| {length} | {pairs:.1f} | {ms['backward pair by pair']:.1f} | "
              f"{whole:.1f} | {whole / pairs:.2f} | "
              f"{ms['blocked']:.1f} | {ms['auto']:.1f} | {first:.1f} | "
              f"{took or 'dense (not long enough to measure)'} |", flush=True)
    print(f"\n# at the end: {describe()}")


if __name__ == "__main__":
    main()
