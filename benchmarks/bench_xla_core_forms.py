"""Other forms of the attention core under XLA on a CPU, against the library's.

Issue #17 asks for our layer under XLA to reach 1.1x keras's layer in its
best mode (a plain `tf.function` with oneDNN's kernels on a CPU). What
keeps XLA behind is the memory traffic of the `(B, H, T, S)` tensors
(BENCHMARKS.md, "Speed per machine"). This script times forms that keep
that traffic in cache, forward + backward (the gradients of q, k and v),
best wall and CPU time of `--repeats` round-robin calls after a first that
compiles, and checks each against the library's values:

- `dense` (`--length`, batch 8, 8 heads of 64): the library's dense core
  under XLA (`ops/xla_cpu.py::unnormalised_attention`); keras's core
  (`softmax(q k^T) v`, autodiff) in `tf.function`, its best mode; the core
  computed one group of `(batch, head)` pairs at a time in a `while` loop
  (`--groups`: pairs per step; a group's `(T, S)` scores are made, used
  and dropped inside the step, the backward recomputes them from the
  saved log-sum-exp); and per pair in query chunks of `--chunks` rows
  (each step's scores `chunk x S`, in cache).
- `projections` (`--length`, batch 8, width 512): self-attention's three
  input projections alone, forward + backward (the input's and the
  kernels' gradients), as three `(B·T, 512) x (512, 512)` products or one
  `(512, 1536)` product, in `tf.function` and under XLA.
- `keys` (`--length`, batch 8, 8 heads of 64): the backward's product
  `dV = P^T dO` alone (`dK = dS^T Q` has the same form): the single
  einsum, the library's loop over `(batch, head)` pairs
  (`ops/xla_cpu.py::keys_product`), `P^T` materialised behind an
  `optimization_barrier` (so XLA cannot fold the transpose back into the
  product) and then a plain batched product, `dO^T` materialised the same
  way and `dO^T P` as a plain product (output transposed after a
  barrier), and the loop with each pair's `P^T` materialised; with the
  forward's `P V` (the same arithmetic, the `(T, S)` operand contracted
  along its columns) as the rate to reach. Also the system time and the
  page faults of each call: a form whose temporary buffers are fresh
  memory each call pays for them in the kernel.
- `heads` (`--long-length`, batch 1, 8 heads of 64): the library's blocked
  core (`ops/blocked.py`) under XLA over all heads at once, against the
  same core called one head at a time in a `tf.map_fn` loop (a head's key
  and value blocks stay in cache: 8 MB at 16,384 tokens against 64 MB).

Scratch forms written with TensorFlow ops (this script only); none of
them is in the library, because none was faster where measured
(BENCHMARKS.md).

    python benchmarks/bench_xla_core_forms.py --what dense --length 2048
    python benchmarks/bench_xla_core_forms.py --what heads --long-length 16384
    python benchmarks/bench_xla_core_forms.py --what projections --length 512
    python benchmarks/bench_xla_core_forms.py --what keys --length 2048
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


def _put(buffer, index, value):
    """`buffer[index] = value` (`index` an int tensor or a tuple of them)."""
    from keras import ops

    index = index if isinstance(index, tuple) else (index,)
    value = ops.reshape(value, (1,) * len(index) + tuple(value.shape))
    return ops.slice_update(
        buffer, index + (0,) * (len(buffer.shape) - len(index)), value
    )


def grouped_core(group):
    """The dense core, `group` (batch, head) pairs per loop step."""
    import tensorflow as tf

    def core(q, k, v):
        b, h, t, d = q.shape
        s, n = k.shape[2], b * h // group

        def split(x, length):
            return tf.reshape(x, (n, group, length, d))

        @tf.custom_gradient
        def attend(qf, kf, vf):
            def forward(i, out, lse):
                scores = tf.einsum("gtd,gsd->gts", qf[i], kf[i])
                top = tf.reduce_max(scores, -1, keepdims=True)
                e = tf.exp(scores - top)
                total = tf.reduce_sum(e, -1, keepdims=True)
                o = tf.einsum("gts,gsd->gtd", e, vf[i]) / total
                return i + 1, _put(out, i, o), _put(lse, i, top + tf.math.log(total))

            _, out, lse = tf.while_loop(
                lambda i, *_: i < n, forward,
                (0, tf.zeros((n, group, t, d)), tf.zeros((n, group, t, 1))),
            )

            def grad(d_out):
                delta = tf.reduce_sum(d_out * out, -1, keepdims=True)

                def backward(i, d_q, d_k, d_v):
                    qi, ki, vi, doi = qf[i], kf[i], vf[i], d_out[i]
                    p = tf.exp(tf.einsum("gtd,gsd->gts", qi, ki) - lse[i])
                    d_s = p * (tf.einsum("gtd,gsd->gts", doi, vi) - delta[i])
                    return (
                        i + 1,
                        _put(d_q, i, tf.einsum("gts,gsd->gtd", d_s, ki)),
                        _put(d_k, i, tf.einsum("gtd,gts->gds", qi, d_s)),
                        _put(d_v, i, tf.einsum("gtd,gts->gds", doi, p)),
                    )

                _, d_q, d_k, d_v = tf.while_loop(
                    lambda i, *_: i < n, backward,
                    (0, tf.zeros((n, group, t, d)), tf.zeros((n, group, d, s)),
                     tf.zeros((n, group, d, s))),
                )
                swap = (0, 1, 3, 2)
                return d_q, tf.transpose(d_k, swap), tf.transpose(d_v, swap)

            return out, grad

        out = attend(split(q, t), split(k, s), split(v, s))
        return tf.reshape(out, (b, h, t, d))

    return core


def chunked_core(chunk):
    """The dense core per (batch, head) pair, `chunk` query rows per step."""
    import tensorflow as tf

    def core(q, k, v):
        b, h, t, d = q.shape
        s, n, nc = k.shape[2], b * h, t // chunk

        @tf.custom_gradient
        def attend(qf, kf, vf):
            def forward(step, out, lse):
                i, c = step // nc, step % nc
                scores = tf.matmul(qf[i, c], kf[i], transpose_b=True)
                top = tf.reduce_max(scores, -1, keepdims=True)
                e = tf.exp(scores - top)
                total = tf.reduce_sum(e, -1, keepdims=True)
                o = tf.matmul(e, vf[i]) / total
                lse = _put(lse, (i, c), top + tf.math.log(total))
                return step + 1, _put(out, (i, c), o), lse

            _, out, lse = tf.while_loop(
                lambda i, *_: i < n * nc, forward,
                (0, tf.zeros((n, nc, chunk, d)), tf.zeros((n, nc, chunk, 1))),
            )

            def grad(d_out):
                delta = tf.reduce_sum(d_out * out, -1, keepdims=True)

                def pair(i, d_q, d_k, d_v):
                    ki, vi = kf[i], vf[i]

                    def rows(c, d_q, d_ki, d_vi):
                        qc, doc = qf[i, c], d_out[i, c]
                        p = tf.exp(tf.matmul(qc, ki, transpose_b=True) - lse[i, c])
                        d_vi = d_vi + tf.matmul(doc, p, transpose_a=True)
                        d_s = p * (tf.matmul(doc, vi, transpose_b=True) - delta[i, c])
                        d_q = _put(d_q, (i, c), tf.matmul(d_s, ki))
                        d_ki = d_ki + tf.matmul(qc, d_s, transpose_a=True)
                        return c + 1, d_q, d_ki, d_vi

                    _, d_q, d_ki, d_vi = tf.while_loop(
                        lambda c, *_: c < nc, rows,
                        (0, d_q, tf.zeros((d, s)), tf.zeros((d, s))),
                    )
                    return i + 1, d_q, _put(d_k, i, d_ki), _put(d_v, i, d_vi)

                _, d_q, d_k, d_v = tf.while_loop(
                    lambda i, *_: i < n, pair,
                    (0, tf.zeros((n, nc, chunk, d)), tf.zeros((n, d, s)),
                     tf.zeros((n, d, s))),
                )
                return d_q, tf.transpose(d_k, (0, 2, 1)), tf.transpose(d_v, (0, 2, 1))

            return out, grad

        out = attend(
            tf.reshape(q, (n, nc, chunk, d)), tf.reshape(k, (n, s, d)),
            tf.reshape(v, (n, s, d)),
        )
        return tf.reshape(out, (b, h, t, d))

    return core


def library_dense(q, k, v):
    from keras_attention.ops import xla_cpu

    return xla_cpu.unnormalised_attention(q, k, v, None)


def keras_dense(q, k, v):
    import tensorflow as tf

    scores = tf.einsum("bhtd,bhsd->bhts", q, k)
    return tf.einsum("bhts,bhsd->bhtd", tf.nn.softmax(scores), v)


def blocked_all_heads(q, k, v):
    from keras_attention.ops.blocked import blocked_attention

    return blocked_attention(q, k, v)


def blocked_per_head(q, k, v):
    import tensorflow as tf

    from keras_attention.ops.blocked import blocked_attention

    def heads_first(x):  # (B, T, H, D) -> (H, B, T, 1, D)
        return tf.transpose(x, (2, 0, 1, 3))[:, :, :, None]

    out = tf.map_fn(
        lambda x: blocked_attention(*x),
        (heads_first(q), heads_first(k), heads_first(v)),
        fn_output_signature=q.dtype,
    )  # (H, B, T, 1, D)
    return tf.transpose(out[:, :, :, 0], (1, 2, 0, 3))


def projection_steps(length):
    """`{name: step}` for the three input projections, forward + backward;
    each step returns the input's and the kernels' gradients."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((8 * length, 512)).astype("float32"))
    kernels = [tf.constant(rng.standard_normal((512, 512)).astype("float32") * 0.04)
               for _ in range(3)]
    upstream = [tf.constant(rng.standard_normal((8 * length, 512)).astype("float32"))
                for _ in range(3)]

    def separate(x, kernels):
        return [tf.matmul(x, w) for w in kernels]

    def fused(x, kernels):
        return tf.split(tf.matmul(x, tf.concat(kernels, axis=1)), 3, axis=1)

    def step(form, jit):
        @tf.function(jit_compile=jit)
        def run():
            with tf.GradientTape() as tape:
                tape.watch([x] + kernels)
                outs = form(x, kernels)
                loss = tf.add_n([tf.reduce_sum(y * d) for y, d in zip(outs, upstream)])
            return tape.gradient(loss, [x] + kernels)

        return run

    return {
        f"{name}, {'XLA' if jit else 'tf.function'}": step(form, jit)
        for name, form in (("three products", separate), ("one fused product", fused))
        for jit in (False, True)
    }


