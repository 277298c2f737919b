"""Peak memory of a long prompt through the key/value cache, against the
same layer without a cache.

A prompt of `--length` tokens is written into a cache in one call
(`cache_update_index=0`): a full cache of `--length` slots (against the
layer without a cache, "none"), or a ring of `--window` slots
(`sliding_window`; against the windowed layer without a cache, "window");
each position encoding, each case in
its own process (a process's peak resident memory only grows), batch 1,
`--heads` heads of 16, eager TensorFlow.

    python benchmarks/bench_cache_prefill.py [--length 8192 --window 1024]

Prints the machine, then per case the growth of the peak resident memory
during the call and its time (the first call: `auto`'s measurement of the
paths is in it).
"""

import argparse
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402

CASES = [
    (encoding, cache)
    for encoding in ("alibi", "rope")
    for cache in ("none", "full", "window", "ring")
]


def measure(args):
    import numpy as np
    from keras import ops

    from keras_attention.layers import MultiHeadAttention

    ring = args.cache in ("window", "ring")  # the window: no cache
    layer = MultiHeadAttention(
        num_heads=args.heads, key_dim=16, use_causal_mask=True,
        position_encoding=args.encoding,
        sliding_window=args.window if ring else None,
    )
    x = np.random.default_rng(0).random((1, args.length, 32), "float32")
    layer.build(x.shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if args.cache in ("none", "window"):
        layer(x)
    else:
        slots = args.window if ring else args.length
        cache = ops.zeros((1, 2, slots, args.heads, 16))
        layer(x, cache=cache, cache_update_index=0)
    seconds = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20
    print(f"{args.encoding}\t{args.cache}\t{grown:.2f}\t{seconds:.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--encoding")
    parser.add_argument("--cache")
    args = parser.parse_args()
    if args.cache:
        return measure(args)
    print(describe())
    print(f"{args.length} tokens, {args.heads} heads of 16; ring of {args.window}")
    print("encoding\tcache\tpeak growth GiB\tseconds")
    for encoding, cache in CASES:
        command = [sys.executable, __file__, "--encoding", encoding,
                   "--cache", cache, "--length", str(args.length),
                   "--window", str(args.window), "--heads", str(args.heads)]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
