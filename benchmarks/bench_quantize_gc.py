"""`quantize("int8")`: keras's, the applications', and after `gc.freeze()`.

Keras runs a full `gc.collect()` each time a layer deletes a variable
(`Layer.__delattr__`), and `quantize` deletes every kernel it replaces. In a
process that has imported TensorFlow (and torch, as the tests do) each
collection walks ~600,000 objects. `gc.freeze()` after the imports moves
them to the permanent generation, which collections skip; the applications'
own `quantize` and the loading of a quantized file do that for their
duration (`keras_attention._config.collections_of_new_objects`).

    python benchmarks/bench_quantize_gc.py [--preset vit_digits]

Prints the machine, then for a fresh model each time: the tracked objects,
one full collection, `keras.Model.quantize` (keras's own, per-kernel
collections over everything), the application's `quantize`, and loading
the quantized `.keras` file; then keras's `quantize` after `gc.freeze()`.
"""

import argparse
import gc
import importlib.util
import os
import sys
import tempfile
import time
import warnings

# This checkout's package, whichever one is installed (an installed copy
# elsewhere would be measured otherwise).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if importlib.util.find_spec("torch") is not None:  # as the tests import it
    import torch  # noqa: F401

from machine import describe  # noqa: E402


def timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main():
    warnings.simplefilter("ignore")  # keras: layers without `quantize`
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="vit_digits")
    args = parser.parse_args()
    from keras_attention.applications import VisionTransformer

    import keras

    print(describe())
    model = VisionTransformer.from_preset(args.preset)
    print(
        f"{len(gc.get_objects()):,} tracked objects, one gc.collect() "
        f"{timed(gc.collect) * 1000:.1f} ms"
    )
    seconds = timed(lambda: keras.Model.quantize(model, "int8"))
    print(f"keras.Model.quantize(model, 'int8'): {seconds:.2f} s")
    model = VisionTransformer.from_preset(args.preset)
    seconds = timed(lambda: model.quantize("int8"))
    print(f"model.quantize('int8') (the application's): {seconds:.2f} s")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "quantized.keras")
        model.save(path)
        seconds = timed(lambda: keras.saving.load_model(path))
    print(f"keras.saving.load_model of the quantized file: {seconds:.2f} s")
    gc.collect()
    gc.freeze()
    model = VisionTransformer.from_preset(args.preset)
    seconds = timed(lambda: keras.Model.quantize(model, "int8"))
    print(
        f"after gc.freeze() ({len(gc.get_objects()):,} tracked objects): "
        f"keras.Model.quantize {seconds:.2f} s"
    )


if __name__ == "__main__":
    main()
