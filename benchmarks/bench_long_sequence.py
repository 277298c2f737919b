"""Long sequences: peak memory and time of forward + backward attention.

Self-attention at lengths 4,096 to 32,768 (batch 1, 8 heads, head size 64),
forward + backward (gradients of `mean(out ** 2)` with respect to the inputs
and every weight). Each case runs in its own subprocess, so that its peak
resident memory (`ru_maxrss`) is its own:

- `ours`: `keras_attention.layers.MultiHeadAttention` (`implementation=
  "auto"`: long sequences take the blocked online-softmax core or the
  chunked dense core, whichever it measured faster; the choice and its
  reason are printed), `tf.function`, and `ours-xla` compiled with
  `jit_compile=True`;
- `ours-core`: `keras_attention.ops.dot_product_attention` alone on
  projected heads, `jit_compile=True`;
- `keras`: `keras.layers.MultiHeadAttention` (`tf.function`; it holds the
  `(B, H, L, L)` scores, so by default only up to `--keras-max` = 8,192);
- `torch-sdpa`: `torch.nn.functional.scaled_dot_product_attention` on
  projected heads (the bare core); `torch-mha`: `torch.nn.MultiheadAttention`;
- `torch-layer` / `torch-layer-compiled`: the same whole layer as ours in
  plain torch — query/key/value/output projections with biases, SDPA, the
  gradients of the input and of every weight — eager and under
  `torch.compile`. The like-for-like peer of `ours`: the ratio column
  `x torch layer` divides the best of the two by our time.

Columns: the first call (tracing and compilation included), the median of
`--repeats` more calls (none at lengths above `--repeat-max`: the first
call is then the time), the CPU time of that call, the peak resident memory
of the whole process and the same minus the resident memory just before
the first call (inputs, weights and the framework already loaded).

    python benchmarks/bench_long_sequence.py
    python benchmarks/bench_long_sequence.py --lengths 16384 --impls ours-xla torch-sdpa
    python benchmarks/bench_long_sequence.py --lengths 16384 \
        --impls ours ours-xla torch-layer torch-layer-compiled
    python benchmarks/bench_long_sequence.py --lengths 16384 --causal \
        --impls ours torch-layer torch-layer-compiled

`--causal`: causal self-attention on every side (our layer's
`use_causal_mask`, SDPA's `is_causal`). `--unknown-length`: `ours` and
`keras` traced with the length unknown (`input_signature` `(1, None,
dim)`, as `model.fit` traces `padded_batch` data): `auto` then picks dense
or chunked when run, by the memory budget.

    python benchmarks/bench_long_sequence.py --lengths 4096 8192 \
        --impls ours keras --unknown-length
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

IMPLS = ["ours", "ours-xla", "ours-core", "keras", "torch-sdpa", "torch-mha",
         "torch-layer", "torch-layer-compiled"]


def rss_mb():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def torch_layer_step(torch, x_np, heads, head_dim, dev, compiled, causal=False):
    """Our layer's work in plain torch: four projections with biases and
    SDPA; one step is forward + backward to the input and every weight."""
    dim = heads * head_dim
    length = x_np.shape[1]
    projections = torch.nn.ModuleList(
        torch.nn.Linear(dim, dim) for _ in range(4)
    ).to(dev)
    x = torch.tensor(x_np, device=dev, requires_grad=True)

    def layer(x):
        q, k, v = (
            p(x).view(1, length, heads, head_dim).transpose(1, 2)
            for p in projections[:3]
        )
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return projections[3](out.transpose(1, 2).reshape(1, length, dim))

    forward = torch.compile(layer, dynamic=False) if compiled else layer

    def step():
        projections.zero_grad(set_to_none=True)
        x.grad = None
        loss = forward(x).square().mean()
        loss.backward()
        return float(loss)

    # No call before the timed first one: the first call includes
    # `torch.compile`'s compilation, as ours includes tracing and XLA's (the
    # docstring's "first call"); above `--repeat-max` the first calls are
    # the times compared.
    return step


def run_case(impl, length, heads, head_dim, repeats, block_size, causal=False,
             unknown_length=False):
    import numpy as np

    dim = heads * head_dim
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((1, length, dim)).astype("float32")
    if impl.startswith("torch"):
        import torch

        torch.set_num_threads(os.cpu_count())
        dev = "cuda" if torch.cuda.is_available() else "cpu"

        def gpu_peak():
            return torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else None

        if impl == "torch-sdpa":
            q, k, v = (
                torch.randn(1, heads, length, head_dim, device=dev, requires_grad=True)
                for _ in range(3)
            )
            sdpa = torch.nn.functional.scaled_dot_product_attention

            def step():
                for t in (q, k, v):
                    t.grad = None
                loss = sdpa(q, k, v, is_causal=causal).square().mean()
                loss.backward()
                return float(loss)

        elif impl.startswith("torch-layer"):
            step = torch_layer_step(torch, x_np, heads, head_dim, dev,
                                    impl.endswith("compiled"), causal)
        else:
            layer = torch.nn.MultiheadAttention(dim, heads, batch_first=True).to(dev)
            x = torch.tensor(x_np, device=dev, requires_grad=True)

            def step():
                layer.zero_grad(set_to_none=True)
                x.grad = None
                mask = (torch.nn.Transformer.generate_square_subsequent_mask(length)
                        if causal else None)
                loss = layer(x, x, x, need_weights=False, attn_mask=mask,
                             is_causal=causal)[0].square().mean()
                loss.backward()
                return float(loss)

    else:
        import keras
        import tensorflow as tf

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from keras_attention import ops as attention_ops
        from keras_attention.layers import MultiHeadAttention

        def gpu_peak():
            if not tf.config.list_logical_devices("GPU"):
                return None
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20

        jit = impl in ("ours-xla", "ours-core")
        if impl == "ours-core":
            q, k, v = (
                tf.constant(rng.standard_normal((1, length, heads, head_dim)), "float32")
                for _ in range(3)
            )

            @tf.function(jit_compile=True)
            def compiled(q, k, v):
                with tf.GradientTape() as tape:
                    tape.watch([q, k, v])
                    out = attention_ops.dot_product_attention(
                        q, k, v, block_size=block_size, is_causal=causal
                    )
                    loss = tf.reduce_mean(tf.square(out))
                grads = tape.gradient(loss, [q, k, v])
                return tf.add_n([tf.reduce_sum(g) for g in grads])

            def step():
                return float(compiled(q, k, v))

        else:
            x = tf.constant(x_np)
            if impl == "keras":
                layer = keras.layers.MultiHeadAttention(heads, head_dim)
            else:
                layer = MultiHeadAttention(heads, head_dim)
            layer.build(x.shape, x.shape)

            signature = [tf.TensorSpec((1, None, dim))] if unknown_length else None

            @tf.function(jit_compile=jit, input_signature=signature)
            def compiled(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_mean(tf.square(
                        layer(x, x, use_causal_mask=causal)))
                grads = tape.gradient(loss, [x] + layer.trainable_variables)
                return tf.add_n([tf.reduce_sum(g) for g in grads])

            def step():
                return float(compiled(x))

    base = rss_mb()
    c0, t0 = time.process_time(), time.perf_counter()
    step()
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    times, cpus = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    paths = []
    if not impl.startswith("torch"):
        # What `implementation="auto"` took, and why (measured or a rule).
        paths = [
            f"{c.implementation}: {c.reason}"
            for c in attention_ops.dispatch_choices()
            if c.implementation in ("dense", "blocked", "chunked", "dense or chunked")
        ]
    return {
        "paths": paths,
        "first": first,
        "time": float(np.median(times)) if times else first,
        "cpu": float(np.median(cpus)) if cpus else first_cpu,
        "peak_mb": peak_mb(),
        "base_mb": base,
        "gpu_peak_mb": gpu_peak(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[4096, 8192, 16384, 32768])
    parser.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--repeat-max", type=int, default=16384,
                        help="no repeats above this length (first call only)")
    parser.add_argument("--keras-max", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=None,
                        help="ours-core's key block (default: the library's)")
    parser.add_argument("--causal", action="store_true",
                        help="causal self-attention on every side")
    parser.add_argument("--unknown-length", action="store_true",
                        help="trace ours and keras with the length unknown")
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds per case")
    parser.add_argument("--case", nargs=2, metavar=("IMPL", "LENGTH"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.case:
        impl, length = args.case[0], int(args.case[1])
        repeats = args.repeats if length <= args.repeat_max else 0
        result = run_case(impl, length, args.heads, args.head_dim, repeats,
                          args.block_size, args.causal, args.unknown_length)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from machine import describe

    print(f"# {' '.join(sys.argv)}")
    print(f"# {describe()}")
    print(f"# batch 1, {'causal, ' if args.causal else ''}"
          f"{'length unknown when traced, ' if args.unknown_length else ''}"
          f"{args.heads} heads, head size {args.head_dim}, forward+backward; "
          f"load average {'%.2f %.2f %.2f' % os.getloadavg()}", flush=True)
    results = {}
    for length in args.lengths:
        for impl in args.impls:
            if impl == "keras" and length > args.keras_max:
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--case", impl,
                   str(length), "--heads", str(args.heads), "--head-dim",
                   str(args.head_dim), "--repeats", str(args.repeats),
                   "--repeat-max", str(args.repeat_max)]
            if args.block_size:
                cmd += ["--block-size", str(args.block_size)]
            if args.causal:
                cmd += ["--causal"]
            if args.unknown_length:
                cmd += ["--unknown-length"]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.timeout)
                lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
                if proc.returncode or not lines:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                    result = {"error": f"exit {proc.returncode}: {' '.join(tail)[:150]}"}
                else:
                    result = json.loads(lines[-1][len("RESULT "):])
            except subprocess.TimeoutExpired:
                result = {"error": f"timed out after {args.timeout} s"}
            results[(impl, length)] = result
            print(f"  {impl:<10} {length:>6} {json.dumps(result)}", flush=True)

    for (impl, length), r in results.items():
        for path in r.get("paths", []):
            print(f"# {impl} at {length}: {path}")
    print(f"\n# load average at the end: {'%.2f %.2f %.2f' % os.getloadavg()}")
    print("# x torch: torch-sdpa's time / this time (> 1: faster than torch SDPA)")
    print("# x torch layer: the best of torch-layer / torch-layer-compiled over "
          "this time (the same whole layer)")
    print("| L | impl | first s | time s | cpu s | peak RSS MB | peak - before MB "
          "| GPU peak MB | x torch-sdpa (wall) | x torch-sdpa (cpu) | x torch layer |")
    print("|" + " --- |" * 11)
    for (impl, length), r in results.items():
        if "error" in r:
            print(f"| {length} | {impl} | failed: {r['error']} |" + " |" * 7)
            continue
        ref = results.get(("torch-sdpa", length), {})
        xw = f"{ref['time'] / r['time']:.2f}" if "time" in ref else "-"
        xc = f"{ref['cpu'] / r['cpu']:.2f}" if "cpu" in ref else "-"
        gpu = f"{r['gpu_peak_mb']:.0f}" if r.get("gpu_peak_mb") is not None else "-"
        layer_times = [
            results[(name, length)]["time"]
            for name in ("torch-layer", "torch-layer-compiled")
            if "time" in results.get((name, length), {})
        ]
        xl = f"{min(layer_times) / r['time']:.2f}" if layer_times else "-"
        print(f"| {length} | {impl} | {r['first']:.1f} | {r['time']:.1f} | "
              f"{r['cpu']:.1f} | {r['peak_mb']:.0f} | "
              f"{r['peak_mb'] - r['base_mb']:.0f} | {gpu} | {xw} | {xc} | {xl} |")


if __name__ == "__main__":
    main()
