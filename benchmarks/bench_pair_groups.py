"""The dense core in a TensorFlow graph: all (batch, head) pairs at once
against groups of pairs side by side (`autotune.pair_group`).

Times our `dot_product_attention`'s dense core, forward + backward, in a
`tf.function` (no XLA), with its `(B, H, T, S)` work done for all pairs at
once and in groups of 1, 2, 4 and 8 pairs (each group independent work,
which TensorFlow's graph executor runs side by side on its inter-op
threads); then the same with one inter-op thread, where the groups run
one after the other. Batch 8 (`--batch`), 8 heads of 64, wall ms, median
of `--repeats` after a first call, whose own time (tracing, the graph's
first run and its memory) is printed in a second table. With
`--autotune`, last, the library's own choice: the first call with
`autotune.pair_group` measuring, and what it kept. BENCHMARKS.md, "Pairs
side by side".

    python benchmarks/bench_pair_groups.py
    python benchmarks/bench_pair_groups.py --lengths 2048 --inter-op 1
    python benchmarks/bench_pair_groups.py --batch 64 --lengths 1024 --autotune
    python benchmarks/bench_pair_groups.py --dtype bfloat16 --lengths 1024 2048
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402

GROUPS = (0, 1, 2, 4, 8)  # 0: all pairs at once


def timed(batch, length, pairs, repeats, dtype="float32"):
    """`(first call s, median later ms)`; `pairs` `None`: the library's
    choice, measured at the first call."""
    import numpy as np
    import tensorflow as tf

    from keras_attention import ops as attention_ops
    from keras_attention.ops import autotune

    rng = np.random.default_rng(0)
    q, k, v = (tf.cast(rng.normal(size=(batch, length, 8, 64)), dtype)
               for _ in range(3))
    original = autotune.pair_group
    if pairs is not None:
        autotune.pair_group = lambda *args: pairs  # read when traced

    @tf.function
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attention_ops.dot_product_attention(
                q, k, v, implementation="dense"
            )
            out = tf.cast(out, "float32")
            loss = tf.reduce_mean(out * out)
        grads = [tf.cast(g, "float32") for g in tape.gradient(loss, [q, k, v])]
        return loss + tf.add_n([tf.reduce_sum(g * g) for g in grads])

    start = time.perf_counter()
    try:
        float(step(q, k, v))
    finally:
        autotune.pair_group = original
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        float(step(q, k, v))
        times.append(time.perf_counter() - start)
    return first, 1000 * float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--autotune", action="store_true",
                        help="also time the library's own choice, measured "
                        "at its first call")
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "bfloat16"],
                        help="the heads' dtype (bfloat16 heads keep bfloat16 "
                        "scores: half the bytes a pair)")
    parser.add_argument("--inter-op", type=int, default=0,
                        help="TensorFlow's inter-op threads (0: its default)")
    args = parser.parse_args(argv)
    import tensorflow as tf

    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    print(f"# {describe()}")
    print(f"# inter-op threads: {args.inter_op or 'default'}; batch {args.batch}, 8 heads "
          f"of 64, {args.dtype}, forward + backward, tf.function, median of "
          f"{args.repeats}")
    itemsize = 2 if args.dtype == "bfloat16" else 4
    head = " | ".join("all pairs" if g == 0 else f"{g} a group" for g in GROUPS)
    print(f"\n| T = S | MB of scores a pair | {head} | all / best group |")
    print("| ---: | ---: |" + " ---: |" * (len(GROUPS) + 1))
    firsts = {}
    for length in args.lengths:
        runs = [timed(args.batch, length, g, args.repeats, args.dtype)
                for g in GROUPS]
        ms = [m for _, m in runs]
        firsts[length] = [f for f, _ in runs]
        print(f"| {length} | {itemsize * length * length / 2**20:.0f} | "
              + " | ".join(f"{m:.1f}" for m in ms)
              + f" | {ms[0] / min(ms[1:]):.2f} |", flush=True)
    print(f"\n| T = S | first call s: {head} |")
    print("| ---: |" + " ---: |" * len(GROUPS))
    for length, seconds in firsts.items():
        print(f"| {length} | " + " | ".join(f"{f:.1f}" for f in seconds) + " |")
    if args.autotune:
        from keras_attention.ops import autotune

        print("\n| T = S | the library's choice | first call s (measuring) "
              "| later ms |")
        print("| ---: | --- | ---: | ---: |")
        for length in args.lengths:
            autotune.clear_dispatch_choices()
            first, ms = timed(args.batch, length, None, args.repeats, args.dtype)
            kept = [c for c in autotune.dispatch_choices()
                    if c.key[0] == "pair groups"]
            text = "; ".join(f"{c.implementation} ({c.reason})" for c in kept)
            print(f"| {length} | {text or 'all pairs (not measured)'} | "
                  f"{first:.1f} | {ms:.1f} |", flush=True)
    print(f"\n# at the end: {describe()}")


if __name__ == "__main__":
    main()
