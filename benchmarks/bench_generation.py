"""Generation: the key/value cache against recomputing the prefix, and the
ring cache's memory past the window.

`speed`: a `CausalLM` (by default the `causal_lm_dates` architecture
without its window, untrained weights: the speed does not depend on them)
generates `--generated` tokens after a 16-token prompt, batch 1, greedy:

- **cached**: `generate()` — prefill, then one token per step through each
  attention layer's public cache, the whole loop one XLA program;
- **recompute, full buffer**: `generate(use_cache=False)` — the same
  compiled loop, re-running the model on the whole `(1, max_length)`
  buffer every step (fixed shapes, as XLA wants them);
- **recompute, growing prefix**: a Python loop calling the compiled model
  on the prefix so far, padded up to a multiple of 64 (every shape
  compiled before the clock starts), so each step costs about the prefix
  it has: the cheapest recomputation.

Tokens/s count the generated tokens; each mode runs once after a warm-up
call (compilation excluded). All three give the same tokens (checked).

`memory`: the cache of every layer for lengths past the window, with and
without `--window`: its size (exact: layers x 2 x slots x K x D x 4 bytes x
batch) and the process's peak RSS (`ru_maxrss`, each case in its own
subprocess), and the time per generated token.

    python benchmarks/bench_generation.py speed
    python benchmarks/bench_generation.py memory --lengths 1024 4096 8192
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
# This checkout's package, whichever one is installed.
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import machine  # noqa: E402

PROMPT = 16


def make_model(config):
    import keras

    from keras_attention.applications import CausalLM

    keras.utils.set_random_seed(0)
    return CausalLM(**config)


def prompt_ids(batch, vocabulary_size):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(1, vocabulary_size, (batch, PROMPT)).astype("int32")


def timed(function):
    start = time.perf_counter()
    out = function()
    return out, time.perf_counter() - start


def growing_prefix(model, prompt, max_length, bucket=64):
    """Greedy tokens by re-running the model on the prefix at every step."""
    import keras
    import numpy as np
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # one trace per bucket is the plan
    forward = tf.function(lambda x: model(x, training=False), jit_compile=True)
    buffer = np.zeros((len(prompt), max_length), "int32")
    buffer[:, :PROMPT] = prompt

    def run():
        for t in range(PROMPT, max_length):
            width = min(max_length, -(-t // bucket) * bucket)
            logits = keras.ops.convert_to_numpy(forward(buffer[:, :width]))
            buffer[:, t] = np.argmax(logits[:, t - 1], -1)
        return buffer.copy()

    for width in range(bucket, max_length + bucket, bucket):  # compile all
        forward(buffer[:, : min(width, max_length)])
    return run


def speed(args):
    import numpy as np

    config = json.loads(args.config)
    model = make_model(config)
    prompt = prompt_ids(1, config["vocabulary_size"])
    max_length = PROMPT + args.generated
    rows, tokens = [], {}
    def compiled(**kwargs):
        model.generate(prompt, max_length, **kwargs)  # compile
        return lambda: model.generate(prompt, max_length, **kwargs)

    modes = [
        ("cached", compiled()),
        ("recompute, full buffer", compiled(use_cache=False)),
        ("recompute, growing prefix", growing_prefix(model, prompt, max_length)),
    ]
    for name, run in modes:
        out, seconds = timed(run)
        tokens[name] = out
        rows.append((name, seconds, args.generated / seconds))
        print(f"  {name}: {seconds:.2f} s", flush=True)
    same = all(np.array_equal(tokens["cached"], t) for t in tokens.values())
    print(f"\n{args.generated} tokens after a {PROMPT}-token prompt, batch 1, "
          f"greedy; model {config}; same tokens in every mode: {same}\n")
    print("| mode | seconds | tokens/s | cached is faster by |")
    print("|---|---:|---:|---:|")
    cached = rows[0][1]
    for name, seconds, rate in rows:
        print(f"| {name} | {seconds:.2f} | {rate:,.0f} | {seconds / cached:.1f}x |")


def memory_case(length, window, config, batch):
    import numpy as np

    config = dict(config, sliding_window=window)
    model = make_model(config)
    prompt = prompt_ids(batch, config["vocabulary_size"])
    model.generate(prompt, PROMPT + 8)  # build and warm the small shapes
    model.generate(prompt, length)  # compile
    _, seconds = timed(lambda: model.generate(prompt, length))
    cache = model.backbone.empty_cache(batch, length)
    cache_bytes = sum(int(np.prod(c.shape)) * 4 for c in cache)
    return {
        "length": length,
        "window": window,
        "cache_mb": round(cache_bytes / 2**20, 2),
        "ms_per_token": round(1000 * seconds / (length - PROMPT), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def memory(args):
    config = json.loads(args.memory_config)
    print(f"batch {args.batch}, model {config}\n")
    print("| generated length | window | cache of all layers (MB) | "
          "ms / token | peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), env.get("PYTHONPATH")) if p
    )
    for window in (args.window, None):
        for length in args.lengths:
            command = [sys.executable, __file__, "memory", "--case",
                       json.dumps([length, window]), "--batch", str(args.batch),
                       "--memory-config", args.memory_config]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                print(f"| {length} | {window} | failed: "
                      f"{done.stderr.strip()[-300:]} ||||")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {length:,} | {window or 'none'} | {r['cache_mb']} | "
                  f"{r['ms_per_token']} | {r['peak_rss_mb']:,} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("speed", "memory"))
    parser.add_argument("--generated", type=int, default=1024)
    parser.add_argument("--config", default=json.dumps(dict(
        vocabulary_size=128, hidden_dim=64, depth=2, num_heads=4,
        num_key_value_heads=2, mlp_dim=192,
    )))
    parser.add_argument("--memory-config", default=json.dumps(dict(
        vocabulary_size=128, hidden_dim=128, depth=4, num_heads=4,
        mlp_dim=256,
    )))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        length, window = json.loads(args.case)
        result = memory_case(length, window, json.loads(args.memory_config), args.batch)
        print(json.dumps(result))
        return
    print(machine.describe(), flush=True)
    speed(args) if args.what == "speed" else memory(args)


if __name__ == "__main__":
    main()