def _barrier(x):
    """`x`, behind an XLA optimization barrier (no rewrite crosses it)."""
    from tensorflow.compiler.tf2xla.python import xla

    return xla.optimization_barrier(x)[0]


def keys_forms():
    """`{form: fn(p, x)}` computing `einsum("bhts,bhtd->bhsd", p, x)`,
    compiled by XLA; the last, `P V`, is the forward's product (other
    values) whose rate the others are measured against."""
    import tensorflow as tf

    from keras_attention.ops import xla_cpu

    def looped_transposed(p, x):
        batch, heads, t_len, s_len = p.shape
        p = tf.reshape(p, (-1, t_len, s_len))
        x = tf.reshape(x, (-1, t_len, x.shape[-1]))

        def step(i, out):
            p_t = _barrier(tf.transpose(tf.gather(p, i)))
            return _put(out, i, tf.matmul(p_t, tf.gather(x, i)))

        out = tf.zeros((batch * heads, s_len, x.shape[-1]))
        _, out = tf.while_loop(lambda i, _: i < batch * heads,
                               lambda i, out: (i + 1, step(i, out)), (0, out))
        return tf.reshape(out, (batch, heads, s_len, -1))

    forms = {
        "one einsum": lambda p, x: tf.einsum("bhts,bhtd->bhsd", p, x),
        "library: loop over pairs": xla_cpu.keys_product,
        "P^T behind a barrier, then P^T dO": lambda p, x: tf.einsum(
            "bhst,bhtd->bhsd", _barrier(tf.transpose(p, (0, 1, 3, 2))), x),
        "dO^T behind a barrier, dO^T P, transposed": lambda p, x: tf.transpose(
            _barrier(tf.einsum("bhdt,bhts->bhds",
                               _barrier(tf.transpose(x, (0, 1, 3, 2))), p)),
            (0, 1, 3, 2)),
        "loop, each pair's P^T behind a barrier": looped_transposed,
        "P V (the forward's product: the rate to reach)": lambda p, x: tf.einsum(
            "bhts,bhsd->bhtd", p, x),
    }
    return {name: tf.function(fn, jit_compile=True) for name, fn in forms.items()}


