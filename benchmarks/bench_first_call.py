"""The first call of a long shape, each in a fresh process: autotune off,
autotune measuring, and autotune taking what an earlier process kept in
its cache file (`set_autotune(cache_file=...)`).

`MultiHeadAttention(8, 64)` forward + backward (every weight's gradient)
in a `tf.function`, batch 8, width 512: the first call's seconds (tracing,
measuring the paths where autotune does, the graph's first run) and the
second call's, with the measured choices each process printed.
BENCHMARKS.md, "Intel Xeon with AMX", "First calls, and measured choices
kept in a file".

    python benchmarks/bench_first_call.py
    python benchmarks/bench_first_call.py --lengths 1024 2048
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in each fresh process; prints one JSON line.
_CHILD = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, {root!r})
import numpy as np
import tensorflow as tf
from keras_attention import ops as attention_ops
from keras_attention.layers import MultiHeadAttention

x = tf.constant(np.random.default_rng(0).standard_normal((8, {length}, 512)),
                "float32")
layer = MultiHeadAttention(8, 64)

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(layer(x, x)))
    return tape.gradient(loss, layer.trainable_variables)

seconds = []
for _ in range(2):
    start = time.perf_counter()
    [g.numpy() for g in step(x)]
    seconds.append(time.perf_counter() - start)
choices = [f"{{c.implementation}} ({{c.reason}})"
           for c in attention_ops.dispatch_choices() if c.timings_ms]
print(json.dumps({{"seconds": seconds, "choices": choices}}))
"""


def first_call(length, environment):
    """`environment`'s `None` values remove a variable: each row sets both
    autotune variables itself, whatever the calling shell exported."""
    env = dict(os.environ, **environment)
    for name, value in environment.items():
        if value is None:
            del env[name]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(root=ROOT, length=length)],
        env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048])
    args = parser.parse_args(argv)
    print(f"# {describe()}")
    print("# MultiHeadAttention(8, 64) forward + backward, batch 8, width 512, "
          "tf.function; each row a fresh process\n")
    print("| T | autotune | first call s | second call s | measured choices |")
    print("| ---: | --- | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for length in args.lengths:
            cache = os.path.join(folder, f"choices-{length}.json")
            rows = (
                ("off", {"KERAS_ATTENTION_AUTOTUNE": "0",
                         "KERAS_ATTENTION_AUTOTUNE_CACHE": None}),
                ("measuring (cache file new)",
                 {"KERAS_ATTENTION_AUTOTUNE": "1",
                  "KERAS_ATTENTION_AUTOTUNE_CACHE": cache}),
                ("cache file of the row above",
                 {"KERAS_ATTENTION_AUTOTUNE": "1",
                  "KERAS_ATTENTION_AUTOTUNE_CACHE": cache}),
            )
            for label, environment in rows:
                result = first_call(length, environment)
                first, second = result["seconds"]
                text = "; ".join(result["choices"]) or "none"
                print(f"| {length} | {label} | {first:.1f} | {second:.2f} | "
                      f"{text} |", flush=True)
    print(f"\n# at the end: {describe()}")


if __name__ == "__main__":
    main()
