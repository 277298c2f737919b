"""`model.quantize("int8")` before and after `gc.freeze()`.

Keras runs a full `gc.collect()` each time a layer deletes a variable
(`Layer.__delattr__`), and `quantize` deletes every kernel it replaces. In a
process that has imported TensorFlow (and torch, as the tests do) each
collection walks ~600,000 objects. `gc.freeze()` after the imports moves
them to the permanent generation, which collections skip.

    python benchmarks/bench_quantize_gc.py [--preset vit_digits]

Prints the machine, the tracked objects, one full collection and
`quantize` before and after the freeze (a fresh model each time).
"""

import argparse
import gc
import importlib.util
import time

if importlib.util.find_spec("torch") is not None:  # as the tests import it
    import torch  # noqa: F401

from machine import describe  # noqa: E402


def timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="vit_digits")
    args = parser.parse_args()
    from keras_attention.applications import VisionTransformer

    print(describe())
    for frozen in (False, True):
        if frozen:
            gc.collect()
            gc.freeze()
        model = VisionTransformer.from_preset(args.preset)
        collect = timed(gc.collect)
        quantize = timed(lambda: model.quantize("int8"))
        print(
            f"{'after' if frozen else 'before'} gc.freeze(): "
            f"{len(gc.get_objects()):,} tracked objects, one gc.collect() "
            f"{collect * 1000:.1f} ms, quantize('int8') {quantize:.2f} s"
        )


if __name__ == "__main__":
    main()
