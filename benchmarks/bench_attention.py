"""Self-attention speed: ours against keras, keras.ops and PyTorch, one run.

Self-attention on `(B, L, H * D)` inputs (default batch 8, 8 heads, head
size 64, lengths 128, 512 and 2048), forward and forward + backward
(gradients of `mean(out ** 2)` with respect to the inputs and every
weight), in one process:

- `ours`: `keras_attention.layers.MultiHeadAttention` (projections + core),
  in a `tf.function` and in a `tf.function(jit_compile=True)` (XLA);
- `keras`: `keras.layers.MultiHeadAttention`, both modes (its best mode is
  the reference of the ratio column);
- `torch MHA`: `torch.nn.MultiheadAttention(batch_first=True)` (projections
  + `scaled_dot_product_attention`), eager and under `torch.compile`, when
  torch is installed (`--no-torch-compile`: eager only);
- the cores alone on projected `(B, L, H, D)` heads: ours
  (`keras_attention.ops.dot_product_attention`, both modes),
  `keras.ops.dot_product_attention` (both modes) and
  `torch.nn.functional.scaled_dot_product_attention` (eager and compiled).

GFLOP/s count the nominal matmul work only (projections 2 * 4 * B * L *
dim^2, core 2 * 2 * B * H * L^2 * D; forward + backward = 3x forward),
whatever an implementation recomputes. `% peak` divides by the best square
float32 (or `--dtype`) matmul rate, TensorFlow's or PyTorch's, measured in
the same run. `x keras` = keras's best time / this time (> 1: faster than
keras); `x torch` = torch's best time (eager or compiled) / this time,
layers against `torch MHA` and cores against `torch SDPA`.

    python benchmarks/bench_attention.py
    python benchmarks/bench_attention.py --lengths 512 2048 --repeats 5
    python benchmarks/bench_attention.py --dtype bfloat16   # mixed_bfloat16

Times are the median of `--repeats` timed calls after one warm-up call
(tracing and compilation); the load average is printed, as the machine may
be shared.
"""

import argparse
import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# torch's OpenMP threads otherwise spin for a while after each of its calls
# (libgomp's default wait policy), taking cores from the TensorFlow runs
# interleaved with them in this process: our layer under XLA took 153 ms at
# 512 with torch's rounds in between and 126 ms without (BENCHMARKS.md,
# "Speed per machine"); torch's own times do not change. Set before torch
# loads; an explicit OMP_WAIT_POLICY is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras_attention  # noqa: E402,F401  (before TensorFlow: torch.compile's triton)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from machine import describe  # noqa: E402
from machine import load_average  # noqa: E402
from keras_attention import ops as attention_ops  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402

try:  # optional peer
    import torch
except ImportError:  # pragma: no cover
    torch = None


def tf_device():
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "TF device CPU"
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"TF device GPU {details.get('device_name', '')}"


def sync_tf(x):
    return float(np.asarray(x))


