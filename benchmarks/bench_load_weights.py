"""What the all-or-nothing `load_weights` costs: time and peak memory.

The applications' `load_weights` (`keras_attention._weights.
AllOrNothingWeights`) copies every variable, the optimizer's included, to
NumPy before keras loads the file, so that a failing load can put them
back. This measures that copy against keras's own `Model.load_weights` on
the same model and file: a ViT-Base-sized `VisionTransformer` (86 M
weights at the defaults below) compiled with Adam and trained one step,
so its file holds the optimizer's two moments too.

    python benchmarks/bench_load_weights.py [--hidden-dim 768 --depth 12]

Each variant runs in its own process (the peak resident memory of a
process only grows): the time of a call, best of `--repeats` after a first
one, and the growth of the process's peak resident memory over all of
them (the first included: keras's own first-use costs are in both).
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's package, not an installed one

from machine import describe  # noqa: E402


def _peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(args):
    import numpy as np

    from keras_attention.applications import VisionTransformer

    model = VisionTransformer(
        image_size=args.image_size,
        patch_size=args.patch_size,
        num_classes=10,
        hidden_dim=args.hidden_dim,
        depth=args.depth,
        num_heads=args.hidden_dim // 64,
        mlp_dim=4 * args.hidden_dim,
    )
    images = np.zeros((2, args.image_size, args.image_size, 3), "float32")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(images, np.zeros((2,), "int32"), epochs=1, verbose=0)
    return model


def measure(args):
    import keras

    model = build(args)
    count = sum(int(v.numpy().size) for v in model.variables)
    count += sum(int(v.numpy().size) for v in model.optimizer.variables)
    load = (
        model.load_weights
        if args.variant == "ours"
        else lambda path: keras.Model.load_weights(model, path)
    )
    before = _peak_mib()
    load(args.file)  # a first call: keras's own first-use costs
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        load(args.file)
        times.append(time.perf_counter() - start)
    print(
        f"{args.variant}\t{count / 1e6:.1f}\t{min(times) * 1000:.0f}\t"
        f"{_peak_mib() - before:.0f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--patch-size", type=int, default=16)
    parser.add_argument("--hidden-dim", type=int, default=768)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", choices=("ours", "keras"))
    parser.add_argument("--file")
    args = parser.parse_args()
    if args.hidden_dim < 64 or args.hidden_dim % 64:
        parser.error("--hidden-dim must be a multiple of 64 (heads of 64). "
                     f"Received: --hidden-dim {args.hidden_dim}")
    if args.variant:
        return measure(args)
    print(describe())
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "vit.weights.h5")
        build(args).save_weights(path)
        size = os.path.getsize(path) / 2**20
        print(f"file {size:.0f} MiB (weights and Adam's moments)")
        print("load_weights\tmillion values\tms (best)\tpeak RSS growth MiB")
        for variant in ("keras", "ours"):
            command = [sys.executable, __file__, "--variant", variant]
            command += ["--file", path, "--repeats", str(args.repeats)]
            for name in ("image_size", "patch_size", "hidden_dim", "depth"):
                command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
