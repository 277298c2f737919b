"""Which products of the dense attention core XLA's CPU backend runs slowly.

Times each product of the dense core's forward + backward alone, compiled
by `tf.function` (oneDNN kernels) and by XLA (`jit_compile=True`), on
`(8, 8, T, T)` weights and `(8, 8, T, 64)` heads (`--what projections`:
the 2-D products of the layer's projections alike); then `dV = P^T dO` as
the single einsum against `ops/xla_cpu.py::keys_product`'s loop over
(batch, head) pairs at several lengths; then the whole dense core, forward
+ backward, and the whole `MultiHeadAttention` layer (with keras's layer),
under XLA with each fast form of `ops/xla_cpu.py` added in turn (the loop,
the unnormalised weights, the flat projections, the scores' einsum, four
pairs a loop step, the backward pair by pair). Figures are CPU time
(milliseconds summed over threads, best of `--repeats`), which a busy
machine distorts less than wall time, and for the core and the layer also
the best wall time (round-robin); `--threads 1` measures the work itself.
BENCHMARKS.md, "Speed per machine".

    python benchmarks/bench_xla_products.py
    python benchmarks/bench_xla_products.py --length 1024 --repeats 3
    python benchmarks/bench_xla_products.py --what core layer --threads 1
    python benchmarks/bench_xla_products.py --what projections --length 512
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
    p_t = tf.constant(rng.random((8, 8, length, length)).astype("float32"))
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
        # The scores kept transposed, `(B, H, S, T)` (`K Q^T` is the same
        # product as `Q K^T`): the keys' products take them on the left,
        # and the forward's `O` and `dQ` move to the right.
        "P^T kept: dV = P^T dO (and dK)": lambda: ops.matmul(p_t, d_out),
        "P^T kept: O^T = V^T P^T (and dQ^T)": lambda: ops.einsum(
            "bhsd,bhst->bhdt", v, p_t
        ),
        "P^T kept: O = (P^T)^T V": lambda: ops.einsum(
            "bhst,bhsd->bhtd", p_t, v
        ),
    }
    print(f"\n## Products alone, T = {length} (CPU-ms)\n")
    print("| product | tf.function | XLA |")
    print("| --- | ---: | ---: |")
    for name, fn in cases.items():
        graph, xla = both_modes(fn, repeats)
        print(f"| {name} | {graph:.0f} | {xla:.0f} |", flush=True)


def projections(length, repeats):
    """The 2-D products of one `MultiHeadAttention` projection (batch 8,
    width 512, 8 heads of 64): forward, weight gradient, input gradient;
    the layer has four projections, so twelve such products, two thirds
    of its arithmetic at 512 tokens."""
    import numpy as np
    import tensorflow as tf
    from keras import ops

    rng = np.random.default_rng(0)
    x, d_y = (tf.constant(rng.random((8 * length, 512)).astype("float32"))
              for _ in range(2))
    w = tf.constant(rng.random((512, 512)).astype("float32"))
    cases = {
        "y = x W": lambda: ops.matmul(x, w),
        "dW = x^T dY": lambda: ops.matmul(ops.transpose(x), d_y),
        "dx = dY W^T": lambda: ops.matmul(d_y, ops.transpose(w)),
    }
    print(f"\n## A projection's products, ({8 * length}, 512) x (512, 512) "
          "(CPU-ms)\n")
    print("| product | tf.function | XLA | XLA / tf.function |")
    print("| --- | ---: | ---: | ---: |")
    for name, fn in cases.items():
        graph, xla = both_modes(fn, repeats)
        print(f"| {name} | {graph:.1f} | {xla:.1f} | {xla / graph:.2f} |",
              flush=True)


def with_loop(flag):
    """`autotune.xla_on_cpu` forced to `flag` and the loop's size floor
    lowered to 1, so the choice is the argument's."""
    from keras_attention.ops import autotune
    from keras_attention.ops import xla_cpu

    autotune.xla_on_cpu = lambda: flag
    xla_cpu._LOOPED_PRODUCT_SIZE = 1


