"""Where the time of attention's forward + backward goes: a profile.

Runs the attention core (and optionally the whole layer) forward + backward
under XLA in TensorFlow's profiler, reads the trace (`xplane.pb`) and adds
up the time of each compiled operation, grouped into kinds:

- `matmul`: XLA `dot` operations and oneDNN matmul calls;
- `fusion (elementwise/reduce)`: XLA's fused loops (exp, subtract, divide,
  max/sum reductions, casts);
- `copy/transpose`: layout changes (XLA's `transpose_copy_fusion`s);
- `other`.

For PyTorch's `scaled_dot_product_attention` (when torch is installed) it
prints `torch.profiler`'s table of the same call, so the two can be set
side by side: which share of the time is matrix multiplication at what
rate, and which share is the elementwise passes over the `(B, H, T, S)`
score tensors that torch's fused CPU kernel never writes to memory.

    python benchmarks/profile_attention.py --length 512
    python benchmarks/profile_attention.py --length 512 --what core layer keras
    python benchmarks/profile_attention.py --length 2048 --mode graph \
        --what core keras-core layer keras
    python benchmarks/profile_attention.py --length 2048 --what layer --threads 1
"""

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402

from keras_attention import ops as attention_ops  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402


def kind_of(name):
    lower = name.lower()
    if re.search(r"\bdot\b|dot[._]|matmul|einsum|gemm|onednn|mkl|custom-call|convolution", lower):
        return "matmul"
    if "copy" in lower or "transpose" in lower:
        return "copy/transpose"
    if "fusion" in lower or any(
        w in lower for w in ("exponential", "reduce", "divide", "multiply",
                             "subtract", "add", "select", "maximum", "convert")
    ):
        return "fusion (elementwise/reduce)"
    return "other"


def profile_tf(fn, calls, logdir):
    fn()  # compile outside the trace
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    wall = (time.perf_counter() - start) / calls
    tf.profiler.experimental.stop()
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    totals = collections.Counter()
    counts = collections.Counter()
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                totals[name] += event.duration_ps / 1e9  # ms
                counts[name] += 1
    return wall, totals, counts


def leaf_ops(totals):
    """The compiled operations: XLA instruction names like `fusion.3`,
    `MatMul_1.2` or `Einsum.2` (a `dot` keeps the TensorFlow op's name),
    `copy.4`."""
    pattern = re.compile(
        r"fusion|\bdot|matmul|einsum|copy|transpose|custom-call|reduce|convolution",
        re.IGNORECASE,
    )
    skip = ("tf_", "Tf", "Executor", "ThreadPool", "Session", "Iterator",
            "FunctionRun", "EagerExecute", "__inference", "XlaLaunch",
            "XlaCompile", "XlaRun", "Thunk", "ProfileRun")
    return {
        n: t for n, t in totals.items()
        if pattern.search(n) and not any(n.startswith(s) for s in skip)
    }


def graph_leaf_ops(totals):
    """The kernels of a `tf.function` graph: events `name:OpType`
    (`_Mkl...` for oneDNN's)."""
    return {
        n: t for n, t in totals.items()
        if re.fullmatch(r"[^\s:]+:_?[A-Z][A-Za-z0-9]+", n)
        and not n.split(":")[1].startswith(("Const", "Identity", "NoOp",
                                            "PartitionedCall", "_Arg", "_Retval"))
    }


def graph_kind(name):
    op = name.split(":")[1].lower()
    if "matmul" in op or "einsum" in op:
        return "matmul"
    if "transpose" in op:
        return "copy/transpose"
    if "softmax" in op:
        return "softmax (fused)"
    return "elementwise/reduce"


