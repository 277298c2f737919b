"""Long context: sliding-window attention that skips work, forward + backward.

`keras_attention.layers.MultiHeadAttention(num_heads=8, key_dim=64,
sliding_window=W, use_causal_mask=True)` (Mistral's causal window) on one
sequence (batch 1), forward + backward (gradients of `mean(out ** 2)` with
respect to the input and every weight), compiled with XLA. From 8,192
tokens the layer runs its chunked long-context path (the projections inside
the chunk loop, `keras_attention/layers/_multi_head_long.py`; `--general-path`
keeps it off: the projections around the blocked core, which visits only the
key blocks each query block's band meets); either way time grows with
`T * W`; without a window (`--full-lengths`) it grows with `T ** 2`.
Each case runs in its own subprocess, so its peak resident memory
(`ru_maxrss`) is its own. Columns: the first call (compilation included),
the median of `--repeats` more, the process's peak RSS (each call waits
for its result by copying one row of it: the input and the step are all
that the process holds). `--dtype` is the
layer's dtype policy (`bfloat16`: the input, weights and gradients too;
`mixed_bfloat16`: float32 input and weights, bfloat16 compute). `--core`
measures `keras_attention.ops.dot_product_attention` alone on `q, k, v`
`(1, T, H, D)` of that dtype (gradients for the three). The process's
floor is the framework itself: importing TensorFlow takes about 0.8 GB
of RSS, Keras on JAX about 0.3 GB (`KERAS_BACKEND=jax` runs the same cases
with `jax.jit(jax.grad(...))`).

    python benchmarks/bench_long_context.py
    python benchmarks/bench_long_context.py --lengths 16384 --full-lengths 16384
    python benchmarks/bench_long_context.py --lengths 131072 --full-lengths --dtype bfloat16
    python benchmarks/bench_long_context.py --lengths 131072 --full-lengths --core
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _layer_case(length, window, heads, head_dim, position_encoding, dtype,
                general_path=False, chunk=None):
    """The layer's input `(1, T, C)` and the layer."""
    import keras
    import numpy as np

    from keras_attention.layers import MultiHeadAttention

    dim = heads * head_dim
    input_dtype = "float32" if dtype.startswith("mixed") else dtype
    # Drawn in float32: a float64 draw would be the process's peak.
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(0).standard_normal((1, length, dim), np.float32),
        dtype=input_dtype,
    )
    layer = MultiHeadAttention(
        num_heads=heads, key_dim=head_dim, sliding_window=window,
        use_causal_mask=True,
        # "auto" takes the chunked path from 8,192 tokens; "blocked" keeps
        # the projections around the blocked core (the general path).
        implementation="blocked" if general_path else "auto",
        position_encoding=position_encoding, dtype=dtype,
    )
    layer(keras.ops.zeros((1, 8, dim), input_dtype))  # build
    if chunk:
        layer._long_context_chunk = chunk
    return [x], layer


def _core_case(length, window, heads, head_dim, dtype):
    """The core's inputs `q, k, v` `(1, T, H, D)` and the core."""
    import keras
    import numpy as np

    from keras_attention import ops as attention_ops

    rng = np.random.default_rng(0)
    inputs = [
        keras.ops.convert_to_tensor(
            rng.standard_normal((1, length, heads, head_dim), np.float32),
            dtype=dtype,
        )
        for _ in range(3)
    ]

    def forward(q, k, v):
        return attention_ops.dot_product_attention(
            q, k, v, is_causal=True, sliding_window=window,
            implementation="blocked",
        )

    return inputs, forward


