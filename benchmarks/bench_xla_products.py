"""Which products of the dense attention core XLA's CPU backend runs slowly.

Times each product of the dense core's forward + backward alone, compiled
by `tf.function` (oneDNN kernels) and by XLA (`jit_compile=True`), on
`(8, 8, T, T)` weights and `(8, 8, T, 64)` heads; then `dV = P^T dO` as
the single einsum against `ops/dispatch.py::_keys_product`'s loop over
(batch, head) pairs at several lengths; then the whole dense core, forward
+ backward, under XLA with and without that loop. Figures are CPU time
(milliseconds summed over threads, best of `--repeats`), which a busy
machine distorts less than wall time. BENCHMARKS.md, "Speed per machine".

    python benchmarks/bench_xla_products.py
    python benchmarks/bench_xla_products.py --length 1024 --repeats 3
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402


def cpu_ms(fn, repeats):
    """Best CPU time of `fn()` (its outputs copied to NumPy), after a
    first call that compiles it."""
    import tensorflow as tf

    def run():
        out = fn()
        for x in tf.nest.flatten(out):
            x.numpy()

    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return 1000 * best


def both_modes(fn, repeats):
    import tensorflow as tf

    return [
        cpu_ms(tf.function(fn, jit_compile=jit), repeats) for jit in (False, True)
    ]


def products(length, repeats):
    import numpy as np
    import tensorflow as tf
    from keras import ops

    rng = np.random.default_rng(0)

    def heads():
        return tf.constant(rng.random((8, 8, length, 64)).astype("float32"))

    q, k, v, d_out = heads(), heads(), heads(), heads()
    p = tf.constant(rng.random((8, 8, length, length)).astype("float32"))
    d_s = tf.constant(rng.random((8, 8, length, length)).astype("float32"))
    cases = {
        "S = Q K^T": lambda: ops.einsum("bhtd,bhsd->bhts", q, k),
        "O = P V": lambda: ops.matmul(p, v),
        "dV = P^T dO": lambda: ops.einsum("bhts,bhtd->bhsd", p, d_out),
        "dP = dO V^T": lambda: ops.einsum("bhtd,bhsd->bhts", d_out, v),
        "dQ = dS K": lambda: ops.matmul(d_s, k),
        "dK = dS^T Q": lambda: ops.einsum("bhts,bhtd->bhsd", d_s, q),
        "dV^T = dO^T P (no transpose back)": lambda: ops.einsum(
            "bhtd,bhts->bhds", d_out, p
        ),
        "dV = (dO^T P)^T": lambda: ops.swapaxes(
            ops.einsum("bhtd,bhts->bhds", d_out, p), -1, -2
        ),
        "dV = (materialised P^T) dO": lambda: ops.matmul(
            ops.swapaxes(p, -1, -2), d_out
        ),
    }
    print(f"\n## Products alone, T = {length} (CPU-ms)\n")
    print("| product | tf.function | XLA |")
    print("| --- | ---: | ---: |")
    for name, fn in cases.items():
        graph, xla = both_modes(fn, repeats)
        print(f"| {name} | {graph:.0f} | {xla:.0f} |", flush=True)


def with_loop(flag):
    """`autotune.xla_on_cpu` forced to `flag` and the loop's size floor
    lowered to 1, so the choice is the argument's."""
    from keras_attention.ops import autotune
    from keras_attention.ops import dispatch

    autotune.xla_on_cpu = lambda: flag
    dispatch._LOOPED_PRODUCT_SIZE = 1


def loop_sizes(lengths, repeats):
    import numpy as np
    import tensorflow as tf

    from keras_attention.ops import autotune
    from keras_attention.ops import dispatch

    original = autotune.xla_on_cpu, dispatch._LOOPED_PRODUCT_SIZE
    print("\n## dV = P^T dO under XLA: one einsum against the loop (CPU-ms)\n")
    print("| (batch, head) pairs | T = S | einsum | loop | einsum / loop |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(0)
    for pairs, length in [(256, 65)] + [(64, t) for t in lengths]:
        p = tf.constant(rng.random((pairs // 8, 8, length, length)), "float32")
        x = tf.constant(rng.random((pairs // 8, 8, length, 64)), "float32")
        row = []
        for flag in (False, True):
            with_loop(flag)
            # Traced now, under the forced choice.
            step = tf.function(
                lambda: dispatch._keys_product(p, x), jit_compile=True
            )
            row.append(cpu_ms(step, repeats))
        print(f"| {pairs} | {length} | {row[0]:.1f} | {row[1]:.1f} | "
              f"{row[0] / row[1]:.2f} |", flush=True)
    autotune.xla_on_cpu, dispatch._LOOPED_PRODUCT_SIZE = original


def core(length, repeats):
    import numpy as np
    import tensorflow as tf

    from keras_attention.ops import autotune
    from keras_attention.ops import dispatch
    from keras_attention.ops import dot_product_attention

    original = autotune.xla_on_cpu, dispatch._LOOPED_PRODUCT_SIZE
    rng = np.random.default_rng(0)
    q, k, v = [
        tf.constant(rng.standard_normal((8, length, 8, 64)).astype("float32"))
        for _ in range(3)
    ]
    print(f"\n## Dense core forward + backward, T = {length} (CPU-ms)\n")
    print("| mode | dV, dK | CPU-ms |")
    print("| --- | --- | ---: |")
    for jit, flag in ((False, False), (True, False), (True, True)):
        with_loop(flag)

        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = dot_product_attention(q, k, v, implementation="dense")
                loss = tf.reduce_sum(out * out)
            return tape.gradient(loss, [q, k, v])

        compiled = tf.function(step, jit_compile=jit)
        best = cpu_ms(lambda: compiled(q, k, v), repeats)
        mode = "XLA" if jit else "tf.function"
        how = "loop" if flag else "einsum"
        print(f"| {mode} | {how} | {best:.0f} |", flush=True)
    autotune.xla_on_cpu, dispatch._LOOPED_PRODUCT_SIZE = original


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--loop-lengths", type=int, nargs="+",
                        default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    print("#", describe())
    products(args.length, args.repeats)
    loop_sizes(args.loop_lengths, args.repeats)
    core(args.length, args.repeats)
    print("\n# at the end:", describe())


if __name__ == "__main__":
    main()
