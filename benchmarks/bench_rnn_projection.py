"""The RNN translator's training step with and without the key projection
done once per sentence (`AdditiveAttention.project_key`).

`Seq2SeqTranslator` small on Multi30k shapes (batch 64, source 33 and target
39 word pieces, XLA): "before" drops `projected_key` from the encoder's
output, so the attention projects the encoder states again at each of the
39 decoder steps; "now" is the library as it is. Three interleaved rounds of
three `train_on_batch` steps each; median wall and CPU time per step.

    python benchmarks/bench_rnn_projection.py \
        --preprocessor OUT/multi30k_preprocessor.json --data PATH/multi30k

(`bench_translation.py multi30k` writes the preprocessor file.) Measured on
an idle 2-core machine: 2.20 s before, 1.92 s now (1.15x); a second
run 3.09 s and 2.50 s (1.24x).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# This checkout's package, whichever one is installed (an installed copy
# elsewhere would be measured otherwise).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention.applications.text_preprocessing import (  # noqa: E402
    TranslationPreprocessor,
)
from keras_attention.applications import Seq2SeqTranslator  # noqa: E402
from keras_attention.applications.translation import load_translation_corpus  # noqa: E402
from keras_attention.training import cpu_seconds  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


class PerStepProjection(Seq2SeqTranslator):
    """The translator as it was: no key projection shared across steps."""

    def encode(self, source_ids, training=False):
        encoded = super().encode(source_ids, training)
        encoded.pop("projected_key", None)
        return encoded


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preprocessor", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)
    with open(args.preprocessor) as f:
        preprocessor = TranslationPreprocessor.from_config(json.load(f))
    b = args.batch_size
    corpus = load_translation_corpus(
        args.data, "en", "de", splits=["train"], max_lines=b * 4
    )
    models = {}
    for name, cls in [("before: per-step projection", PerStepProjection),
                      ("now: projected once", Seq2SeqTranslator)]:
        keras.utils.set_random_seed(0)
        model = cls.from_preset("small", preprocessor=preprocessor)
        model.compile()
        x, y = model.prepare(*corpus["train"])
        start = time.time()
        model.train_on_batch({k: v[:b] for k, v in x.items()}, y[:b])
        print(f"{name}: first step (compilation) {time.time() - start:.1f} s",
              flush=True)
        models[name] = (model, x, y)
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (model, x, y) in models.items():
            for i in range(1, 4):
                rows = slice(b * i, b * (i + 1))
                wall, cpu = time.time(), cpu_seconds()
                model.train_on_batch({k: v[rows] for k, v in x.items()}, y[rows])
                times[name].append((time.time() - wall, cpu_seconds() - cpu))
    medians = {n: np.median(np.array(v), axis=0) for n, v in times.items()}
    for name, (wall, cpu) in medians.items():
        print(f"{name}: median step {wall:.2f} s wall, {cpu:.2f} CPU-s")
    before, now = (medians[n][0] for n in models)
    print(f"speed-up {before / now:.2f}x (load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
