"""Compiled `linear_sum_assignment` against scipy: agreement and speed.

Each case is one batch of cost matrices with `N` predictions and a random
number of real targets (1..`M`) per matrix, padded to `M` columns with NaN
and marked by `target_mask`, as a DETR train step sees them. Our solver
runs compiled (`tf.function(jit_compile=True)` on TensorFlow, `jax.jit` on
JAX) on the whole batch; scipy runs once per matrix on the real columns.
A matrix agrees when both total costs match (float64 sums of the same
float32 costs, rtol 1e-6).

    python benchmarks/bench_matching.py
    python benchmarks/bench_matching.py --batch 1000 --predictions 20 \
        --targets 20 --repeats 5
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# This checkout's package, whichever one is installed (an installed copy
# elsewhere would be measured otherwise).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from scipy import optimize  # noqa: E402

from keras_attention.matching import linear_sum_assignment  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


def compiled(fn):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if backend == "jax":
        import jax

        return jax.jit(fn)
    return fn


def make_case(rng, kind, batch, predictions, targets):
    shape = (batch, predictions, targets)
    if kind == "uniform":
        cost = rng.random(shape)
    elif kind == "integer":
        # Few distinct values: many optimal assignments tie.
        cost = rng.integers(0, 5, shape).astype("float64")
    elif kind == "wide":
        cost = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 5, shape)
    else:
        raise ValueError(f"unknown kind {kind}")
    cost = cost.astype("float32")
    num_real = rng.integers(1, targets + 1, batch)
    mask = np.arange(targets)[None, :] < num_real[:, None]
    cost = np.where(mask[:, None, :], cost, np.nan).astype("float32")
    return cost, mask, num_real


def run_case(solve, rng, kind, batch, predictions, targets, repeats):
    cost, mask, num_real = make_case(rng, kind, batch, predictions, targets)

    start = time.perf_counter()
    assignment = keras.ops.convert_to_numpy(solve(cost, mask))
    compile_s = time.perf_counter() - start
    ours_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(solve(cost, mask))
        ours_s.append(time.perf_counter() - start)

    scipy_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        reference = [
            optimize.linear_sum_assignment(cost[b, :, : num_real[b]])
            for b in range(batch)
        ]
        scipy_s.append(time.perf_counter() - start)

    agree = 0
    for b in range(batch):
        real = np.arange(num_real[b])
        rows = assignment[b, real]
        valid = (
            rows.min() >= 0
            and len(set(rows.tolist())) == len(real)
            and (assignment[b, num_real[b] :] == -1).all()
        )
        matrix = cost[b, :, : num_real[b]].astype("float64")
        ours = matrix[rows, real].sum() if valid else np.inf
        ref_rows, ref_cols = reference[b]
        theirs = matrix[ref_rows, ref_cols].sum()
        agree += bool(valid and np.isclose(ours, theirs, rtol=1e-6, atol=0))

    ours_ms = 1e3 * float(np.median(ours_s))
    scipy_ms = 1e3 * float(np.median(scipy_s))
    print(
        f"{kind:8s} B={batch} N={predictions} M=1..{targets}: "
        f"agree {agree}/{batch}; ours {ours_ms:.1f} ms "
        f"(compile+first {compile_s:.1f} s), scipy {scipy_ms:.1f} ms, "
        f"ours/scipy {ours_ms / scipy_ms:.2f}x"
    )
    return agree == batch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--kinds", default="uniform,integer,wide", help="comma-separated"
    )
    parser.add_argument(
        "--detr",
        action="store_true",
        help="also run a DETR-sized case: 64 images, 100 queries, "
        "up to 50 targets",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    solve = compiled(linear_sum_assignment)
    print(f"# {describe()}", flush=True)
    print(f"backend {keras.backend.backend()}, {args.repeats} repeats, median")
    ok = True
    for kind in args.kinds.split(","):
        ok &= run_case(
            solve,
            rng,
            kind,
            args.batch,
            args.predictions,
            args.targets,
            args.repeats,
        )
    if args.detr:
        ok &= run_case(solve, rng, "uniform", 64, 100, 50, args.repeats)
    if not ok:
        raise SystemExit("disagreement with scipy")


if __name__ == "__main__":
    main()