def loop_sizes(lengths, repeats):
    import numpy as np
    import tensorflow as tf

    from keras_attention.ops import autotune
    from keras_attention.ops import xla_cpu

    original = autotune.xla_on_cpu, xla_cpu._LOOPED_PRODUCT_SIZE
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
                lambda: xla_cpu.keys_product(p, x), jit_compile=True
            )
            row.append(cpu_ms(step, repeats))
        print(f"| {pairs} | {length} | {row[0]:.1f} | {row[1]:.1f} | "
              f"{row[0] / row[1]:.2f} |", flush=True)
    autotune.xla_on_cpu, xla_cpu._LOOPED_PRODUCT_SIZE = original


class forced:
    """The fast forms of `ops/xla_cpu.py` switched on or off while a
    function is traced (they are read at trace time): `loop` for
    `keys_product` at any size, `unnormalised` for the dense core, `flat`
    for the projections, `layouts` for `scores_product`'s einsum (off:
    keras's einsum), `grouped` for the loop's several pairs a step (off:
    one), `in_pairs` for the unnormalised core's backward pair by pair
    (off: whole tensors and `keys_product`)."""

    def __init__(self, loop, unnormalised, flat, layouts=True, grouped=True,
                 in_pairs=True):
        self.flags = loop, unnormalised, flat, layouts, grouped, in_pairs

    def __enter__(self):
        from keras_attention.ops import xla_cpu

        self.saved = (xla_cpu._LOOPED_PRODUCT_SIZE, xla_cpu.takes_unnormalised,
                      xla_cpu._can_flatten, xla_cpu.scores_product,
                      xla_cpu._PAIRS_PER_STEP, xla_cpu._backward_in_pairs_taken)
        loop, unnormalised, flat, layouts, grouped, in_pairs = self.flags
        xla_cpu._LOOPED_PRODUCT_SIZE = 1 if loop else 2**62
        if not unnormalised:
            xla_cpu.takes_unnormalised = lambda *args: False
        if not flat:
            xla_cpu._can_flatten = lambda *args: False
        if not layouts:
            from keras import ops

            xla_cpu.scores_product = lambda a, b: ops.einsum(
                "bhtd,bhsd->bhts", a, b
            )
        if not grouped:
            xla_cpu._PAIRS_PER_STEP = 1
        if not in_pairs:
            xla_cpu._backward_in_pairs_taken = lambda *args: False

    def __exit__(self, *exc):
        from keras_attention.ops import xla_cpu

        (xla_cpu._LOOPED_PRODUCT_SIZE, xla_cpu.takes_unnormalised,
         xla_cpu._can_flatten, xla_cpu.scores_product,
         xla_cpu._PAIRS_PER_STEP, xla_cpu._backward_in_pairs_taken) = self.saved