def _compiled_step(inputs, forward, layer):
    """A call of the compiled forward + backward: gradients of
    `mean(out ** 2)` for the inputs (and the layer's weights)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        weights = layer.trainable_weights if layer is not None else []

        @tf.function(jit_compile=True)
        def step(*inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                loss = tf.reduce_mean(tf.cast(forward(*inputs), "float32") ** 2)
            return tape.gradient(loss, list(inputs) + weights)

        return lambda: step(*inputs)[0]
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        if layer is None:
            def loss(inputs):
                return jnp.mean(forward(*inputs).astype("float32") ** 2)

            grad = jax.jit(jax.grad(loss))
            return lambda: grad(inputs)[0]
        trainable = [v.value for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]

        def loss(x, trainable):
            out, _ = layer.stateless_call(trainable, fixed, x)
            return jnp.mean(out.astype("float32") ** 2)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        return lambda: grad(inputs[0], trainable)[0]
    raise ValueError(
        "The benchmark compiles with XLA on TensorFlow or JAX. Received: "
        f"backend={backend!r}"
    )


def _wait(result):
    """Block until `result` is computed, copying one row of it (a numpy
    copy of the whole `dx` would add its size to the peak)."""
    import keras

    return keras.ops.convert_to_numpy(result[(0,) * (len(result.shape) - 1)])


def run_case(length, window, heads, head_dim, repeats, position_encoding,
             dtype="float32", core=False, general_path=False, chunk=None):
    import keras

    if core:
        inputs, forward = _core_case(length, window, heads, head_dim, dtype)
        layer = None
    else:
        inputs, layer = _layer_case(
            length, window, heads, head_dim, position_encoding, dtype,
            general_path, chunk,
        )
        forward = layer
    step = _compiled_step(inputs, forward, layer)

    start = time.perf_counter()
    _wait(step())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _wait(step())
        times.append(time.perf_counter() - start)
    return {
        "length": length,
        "window": window,
        "position_encoding": position_encoding,
        "dtype": dtype,
        "core": core,
        "backend": keras.backend.backend(),
        "first_s": round(first, 2),
        "median_s": round(sorted(times)[len(times) // 2], 2) if times else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768, 65536])
    parser.add_argument("--full-lengths", type=int, nargs="*", default=[16384],
                        help="lengths also run without a window")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--position-encoding", default=None)
    parser.add_argument("--dtype", default="float32",
                        help="the layer's dtype policy")
    parser.add_argument("--core", action="store_true",
                        help="the core alone: dot_product_attention on (1, T, H, D) "
                        "q, k, v, gradients for the three")
    parser.add_argument("--general-path", action="store_true",
                        help="keep the layer off its chunked long-context path "
                        "(the projections around the blocked core)")
    parser.add_argument("--chunk", type=int, default=None,
                        help="queries per chunk of the chunked path (512)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.core and args.position_encoding:
        parser.error("--core runs without --position-encoding")
    if args.case:
        length, window = json.loads(args.case)
        print(json.dumps(run_case(
            length, window, args.heads, args.head_dim, args.repeats,
            args.position_encoding, args.dtype, args.core, args.general_path,
            args.chunk,
        )))
        return
    print_machine()
    cases = [(n, args.window) for n in args.lengths]
    cases += [(n, None) for n in args.full_lengths]
    print("| length | window | first call (s) | median (s) | peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|")
    for length, window in cases:
        command = [sys.executable, __file__, "--case", json.dumps([length, window]),
                   "--heads", str(args.heads), "--head-dim", str(args.head_dim),
                   "--repeats", str(args.repeats), "--dtype", args.dtype]
        if args.core:
            command.append("--core")
        if args.general_path:
            command.append("--general-path")
        if args.chunk:
            command += ["--chunk", str(args.chunk)]
        if args.position_encoding:
            command += ["--position-encoding", args.position_encoding]
        # The checkout's package, whichever one is installed.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, env.get("PYTHONPATH")) if p
        )
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode:
            print(f"| {length} | {window} | failed: {done.stderr.strip()[-200:]} |||")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {length:,} | {window or 'none'} | {r['first_s']} | "
              f"{r['median_s']} | {r['peak_rss_mb']:,} |", flush=True)


if __name__ == "__main__":
    main()
