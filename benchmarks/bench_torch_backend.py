"""Our MultiHeadAttention on Keras's PyTorch backend against plain torch.

Forward + backward of self-attention, batch 8 (`--batch`), 8 heads of 64 (width 512),
at lengths 512 and 2,048, against the same work written in plain torch: the
same four projections (`nn.Linear`, biases on), `scaled_dot_product_attention`
and the output projection, gradients of the input and of every weight. Both
sides run eagerly (Keras's torch backend runs eagerly) and also under
`torch.compile` for the plain-torch side (its best mode). Timings are
interleaved round-robin in one process; the ratio is ours / plain torch.

    KERAS_BACKEND=torch python benchmarks/bench_torch_backend.py --lengths 512 2048
    KERAS_BACKEND=torch python benchmarks/bench_torch_backend.py --lengths 16384 \
        --batch 1 --repeats 2

The first line names the machine (`benchmarks/machine.py`).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import describe  # noqa: E402

from keras_attention.layers import MultiHeadAttention  # noqa: E402

HEADS, HEAD_DIM = 8, 64
WIDTH = HEADS * HEAD_DIM


class PlainAttention(torch.nn.Module):
    """Projections + SDPA + output projection, as one writes it in torch."""

    def __init__(self):
        super().__init__()
        self.query = torch.nn.Linear(WIDTH, WIDTH)
        self.key = torch.nn.Linear(WIDTH, WIDTH)
        self.value = torch.nn.Linear(WIDTH, WIDTH)
        self.output = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, t, _ = x.shape

        def heads(y):
            return y.view(b, t, HEADS, HEAD_DIM).transpose(1, 2)

        out = torch.nn.functional.scaled_dot_product_attention(
            heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        )
        return self.output(out.transpose(1, 2).reshape(b, t, WIDTH))


def step_function(module, parameters):
    def step(x):
        for p in parameters:
            p.grad = None
        x.grad = None
        out = module(x)
        out.sum().backward()
        return out

    return step


def ours(batch, length):
    layer = MultiHeadAttention(num_heads=HEADS, key_dim=HEAD_DIM)
    layer.build((batch, length, WIDTH))
    parameters = [v.value for v in layer.trainable_variables]
    return step_function(lambda x: layer(x), parameters)


def plain(length, compiled):
    module = PlainAttention()
    forward = torch.compile(module, dynamic=False) if compiled else module
    return step_function(forward, list(module.parameters()))


def interleaved(functions, x, repeats):
    times = {name: [] for name in functions}
    for name, fn in functions.items():  # warm-up (and compilation)
        fn(x)
        fn(x)
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn(x)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 2048])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if keras.backend.backend() != "torch":
        parser.error("run with KERAS_BACKEND=torch")
    print(describe(), flush=True)
    print(f"torch threads {torch.get_num_threads()}; batch {args.batch}, {HEADS} heads of {HEAD_DIM}")
    print("| length | ours (Keras torch backend) ms | plain torch eager ms | "
          "plain torch compiled ms | ours / best plain |")
    print("| --- | --- | --- | --- | --- |")
    for length in args.lengths:
        torch.manual_seed(0)
        x = torch.randn(args.batch, length, WIDTH, requires_grad=True)
        functions = {"ours": ours(args.batch, length), "eager": plain(length, False)}
        if not args.no_compile:
            functions["compiled"] = plain(length, True)
        result = interleaved(functions, x, args.repeats)
        best = min(v for k, v in result.items() if k != "ours")
        compiled = f"{result['compiled'] * 1e3:.1f}" if "compiled" in result else "-"
        print(
            f"| {length} | {result['ours'] * 1e3:.1f} | {result['eager'] * 1e3:.1f} | "
            f"{compiled} | {result['ours'] / best:.2f}x |",
            flush=True,
        )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