def timed(fn, repeats):
    """(first call seconds, median of `repeats` calls, min)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, float(np.median(times)), float(np.min(times))


def interleaved(fns, repeats):
    """Warm each of `fns` up, then time them round-robin `repeats` times.

    Interleaving spreads the load of a shared machine evenly over the
    implementations compared. Returns `{name: (first, wall median, wall min,
    cpu median)}`; cpu is the process's CPU seconds per call (all threads).
    """
    first, wall, cpu = {}, {}, {}
    for name, fn in list(fns.items()):
        start = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report and continue
            print(f"  {name}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            del fns[name]
            continue
        first[name] = time.perf_counter() - start
        wall[name], cpu[name] = [], []
    for _ in range(repeats):
        for name, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {
        n: (first[n], float(np.median(wall[n])), float(np.min(wall[n])),
            float(np.median(cpu[n])))
        for n in fns
    }


# ------------------------------------------------------------------ peaks


def tf_matmul_rate(n, dtype, repeats):
    a = tf.random.normal((n, n), dtype="float32")
    a = tf.cast(a, dtype)
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"

    @tf.function
    def mm(x):
        return tf.reduce_sum(tf.cast(tf.matmul(x, x)[:1, :1], "float32"))

    with tf.device(device):
        _, med, best = timed(lambda: sync_tf(mm(a)), repeats)
    return 2 * n**3 / best / 1e9


def torch_matmul_rate(n, dtype, repeats):
    dev = torch_device()
    a = torch.randn(n, n, device=dev).to(getattr(torch, dtype))

    def run():
        c = a @ a
        torch_sync()
        return c

    with torch.no_grad():
        _, med, best = timed(run, repeats)
    return 2 * n**3 / best / 1e9


def torch_device():
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


def torch_sync():
    if torch_device() == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------- variants


def tf_layer_step(layer, x, backward, jit):
    """A compiled forward (+ backward) of a self-attention layer."""

    @tf.function(jit_compile=jit)
    def step(inputs):
        if not backward:
            return tf.reduce_sum(tf.cast(layer(inputs, inputs), "float32"))
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = tf.cast(layer(inputs, inputs), "float32")
            loss = tf.reduce_mean(tf.square(out))
        grads = tape.gradient(loss, [inputs] + layer.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.cast(g, "float32")) for g in grads])

    return lambda: sync_tf(step(x))


def tf_core_step(core, q, k, v, backward, jit):
    @tf.function(jit_compile=jit)
    def step(q, k, v):
        if not backward:
            return tf.reduce_sum(tf.cast(core(q, k, v), "float32"))
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = tf.cast(core(q, k, v), "float32")
            loss = tf.reduce_mean(tf.square(out))
        grads = tape.gradient(loss, [q, k, v])
        return tf.add_n([tf.reduce_sum(tf.cast(g, "float32")) for g in grads])

    return lambda: sync_tf(step(q, k, v))


def torch_layer_step(dim, heads, x_np, backward, dtype, compiled=False):
    dev = torch_device()
    layer = torch.nn.MultiheadAttention(dim, heads, batch_first=True).to(dev)
    # Inference mode (dropout is 0, so the same function): in training mode
    # torch skips its fused self-attention fast path
    # (`_native_multi_head_attention`), its best forward under `no_grad`.
    layer.eval()
    x = torch.tensor(x_np, device=dev)
    # `dynamic=False`: compiled for this shape (a second shape in the process
    # would otherwise recompile with symbolic sizes, "automatic dynamic").
    call = torch.compile(layer, dynamic=False) if compiled else layer

    def run():
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            if not backward:
                with torch.no_grad():
                    out = call(x, x, x, need_weights=False)[0]
                torch_sync()
                return out
            xx = x.detach().requires_grad_(True)
            out = call(xx, xx, xx, need_weights=False)[0]
            loss = out.float().square().mean()
        layer.zero_grad(set_to_none=True)
        loss.backward()
        torch_sync()
        return loss

    return run


def torch_core_step(q_np, k_np, v_np, backward, dtype, compiled=False):
    dev = torch_device()
    tdtype = getattr(torch, dtype)
    # (B, L, H, D) -> (B, H, L, D), contiguous, as SDPA wants it.
    q, k, v = (
        torch.tensor(a, device=dev).to(tdtype).transpose(1, 2).contiguous()
        for a in (q_np, k_np, v_np)
    )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if compiled:
        sdpa = torch.compile(sdpa, dynamic=False)

    def run():
        if not backward:
            with torch.no_grad():
                out = sdpa(q, k, v)
            torch_sync()
            return out
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = sdpa(qq, kk, vv)
        loss = out.float().square().mean()
        loss.backward()
        torch_sync()
        return loss

    return run


def torch_modes(args):
    """torch's modes to time: eager, and `torch.compile` unless told not
    or no C++ compiler is found (its CPU backend needs one)."""
    if torch is None or args.no_torch:
        return []
    if args.no_torch_compile:
        return ["eager"]
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "g++", "clang")):
        print("# no C++ compiler found: torch is timed eager only", flush=True)
        return ["eager"]
    return ["eager", "compiled"]


def keras_core(q, k, v):
    return keras.ops.dot_product_attention(q, k, v)


def our_core(q, k, v):
    return attention_ops.dot_product_attention(q, k, v)


# ------------------------------------------------------------------- table


def flops(batch, length, heads, head_dim, layer):
    dim = heads * head_dim
    core = 2 * 2 * batch * heads * length * length * head_dim
    proj = 2 * 4 * batch * length * dim * dim if layer else 0
    return core + proj


def run_length(args, length, matmul_fn, peaks, cpu_peaks, rows):
    b, h, d = args.batch, args.heads, args.head_dim
    dim = h * d
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((b, length, dim)).astype("float32")
    q_np, k_np, v_np = (
        rng.standard_normal((b, length, h, d)).astype("float32") for _ in range(3)
    )
    compute = "bfloat16" if args.dtype == "bfloat16" else "float32"
    x = tf.constant(x_np)
    q, k, v = (tf.cast(tf.constant(a), compute) for a in (q_np, k_np, v_np))

    keras.utils.set_random_seed(0)
    ours = MultiHeadAttention(num_heads=h, key_dim=d)
    theirs = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d)
    ours(x, x)
    theirs(x, x)
    ours.set_weights(theirs.get_weights())

    for backward in (False, True):
        mode = "fwd+bwd" if backward else "fwd"
        results, cpus = {}, {}
        variants = [
            ("layer", "ours", "tf.function", lambda: tf_layer_step(ours, x, backward, False)),
            ("layer", "ours", "XLA", lambda: tf_layer_step(ours, x, backward, True)),
            ("layer", "keras", "tf.function", lambda: tf_layer_step(theirs, x, backward, False)),
            ("layer", "keras", "XLA", lambda: tf_layer_step(theirs, x, backward, True)),
        ]
        for how in torch_modes(args):
            variants.append(
                ("layer", "torch MHA", how,
                 lambda how=how: torch_layer_step(
                     dim, h, x_np, backward, args.dtype, how == "compiled"))
            )
        variants += [
            ("core", "ours", "tf.function", lambda: tf_core_step(our_core, q, k, v, backward, False)),
            ("core", "ours", "XLA", lambda: tf_core_step(our_core, q, k, v, backward, True)),
            ("core", "keras.ops", "tf.function", lambda: tf_core_step(keras_core, q, k, v, backward, False)),
            ("core", "keras.ops", "XLA", lambda: tf_core_step(keras_core, q, k, v, backward, True)),
        ]
        for how in torch_modes(args):
            variants.append(
                ("core", "torch SDPA", how,
                 lambda how=how: torch_core_step(
                     q_np, k_np, v_np, backward, compute, how == "compiled"))
            )
        fns = {
            (kind, name, how): make()
            for kind, name, how, make in variants
            if not args.only or name in args.only
        }
        fns[("matmul", "peak", "")] = matmul_fn
        measured = interleaved(fns, args.repeats)
        mm_first, mm_med, mm_min, mm_cpu = measured.pop(("matmul", "peak", ""))
        peaks.append(2 * args.matmul_size**3 / mm_min / 1e9)
        cpu_peaks.append(2 * args.matmul_size**3 / mm_cpu / 1e9)
        for (kind, name, how), (first, med, best, cpu) in measured.items():
            results[(kind, name, how)] = med
            cpus[(kind, name, how)] = cpu
            print(f"  {length:>5} {mode:<7} {kind:<5} {name:<10} {how:<11} "
                  f"first {first:8.3f} s  median {med * 1e3:9.1f} ms  "
                  f"min {best * 1e3:9.1f} ms  cpu {cpu * 1e3:9.1f} ms", flush=True)
        for (kind, name, how), med in results.items():
            work = flops(b, length, h, d, kind == "layer") * (3 if backward else 1)
            gflops = work / med / 1e9
            keras_name = "keras" if kind == "layer" else "keras.ops"
            torch_name = "torch MHA" if kind == "layer" else "torch SDPA"
            cpu = cpus[(kind, name, how)]
            ratios = []
            for times, mine in ((results, med), (cpus, cpu)):
                keras_best, torch_best = (
                    min((t for (kk, nn, _), t in times.items()
                         if kk == kind and nn == peer), default=None)
                    for peer in (keras_name, torch_name)
                )
                ratios += [keras_best / mine if keras_best else None,
                           torch_best / mine if torch_best else None]
            rows.append(
                (length, mode, kind, name, how, med * 1e3, cpu * 1e3, gflops,
                 work / cpu / 1e9, *ratios)
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: layers under the mixed_bfloat16 policy, "
                        "cores on bfloat16 inputs")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="torch eager only (torch.compile needs a C++ compiler)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only these implementations (e.g. ours keras)")
    args = parser.parse_args()
    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    if torch is not None:
        torch.set_num_threads(os.cpu_count())

    print(f"# {' '.join(sys.argv)}")
    print(f"# {describe()}; {tf_device()}")
    print(f"# oneDNN {attention_ops.onednn_status()}; "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
          f"B={args.batch}, heads={args.heads}, head size={args.head_dim}, "
          f"dtype={args.dtype}, median of {args.repeats}; load average {load_average()}")
    mm_dtype = "bfloat16" if args.dtype == "bfloat16" else "float32"
    n = args.matmul_size
    rates = {"tf": tf_matmul_rate(n, mm_dtype, 5)}
    if mm_dtype == "bfloat16":
        rates["tf float32"] = tf_matmul_rate(n, "float32", 5)
    if torch is not None and not args.no_torch:
        rates["torch"] = torch_matmul_rate(n, mm_dtype, 5)
        if mm_dtype == "bfloat16":
            rates["torch float32"] = torch_matmul_rate(n, "float32", 5)
    peak = max(v for k, v in rates.items() if "float32" not in k or mm_dtype == "float32")
    print(f"# {n}x{n} {mm_dtype} matmul GFLOP/s: "
          + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
          + f"; peak used: {peak:.0f}", flush=True)

    # A matmul timed with each round too, so the peak is measured under the
    # same load as the attention calls.
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    with tf.device(device):
        mm_a = tf.cast(tf.random.normal((n, n)), mm_dtype)

    @tf.function
    def mm(x):
        return tf.reduce_sum(tf.cast(tf.matmul(x, x)[:1, :1], "float32"))

    def matmul_fn():
        with tf.device(device):
            return sync_tf(mm(mm_a))

    rows, peaks, cpu_peaks = [], [peak], []
    for length in args.lengths:
        run_length(args, length, matmul_fn, peaks, cpu_peaks, rows)
    peak = max(peaks)
    cpu_peak = max(cpu_peaks)

    print(f"\n# load average at the end: {load_average()}; matmul peak "
          f"{peak:.0f} GFLOP/s wall, {cpu_peak:.0f} GFLOP per CPU-second "
          f"({mm_dtype}, best of the run)")
    print("# wall: median wall-clock time per call; cpu: median process CPU "
          "time per call; x keras / x torch: their best mode's time / ours (> 1: ours "
          "faster), by wall and by CPU time")
    print("| L | pass | what | impl | mode | wall ms | cpu ms | GFLOP/s | "
          "% peak wall | % peak cpu | x keras wall | x torch wall | "
          "x keras cpu | x torch cpu |")
    print("|" + " --- |" * 14)

    def fmt(r):
        return f"{r:.2f}" if r is not None else "-"

    for (length, mode, kind, name, how, ms, cpu_ms, gf, gf_cpu,
         xk, xt, xk_cpu, xt_cpu) in rows:
        print(f"| {length} | {mode} | {kind} | {name} | {how} | {ms:.1f} | "
              f"{cpu_ms:.0f} | {gf:.0f} | {100 * gf / peak:.0f} | "
              f"{100 * gf_cpu / cpu_peak:.0f} | {fmt(xk)} | {fmt(xt)} | "
              f"{fmt(xk_cpu)} | {fmt(xt_cpu)} |")


if __name__ == "__main__":
    main()
