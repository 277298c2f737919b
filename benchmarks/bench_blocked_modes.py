"""The blocked attention core in each TensorFlow mode, and its block sizes.

Forward + backward of the memory-efficient blocked core (batch 1, 8 heads
of 64 by default), best wall time of `--repeats` calls after a first that
traces and compiles:

- `graph`: in a plain `tf.function`, the graph executor running the block
  loop (the library's path before it compiled the core itself);
- `compiled`: in a plain `tf.function` with the core's forward and
  backward passes as their own XLA computations (what
  `implementation="auto"` / `"blocked"` runs there now on a CPU);
- `xla`: the whole step under `jit_compile=True`;

then the chunked core (`ops/dense.py`: query chunks against all keys, in
the graph executor, and under XLA with the `xla` core mode; `--chunks`
rows each, `--kept` of the chunks keeping their weights for the backward
pass); then `MultiHeadAttention`
(projections and weight gradients included) in a plain `tf.function` with
the graph core, the compiled core, the dense path, the chunked path and
`implementation="auto"` (its measured choice printed); then,
with `--block-sizes`, the core under XLA for each key x query block size.
BENCHMARKS.md, "AVX2 only".

    python benchmarks/bench_blocked_modes.py --lengths 4096
    python benchmarks/bench_blocked_modes.py --lengths 4096 8192 --skip-layer
    python benchmarks/bench_blocked_modes.py --lengths 16384 --skip-layer \
        --core-modes --repeats 1 --block-sizes 256x256 256x1024
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


def best_seconds(step, args, repeats):
    step(*args)  # traces and compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for x in step(*args):
            x.numpy()
        times.append(time.perf_counter() - start)
    return min(times)


def core_step(compiled, jit, block_size=None, query_block_size=None, chunked=False,
              keep=None):
    import tensorflow as tf

    from keras_attention.ops.blocked import DEFAULT_BLOCK_SIZE
    from keras_attention.ops.blocked import DEFAULT_QUERY_BLOCK_SIZE
    from keras_attention.ops.blocked import blocked_heads
    from keras_attention.ops.dense import chunked_heads

    @tf.function(jit_compile=jit)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            if chunked:
                # Query chunks against all keys: `query_block_size` rows
                # (default: the library's `dense.chunk_rows`).
                out = chunked_heads(
                    q, k, v, None, False, q.shape[-1] ** -0.5,
                    chunk=query_block_size, keep=keep,
                )
            else:
                out = blocked_heads(
                    q, k, v, None, False, q.shape[-1] ** -0.5,
                    block_size or DEFAULT_BLOCK_SIZE,
                    query_block_size or DEFAULT_QUERY_BLOCK_SIZE,
                    compiled=compiled,
                )
            loss = tf.reduce_sum(out * out)
        return tape.gradient(loss, [q, k, v])

    return step


def layer_step(layer, compiled):
    import tensorflow as tf

    from keras_attention.ops import xla_cpu

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(layer(x, x)))
        return tape.gradient(loss, [x] + layer.trainable_variables)

    def run(x):
        original = xla_cpu.compiles_blocked_core
        if not compiled:
            xla_cpu.compiles_blocked_core = lambda *inputs: False
        try:
            return step(x)
        finally:
            xla_cpu.compiles_blocked_core = original

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--core-modes", nargs="*", default=["graph", "compiled", "xla"],
                        choices=["graph", "compiled", "xla"])
    parser.add_argument("--skip-layer", action="store_true")
    parser.add_argument("--chunks", type=int, nargs="*", default=[0],
                        help="query rows per chunk of the chunked core, in "
                        "the graph executor (0: the library's default)")
    parser.add_argument("--kept", type=int, nargs="*", default=[-1],
                        help="how many chunks keep their weights for the "
                        "backward pass (-1: the library's default, within "
                        "the memory budget; 0: all recomputed)")
    parser.add_argument("--block-sizes", nargs="*", default=[],
                        help="key x query block sizes for the XLA sweep, e.g. 256x256")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from keras_attention import ops as attention_ops
    from keras_attention.layers import MultiHeadAttention

    print("#", " ".join(["benchmarks/bench_blocked_modes.py"] + sys.argv[1:]))
    print("#", describe())
    print(f"# batch 1, {args.heads} heads of {args.head_dim}, forward + backward, "
          f"best of {args.repeats}, seconds")
    rng = np.random.default_rng(0)
    h, d = args.heads, args.head_dim
    for length in args.lengths:
        q, k, v = (tf.constant(rng.standard_normal((1, length, h, d)), "float32")
                   for _ in range(3))
        for name, compiled, jit in (("graph", False, False),
                                    ("compiled", True, False),
                                    ("xla", False, True)):
            if name not in args.core_modes:
                continue
            seconds = best_seconds(core_step(compiled, jit), (q, k, v), args.repeats)
            print(f"| {length} | core | {name} | {seconds:.2f} |", flush=True)
        for rows, keep in [(r, n) for r in args.chunks for n in args.kept]:
            # In the graph executor; under XLA too when `xla` is a core mode.
            for jit in (False, True)[: 1 + ("xla" in args.core_modes)]:
                seconds = best_seconds(
                    core_step(False, jit, query_block_size=rows or None, chunked=True,
                              keep=None if keep < 0 else keep),
                    (q, k, v), args.repeats,
                )
                kept = "default" if keep < 0 else keep
                print(f"| {length} | core | chunked, {rows or 'default'} rows, "
                      f"{kept} kept, {'xla' if jit else 'graph'} | {seconds:.2f} |",
                      flush=True)
        if not args.skip_layer:
            x = tf.constant(rng.standard_normal((1, length, h * d)), "float32")
            for name, implementation, compiled in (
                ("graph blocked core", "blocked", False),
                ("compiled blocked core", "blocked", True),
                ("dense", "dense", False),
                ("chunked", "chunked", False),
                ("auto (the measured choice)", "auto", True),
            ):
                layer = MultiHeadAttention(h, d, implementation=implementation)
                layer(x[:, :8], x[:, :8])
                seconds = best_seconds(layer_step(layer, compiled), (x,), args.repeats)
                print(f"| {length} | layer, tf.function | {name} | {seconds:.2f} |",
                      flush=True)
            for choice in attention_ops.dispatch_choices():
                if choice.reason.startswith("measured") and length in choice.key:
                    print(f"# measured choice: {choice.implementation} "
                          f"({choice.reason}) for {choice.key}", flush=True)
        for sizes in args.block_sizes:
            key_block, query_block = (int(n) for n in sizes.split("x"))
            seconds = best_seconds(core_step(False, True, key_block, query_block),
                                   (q, k, v), args.repeats)
            print(f"| {length} | core, XLA | blocks {key_block} x {query_block} "
                  f"| {seconds:.2f} |", flush=True)
    print("# load average at the end:", describe().rsplit("load average ", 1)[1])


if __name__ == "__main__":
    main()