def report(title, wall, totals, counts, calls, top, graph=False):
    ops_ = graph_leaf_ops(totals) if graph else leaf_ops(totals)
    kind_of_ = graph_kind if graph else kind_of
    by_kind = collections.Counter()
    for name, t in ops_.items():
        by_kind[kind_of_(name)] += t / calls
    busy = sum(by_kind.values())
    print(f"\n## {title}: {wall * 1000:.1f} ms per call (wall), "
          f"{busy:.1f} ms of compiled operations per call (summed over threads)")
    print("| kind | ms per call | share |\n| --- | --- | --- |")
    for kind, t in by_kind.most_common():
        print(f"| {kind} | {t:.1f} | {t / max(busy, 1e-9):.0%} |")
    print(f"\nTop {top} operations:\n| operation | kind | ms per call | calls |\n| --- | --- | --- | --- |")
    for name, t in sorted(ops_.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| `{name[:60]}` | {kind_of_(name)} | {t / calls:.1f} | "
              f"{counts[name] / calls:g} |")
    if not ops_:
        print("(no compiled-operation events in the trace; the 20 longest events:)")
        for name, t in totals.most_common(20):
            print(f"  {name[:80]}: {t / calls:.1f} ms")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--mode", choices=["xla", "graph"], default="xla",
                        help="compile with XLA (default) or run the tf.function "
                             "graph (oneDNN kernels)")
    parser.add_argument("--what", nargs="*", default=["core", "keras-core", "torch"],
                        choices=["core", "keras-core", "layer", "keras", "torch"])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: cores on bfloat16 inputs, layers under "
                             "the mixed_bfloat16 policy")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow's intra-op threads; 1 gives each "
                             "operation's own work, which neither the other "
                             "thread nor a shared machine blurs")
    args = parser.parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    b, l, h, d = args.batch, args.length, args.heads, args.head_size
    jit = args.mode == "xla"
    mode = "XLA" if jit else "tf.function"
    print(f"# {describe()}")
    threads = args.threads or "default"
    print(f"batch {b}, length {l}, {h} heads of {d}, {mode}, threads {threads}, "
          f"{args.dtype}")
    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    rng = np.random.default_rng(0)
    q, k, v = (tf.cast(rng.normal(size=(b, l, h, d)).astype("float32"), args.dtype)
               for _ in range(3))
    x = tf.constant(rng.normal(size=(b, l, h * d)).astype("float32"))

    def core(attend):
        @tf.function(jit_compile=jit)
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                loss = tf.reduce_mean(attend(q, k, v) ** 2)
            grads = tape.gradient(loss, [q, k, v])
            return loss + sum(tf.reduce_sum(g[:1, :1]) for g in grads)

        return lambda: float(step(q, k, v))

    def layer(make):
        layer_ = make()
        call = (lambda t: layer_(t, t)) if isinstance(
            layer_, keras.layers.MultiHeadAttention) else layer_
        call(x)

        @tf.function(jit_compile=jit)
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_mean(call(x) ** 2)
            grads = tape.gradient(loss, [x] + layer_.trainable_weights)
            return loss + sum(tf.reduce_sum(tf.reshape(g, [-1])[:1]) for g in grads)

        return lambda: float(step(x))

    cases = {
        "core": (f"ours: keras_attention.ops.dot_product_attention, {mode}",
                 lambda: core(attention_ops.dot_product_attention)),
        "keras-core": (f"keras.ops.dot_product_attention, {mode}",
                       lambda: core(keras.ops.dot_product_attention)),
        "layer": (f"ours: MultiHeadAttention layer, {mode}",
                  lambda: layer(lambda: MultiHeadAttention(h, d))),
        "keras": (f"keras.layers.MultiHeadAttention, {mode}",
                  lambda: layer(lambda: keras.layers.MultiHeadAttention(h, d))),
    }
    flops = 3 * 2 * 2 * b * h * l * l * d
    for what in args.what:
        if what == "torch":
            continue
        title, make = cases[what]
        with tempfile.TemporaryDirectory() as logdir:
            wall, totals, counts = profile_tf(make(), args.calls, logdir)
        report(title, wall, totals, counts, args.calls, args.top, graph=not jit)
        if what in ("core", "keras-core"):
            print(f"\nnominal core matmul work {flops / 1e9:.1f} GFLOP per call")
    if "torch" in args.what:
        try:
            import torch
        except ImportError:
            print("\n(torch not installed: no SDPA profile)")
            return
        torch.set_num_threads(os.cpu_count())
        tq, tk, tv = (torch.tensor(t.numpy()).transpose(1, 2).contiguous()
                      .requires_grad_() for t in (q, k, v))

        def run():
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
            (out ** 2).mean().backward()

        run()
        start = time.perf_counter()
        with torch.profiler.profile() as prof:
            for _ in range(args.calls):
                run()
        wall = (time.perf_counter() - start) / args.calls
        print(f"\n## torch scaled_dot_product_attention (eager): "
              f"{wall * 1000:.1f} ms per call (wall, profiled)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