def interleaved_ms(fns, repeats):
    """`{name: (best CPU-ms, best wall-ms, system ms, page faults)}`, the
    functions timed round-robin after one call each (tracing and
    compilation); the last two are those of the call with the best wall
    time (the kernel's share of the CPU time, and the minor page faults:
    temporary buffers that are fresh memory on every call)."""
    import resource

    import tensorflow as tf

    def run(fn):
        for x in tf.nest.flatten(fn()):
            x.numpy()

    for fn in fns.values():
        run(fn)
    best = {name: [float("inf")] * 4 for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            before = resource.getrusage(resource.RUSAGE_SELF)
            cpu, wall = time.process_time(), time.perf_counter()
            run(fn)
            wall = 1000 * (time.perf_counter() - wall)
            best[name][0] = min(best[name][0], 1000 * (time.process_time() - cpu))
            if wall < best[name][1]:
                after = resource.getrusage(resource.RUSAGE_SELF)
                best[name][1:] = [wall, 1000 * (after.ru_stime - before.ru_stime),
                                  after.ru_minflt - before.ru_minflt]
    return best


# (label, jit, loop, unnormalised, flat[, layouts[, grouped[, in_pairs]]])
CORE_ROWS = [
    ("tf.function", False, False, False, False),
    ("XLA, einsum dV/dK", True, False, False, False, False, False, False),
    ("XLA, loop dV/dK", True, True, False, False, False, False, False),
    ("XLA, loop + unnormalised weights", True, True, True, False, False, False,
     False),
    ("XLA, + scores' einsum", True, True, True, False, True, False, False),
    ("XLA, + 4 pairs a step", True, True, True, False, True, True, False),
    ("XLA, + backward pair by pair (now)", True, True, True, False),
]
LAYER_ROWS = [
    ("ours, tf.function", False, False, False, False),
    ("ours, XLA, loop dV/dK", True, True, False, False, False, False, False),
    ("ours, XLA, + unnormalised weights", True, True, True, False, False, False,
     False),
    ("ours, XLA, + flat projections", True, True, True, True, False, False, False),
    ("ours, XLA, + scores' einsum", True, True, True, True, True, False, False),
    ("ours, XLA, + 4 pairs a step", True, True, True, True, True, True, False),
    ("ours, XLA, + backward pair by pair (now)", True, True, True, True),
]


def core(length, repeats):
    import numpy as np
    import tensorflow as tf

    from keras_attention.ops import dot_product_attention

    rng = np.random.default_rng(0)
    q, k, v = [
        tf.constant(rng.standard_normal((8, length, 8, 64)).astype("float32"))
        for _ in range(3)
    ]

    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = dot_product_attention(q, k, v, implementation="dense")
            loss = tf.reduce_sum(out * out)
        return tape.gradient(loss, [q, k, v])

    fns = {}
    for label, jit, *flags in CORE_ROWS:
        compiled = tf.function(step, jit_compile=jit)
        with forced(*flags):
            compiled.get_concrete_function(q, k, v)  # traced under the flags
        fns[label] = lambda c=compiled: c(q, k, v)
    best = interleaved_ms(fns, repeats)
    print(f"\n## Dense core forward + backward, T = {length}\n")
    print("| mode | CPU-ms | wall ms |")
    print("| --- | ---: | ---: |")
    for label, (cpu, wall, _, _) in best.items():
        print(f"| {label} | {cpu:.0f} | {wall:.0f} |", flush=True)


def layer(length, repeats):
    """The whole `MultiHeadAttention` layer (8 heads of 64, batch 8),
    forward + backward with every weight's gradient, against keras's."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_attention.layers import MultiHeadAttention

    x = tf.constant(np.random.default_rng(0).standard_normal((8, length, 512)),
                    "float32")

    def stepper(layer, jit):
        layer(x, x)

        @tf.function(jit_compile=jit)
        def step(inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                loss = tf.reduce_mean(tf.square(layer(inputs, inputs)))
            grads = tape.gradient(loss, [inputs] + layer.trainable_variables)
            return tf.add_n([tf.reduce_sum(g) for g in grads])

        return step

    fns = {}
    for label, jit, *flags in LAYER_ROWS:
        step = stepper(MultiHeadAttention(8, 64), jit)
        with forced(*flags):
            step.get_concrete_function(x)
        fns[label] = lambda s=step: s(x)
    for jit in (False, True):
        step = stepper(keras.layers.MultiHeadAttention(8, 64), jit)
        fns["keras, " + ("XLA" if jit else "tf.function")] = lambda s=step: s(x)
    best = interleaved_ms(fns, repeats)
    keras_best = min(wall for name, (_, wall, _, _) in best.items()
                     if name.startswith("keras"))
    print(f"\n## MultiHeadAttention forward + backward, T = {length}\n")
    print("| layer, mode | CPU-ms | wall ms | keras's best wall / this "
          "| system ms (best call) | page faults (best call) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, (cpu, wall, system, faults) in best.items():
        print(f"| {label} | {cpu:.0f} | {wall:.0f} | {keras_best / wall:.2f} "
              f"| {system:.0f} | {faults} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--loop-lengths", type=int, nargs="+",
                        default=[256, 512, 1024, 2048])
    parser.add_argument("--layer-lengths", type=int, nargs="+",
                        default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--what", nargs="+",
                        choices=["products", "projections", "loop", "core",
                                 "layer"],
                        default=["products", "loop", "core", "layer"])
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow's intra-op threads (1: the work "
                        "itself, which a shared machine distorts least)")
    args = parser.parse_args()
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    print("#", describe(), f"; threads {args.threads or 'default'}")
    if "products" in args.what:
        products(args.length, args.repeats)
    if "projections" in args.what:
        projections(args.length, args.repeats)
    if "loop" in args.what:
        loop_sizes(args.loop_lengths, args.repeats)
    if "core" in args.what:
        core(args.length, args.repeats)
    if "layer" in args.what:
        for length in args.layer_lengths:
            layer(length, args.repeats)
    print("\n# at the end:", describe())


if __name__ == "__main__":
    main()