def compare_keys(length, repeats):
    """Times `keys_forms()` round-robin on `(8, 8, length, length)` weights."""
    import resource

    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    p = tf.constant(rng.random((8, 8, length, length), dtype=np.float32))
    x = tf.constant(rng.standard_normal((8, 8, length, 64)).astype("float32"))
    forms = keys_forms()
    reference = tf.einsum("bhts,bhtd->bhsd", p, x).numpy()
    best = {}
    for name, fn in forms.items():
        got = fn(p, x).numpy()
        best[name] = [float("inf")] * 4 + [
            float(np.max(np.abs(got - reference))) if "forward" not in name else None]
    for _ in range(repeats):
        for name, fn in forms.items():
            before = resource.getrusage(resource.RUSAGE_SELF)
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(p, x).numpy()
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            after = resource.getrusage(resource.RUSAGE_SELF)
            if wall < best[name][0]:
                best[name][:4] = [wall, cpu, after.ru_stime - before.ru_stime,
                                  after.ru_minflt - before.ru_minflt]
    flops = 2 * 8 * 8 * length * length * 64
    print(f"\n## dV = P^T dO alone, XLA, batch 8, 8 heads of 64, T = S = {length}\n")
    print("| form | wall ms | CPU ms | of which system ms | page faults | GFLOP/s | max difference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (wall, cpu, system, faults, error) in best.items():
        shown = "—" if error is None else f"{error:.1e}"
        print(f"| {name} | {1000 * wall:.1f} | {1000 * cpu:.1f} | {1000 * system:.1f} "
              f"| {faults} | {flops / wall / 1e9:.0f} | {shown} |", flush=True)


def gradient_step(core, jit):
    import tensorflow as tf

    @tf.function(jit_compile=jit)
    def step(q, k, v, w):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(core(q, k, v) * w)
        return tape.gradient(loss, [q, k, v])

    return step


def heads(shape, scale):
    """Random `(q, k, v, w)`: `q` scaled by `scale`, `w` weighs the output."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    return tuple(
        tf.constant(rng.standard_normal(shape).astype("float32") * (scale if i == 0 else 1.0))
        for i in range(4)
    )


def compare(title, steps, args, repeats):
    """Prints `title`, then each step's round-robin best wall and CPU time
    on `args`, and the largest gradient difference from the first step's."""
    import numpy as np

    print(f"\n## {title}\n")
    reference, errors = None, {}
    for name, step in steps.items():
        got = [g.numpy() for g in step(*args)]
        reference = got if reference is None else reference
        errors[name] = max(float(np.max(np.abs(a - b))) for a, b in zip(got, reference))
    wall = {name: float("inf") for name in steps}
    cpu = dict(wall)
    for _ in range(repeats):
        for name, step in steps.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for g in step(*args):
                g.numpy()
            wall[name] = min(wall[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    print("| form | wall ms | CPU ms | max gradient difference |")
    print("| --- | ---: | ---: | ---: |")
    for name in steps:
        print(f"| {name} | {1000 * wall[name]:.1f} | {1000 * cpu[name]:.1f} "
              f"| {errors[name]:.1e} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", nargs="+", choices=["dense", "heads", "projections", "keys"],
                        default=["dense", "heads", "projections", "keys"])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--groups", type=int, nargs="*", default=[1, 4, 16],
                        help="(batch, head) pairs per loop step")
    parser.add_argument("--chunks", type=int, nargs="*", default=[256, 512],
                        help="query rows per loop step (must divide --length)")
    parser.add_argument("--long-length", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# benchmarks/bench_xla_core_forms.py {' '.join(sys.argv[1:])}")
    print(f"# {describe()}")
    if "dense" in args.what:
        steps = {
            "keras's core, tf.function": gradient_step(keras_dense, False),
            "library (unnormalised), XLA": gradient_step(library_dense, True),
        }
        for group in args.groups:
            steps[f"{group} pair(s) per step, XLA"] = gradient_step(grouped_core(group), True)
        for chunk in args.chunks:
            steps[f"per pair, {chunk} query rows per step, XLA"] = gradient_step(
                chunked_core(chunk), True)
        compare(f"Dense core forward + backward, batch 8, 8 heads of 64, "
                f"T = S = {args.length}", steps,
                heads((8, 8, args.length, 64), 0.125), args.repeats)
    if "heads" in args.what:
        steps = {
            "all heads at once (library), XLA": gradient_step(blocked_all_heads, True),
            "one head per loop step, XLA": gradient_step(blocked_per_head, True),
        }
        compare(f"Blocked core forward + backward, batch 1, 8 heads of 64, "
                f"T = S = {args.long_length}", steps,
                heads((1, args.long_length, 8, 64), 1.0), args.repeats)
    if "projections" in args.what:
        compare(f"Three input projections forward + backward, batch 8, width "
                f"512, T = {args.length}", projection_steps(args.length), (),
                args.repeats)
    if "keys" in args.what:
        compare_keys(args.length, args.repeats)
    print(f"\n# at the end: {describe()}")


if __name__ == "__main__":
    main()
