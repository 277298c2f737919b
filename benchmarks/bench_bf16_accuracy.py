"""How close bfloat16 attention comes to float64, per path of the core.

bfloat16 heads keep bfloat16 scores on the dense and chunked paths (the
scores product and the softmax's input rounded to bfloat16, the softmax
accumulating in float32): faster, and less exact for large logits. The
blocked path computes its scores in float32. This prints each path's
error against a float64 NumPy reference on the same bfloat16-rounded
inputs, with `keras.ops.dot_product_attention` beside it.

    python benchmarks/bench_bf16_accuracy.py [--length 256]

Causal self-attention, batch 1, 4 heads of 16; `q` and `k` scaled by
`--scales` (the logits' standard deviation is about `scale**2`: a dot
product of 16 terms has `4 * scale**2`, times `1/sqrt(16)`). Error: max
|out - ref| / max |ref|.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe  # noqa: E402


def reference(q, k, v):
    """Causal softmax attention in float64, `(B, T, H, D)` heads."""
    import numpy as np

    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    t = np.arange(q.shape[1])
    scores = np.where(t[:, None] >= t[None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", weights, v)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 3.0, 6.0])
    args = parser.parse_args()
    import numpy as np
    from keras import ops

    from keras_attention import ops as attention_ops

    print(describe())
    rng = np.random.default_rng(1)
    shape = (1, args.length, 4, 16)
    paths = ["dense", "blocked", "chunked", "auto"]
    print("scale\tlogit std\t" + "\t".join(paths) + "\tkeras.ops")
    for scale in args.scales:
        q, k = (rng.normal(size=shape) * scale for _ in range(2))
        v = rng.normal(size=shape)
        heads = [ops.cast(x, "bfloat16") for x in (q, k, v)]
        rounded = [ops.convert_to_numpy(ops.cast(x, "float32")) for x in heads]
        want = reference(*rounded)
        std = float(np.std(np.einsum("bthd,bshd->bhts", *rounded[:2]) / 4.0))

        def error(out):
            out = ops.convert_to_numpy(ops.cast(out, "float32"))
            return np.abs(out - want).max() / np.abs(want).max()

        errors = [
            error(attention_ops.dot_product_attention(
                *heads, is_causal=True, implementation=path))
            for path in paths
        ]
        errors.append(error(ops.dot_product_attention(*heads, is_causal=True)))
        print(f"{scale}\t{std:.1f}\t" + "\t".join(f"{e:.1e}" for e in errors))


if __name__ == "__main__":
    main()
