"""A translator's fine-tuning timed by phase: compilation against steady work.

`TransformerTranslator.from_preset("transformer_dates")` fine-tuned on
4,000 generated dates (batch 64, the application's default compile: XLA),
then `evaluate_translations` on 300 held-out dates; each phase twice, so
the first (tracing and compilation) and the second (the work itself) are
told apart. Run it once with `TF_ENABLE_ONEDNN_OPTS=0` and once with `=1`
to see what TensorFlow's oneDNN kernels change on a CPU where TensorFlow
leaves them off (BENCHMARKS.md, "AVX2 only"); the first line says which
ran.

    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/bench_translator_phases.py
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/bench_translator_phases.py
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras_attention  # noqa: E402
import keras  # noqa: E402

from machine import describe  # noqa: E402
from keras_attention.applications import TransformerTranslator  # noqa: E402
from keras_attention.applications import translation  # noqa: E402


def timed(label, fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    print(f"{label}: {time.perf_counter() - wall:.1f} s wall, "
          f"{time.process_time() - cpu:.1f} CPU-s", flush=True)
    return result


def main():
    print(f"# {describe()}")
    print(f"# oneDNN {keras_attention.ops.onednn_status()}")
    keras.utils.set_random_seed(0)
    corpus = translation.load_translation_corpus(
        None, num_train=4000, num_val=300, num_test=300, seed=0
    )
    model = TransformerTranslator.from_preset(
        "transformer_dates", preprocessor=translation.date_task_preprocessor()
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-4, clipnorm=1.0))
    x, y = model.prepare(*corpus["train"])
    for epoch in range(2):
        timed(f"fit epoch {epoch}",
              lambda: model.fit(x, y, epochs=1, batch_size=64, verbose=0))
    sources, references = corpus["test"]
    for run in range(2):
        metrics = timed(
            f"evaluate_translations {run}",
            lambda: model.evaluate_translations(list(sources), list(references)),
        )
    print(f"# metrics {metrics}")


if __name__ == "__main__":
    main()
