"""Translation benchmarks: quality within a time budget, and Bahdanau's plot.

Three experiments, each printing exact figures (and the wall and CPU time it
used, since CPU time is what a shared machine does not steal):

- `dates`: `Seq2SeqTranslator` (additive attention) and
  `TransformerTranslator` trained on the generated date-normalisation task
  for a fixed time budget; exact-match accuracy on held-out dates (new
  calendar days), greedy and beam search. `--evaluate-on validation`
  scores validation dates instead (their own calendar days; the test dates
  are not drawn): tune on those. The shipped date presets' settings
  (`TRANSLATION_RECIPES`) came from runs of this experiment before that
  option existed, which scored the test dates.
- `bahdanau`: the plain RNN encoder-decoder (`attention=None`) against the
  one with additive attention, the same batches and number of steps, on
  examples of 1 to `--max-dates` dates ("d1 ; d2" -> "iso1 iso2", up to
  ~100 characters); exact match and character BLEU by source length, the
  comparison of Bahdanau et al. (2015, figure 2). Writes `bahdanau.png`
  and `bahdanau.json` to `--output`.
- `multi30k`: English->German on Multi30k (`--data`, the folder of
  `train/val/test2016.{en,de}`); BLEU on test2016 (SacreBLEU 13a via
  `keras_hub.metrics.Bleu`, raw cased text). The full recipe trains 45
  minutes per model (`--minutes 45`); targets: >= 30 BLEU (Transformer),
  >= 22 (RNN with attention).

Examples:

```
python benchmarks/bench_translation.py dates --minutes 5
python benchmarks/bench_translation.py bahdanau --steps 800 --output out/
python benchmarks/bench_translation.py multi30k --data shared/data/multi30k \
    --minutes 45 --models transformer rnn
```

The recipe (what `multi30k` does):

- WordPiece vocabularies of 8000 tokens per language, computed from the
  training sentences with `keras_hub.tokenizers.compute_word_piece_vocabulary`
  (cased; the source is not lowercased either), lengths covering 99.5% of
  the training sentences (longer ones are truncated with a warning); cached
  in `--output/multi30k_preprocessor.json`.
- Transformer `small` preset (3+3 pre-norm layers, width 256, 8 heads,
  MLP 1024, dropout 0.1, counter-based dropout masks); Adam (beta_2 0.98,
  clip norm 1), its learning rate warmed up linearly over 400 steps to 1e-3,
  constant, then decayed linearly to zero over the last 30% of the time
  budget (`BudgetLinearDecay`; `--schedule inverse_sqrt` gives Vaswani's
  schedule instead), batch 128,
  trained on length buckets (`MULTI30K_BUCKETS`: the mean sentence is 15
  word pieces, the fixed length 39, so fixed-length batches are mostly
  padding; bucketing cuts the tokens per epoch by 1.8x).
- RNN `small` preset (bidirectional GRU 256 per direction, additive
  attention with 256 units, dropout 0.3); Adam 1e-3, clip norm 1, batch 64,
  fixed-length batches (its decoder loop is unrolled over a static length).
- Train until the time budget is spent, keep the weights of the epoch with
  the best validation loss, decode test2016 with beam search of width 4 and
  length penalty 0.6.
"""

import argparse
import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention.applications.text_preprocessing import (  # noqa: E402
    TranslationPreprocessor,
)
from keras_attention.applications.text_preprocessing import corpus_bleu  # noqa: E402
from keras_attention.applications import Seq2SeqTranslator  # noqa: E402
from keras_attention.applications import TransformerTranslator  # noqa: E402
from keras_attention.applications.translation import date_task_preprocessor  # noqa: E402
from keras_attention.applications.translation import load_translation_corpus  # noqa: E402
from keras_attention.training import InverseSqrt  # noqa: E402
from keras_attention.training import fit_translator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


def exact_match(hypotheses, references):
    return float(np.mean([h == r for h, r in zip(hypotheses, references)]))


def date_models(which, preprocessor):
    models = {}
    if "rnn" in which:
        models["rnn"] = Seq2SeqTranslator.from_preset(
            "tiny", preprocessor=preprocessor
        )
    if "transformer" in which:
        models["transformer"] = TransformerTranslator.from_preset(
            "tiny", preprocessor=preprocessor
        )
    return models


def run_dates(args):
    # Tune on `--evaluate-on validation` (dates on calendar days neither the
    # training nor the test dates use); the test dates are then not drawn.
    validation = args.evaluate_on == "validation"
    corpus = load_translation_corpus(
        num_train=args.num_train,
        num_val=args.num_test if validation else 0,
        num_test=0 if validation else args.num_test,
        seed=0,
    )
    test_sources, test_targets = corpus["val" if validation else "test"]
    print(f"dates: scored on the {args.evaluate_on} split "
          f"({len(test_sources)} dates)", flush=True)
    results = {}
    for name, model in date_models(args.models, date_task_preprocessor()).items():
        keras.utils.set_random_seed(0)
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate[name], clipnorm=1.0),
            steps_per_execution=args.steps_per_execution,
        )
        figures = fit_translator(
            model, corpus["train"], args.minutes, args.batch_size[name], label=name,
            cpu_minutes=args.cpu_minutes,
        )
        for beam_width in (1, 4):
            wall = time.time()
            hypotheses = model.translate(test_sources, beam_width=beam_width)
            figures[f"exact_match_beam{beam_width}"] = round(
                exact_match(hypotheses, test_targets), 4
            )
            figures[f"decode_wall_s_beam{beam_width}"] = round(time.time() - wall, 1)
        wrong = [
            (s, h, t)
            for s, h, t in zip(test_sources, hypotheses, test_targets)
            if h != t
        ][:5]
        figures["examples_wrong"] = wrong
        results[name] = figures
        print(f"[{name}] {json.dumps(figures)}", flush=True)
    return results


def length_buckets(sources, edges):
    lengths = np.array([len(s) for s in sources])
    return [
        (lo, hi, np.nonzero((lengths >= lo) & (lengths < hi))[0])
        for lo, hi in zip(edges[:-1], edges[1:])
    ]


def multi_date_task(num_samples, max_dates, seed, split):
    """1 to `max_dates` dates per example: "d1 ; d2" -> "iso1 iso2".

    The source grows to ~30 characters per date, so a fixed-size summary
    of the source (no attention) must hold more and more information.
    """
    corpus = load_translation_corpus(
        num_train=num_samples * max_dates if split == "train" else 0,
        num_val=0,
        num_test=num_samples * max_dates if split == "test" else 0,
        seed=seed,
    )
    sources, targets = corpus[split]
    rng = np.random.default_rng(seed)
    out_sources, out_targets, position = [], [], 0
    for _ in range(num_samples):
        k = int(rng.integers(1, max_dates + 1))
        out_sources.append(" ; ".join(sources[position : position + k]))
        out_targets.append(" ".join(targets[position : position + k]))
        position += k
    return out_sources, out_targets


def run_bahdanau(args):
    """No attention vs additive attention, by source length.

    Both models see the same batches for the same number of steps
    (`--steps`), on examples of 1 to `--max-dates` dates.
    """
    k = args.max_dates
    train_data = multi_date_task(args.num_train, k, seed=0, split="train")
    test_sources, test_targets = multi_date_task(args.num_test, k, 0, "test")
    preprocessor = TranslationPreprocessor(
        source_length=33 * k, target_length=11 * k, lowercase_source=True
    )
    edges = list(range(0, 33 * k + 20, 20))
    results = {"edges": edges, "max_dates": k, "steps": args.steps, "models": {}}
    for attention in (None, "additive"):
        name = "rnn_attention" if attention else "rnn_no_attention"
        keras.utils.set_random_seed(0)
        model = Seq2SeqTranslator.from_preset(
            "tiny", preprocessor=preprocessor, attention=attention
        )
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate["rnn"], clipnorm=1.0),
            steps_per_execution=args.steps_per_execution,
        )
        batch = args.batch_size["rnn"]
        count = args.steps * batch
        repeats = -(-count // len(train_data[0]))
        data = (
            (train_data[0] * repeats)[:count],
            (train_data[1] * repeats)[:count],
        )
        figures = fit_translator(model, data, 1e9, batch, epochs=1, label=name)
        hypotheses = model.translate(test_sources)
        figures["exact_match"] = exact_match(hypotheses, test_targets)
        # BLEU on characters: an ISO date is one 13a token.
        char = [" ".join(t) for t in test_targets]
        figures["char_bleu"] = corpus_bleu(char, [" ".join(h) for h in hypotheses])
        buckets = []
        for lo, hi, index in length_buckets(test_sources, edges):
            if not len(index):
                continue
            hyp = [hypotheses[i] for i in index]
            ref = [test_targets[i] for i in index]
            buckets.append(
                {
                    "lengths": [lo, hi - 1],
                    "count": int(len(index)),
                    "exact_match": round(exact_match(hyp, ref), 4),
                    "char_bleu": round(
                        corpus_bleu(
                            [" ".join(r) for r in ref], [" ".join(h) for h in hyp]
                        ),
                        2,
                    ),
                }
            )
        figures["by_length"] = buckets
        results["models"][name] = figures
        print(f"[{name}] {json.dumps(figures)}", flush=True)
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, "bahdanau.json"), "w") as f:
        json.dump(results, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for name, figures in results["models"].items():
            xs = [np.mean(b["lengths"]) for b in figures["by_length"]]
            ax.plot(xs, [b["char_bleu"] for b in figures["by_length"]], "o-", label=name)
        ax.set_xlabel("source length (characters)")
        ax.set_ylabel("character BLEU")
        ax.set_title(
            f"1-{k} dates per example, {args.steps} steps each", fontsize=10
        )
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.output, "bahdanau.png"), dpi=120)
        print("wrote", os.path.join(args.output, "bahdanau.png"))
    except ImportError:
        pass
    return results


# (source, target) lengths in word pieces; the last one is replaced by the
# preprocessor's fixed lengths.
MULTI30K_BUCKETS = [(12, 13), (16, 18), (21, 24), (33, 39)]


def run_multi30k(args):
    corpus = load_translation_corpus(
        args.data, "en", "de", splits=["train", "val", "test2016"],
        max_lines=args.max_lines,
    )
    start = time.time()
    cached = os.path.join(args.output, "multi30k_preprocessor.json")
    if os.path.exists(cached):
        with open(cached) as f:
            preprocessor = TranslationPreprocessor.from_config(json.load(f))
    else:
        preprocessor = TranslationPreprocessor.from_corpus(
            *corpus["train"], tokenizer="word_piece", vocabulary_size=8000
        )
        # Fixed lengths cost padding on every batch: cover 99.5% of the
        # training sentences (the rest are truncated, with a warning).
        lengths = {}
        for side, sentences in zip(("source", "target"), corpus["train"]):
            ids = preprocessor._tokenize(sentences, source=side == "source")
            lengths[side] = int(np.percentile([len(t) for t in ids], 99.5))
        preprocessor = TranslationPreprocessor(
            **dict(
                preprocessor.get_config(),
                source_length=lengths["source"],
                target_length=lengths["target"] + 1,
            )
        )
        os.makedirs(args.output, exist_ok=True)
        with open(cached, "w") as f:
            json.dump(preprocessor.get_config(), f)
    print(
        "vocabularies", preprocessor.source_vocabulary_size,
        preprocessor.target_vocabulary_size, "lengths",
        preprocessor.source_length, preprocessor.target_length,
        f"({time.time() - start:.0f} s)", flush=True,
    )
    test_sources, test_references = corpus["test2016"]
    results = {}
    for name in args.models:
        keras.utils.set_random_seed(0)
        saved = os.path.join(args.output, f"multi30k_{name}.keras")
        if args.evaluate_saved:
            # Decode again with a model an earlier `--save` run wrote.
            model = keras.saving.load_model(saved, compile=False)
            figures = {"loaded": saved}
        elif name == "transformer":
            model = TransformerTranslator.from_preset("small", preprocessor=preprocessor)
            if args.schedule == "inverse_sqrt":
                rate = InverseSqrt(args.peak_learning_rate, args.warmup_steps)
            else:
                rate = 0.0  # set before every step by BudgetLinearDecay
            optimizer = keras.optimizers.Adam(rate, beta_2=0.98, clipnorm=1.0)
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=0
            )
            batch_size = 128
        else:
            model = Seq2SeqTranslator.from_preset("small", preprocessor=preprocessor)
            optimizer = keras.optimizers.Adam(1e-3, clipnorm=1.0)
            loss = "auto"
            batch_size = 64
        if not args.evaluate_saved:
            # One step per execution: the bucketed batches change shape.
            model.compile(optimizer=optimizer, loss=loss)
            if args.max_steps:
                count = min(len(corpus["train"][0]), args.max_steps * batch_size)
                corpus["train"] = tuple(side[:count] for side in corpus["train"])
            figures = fit_translator(
                model, corpus["train"], args.minutes, batch_size,
                validation=corpus["val"], keep_best=True, label=name,
                cpu_minutes=args.cpu_minutes,
                # The RNN's decoder loop is unrolled over a static target
                # length (XLA), so it trains on fixed-length batches.
                buckets=None if name == "rnn" else MULTI30K_BUCKETS[:-1]
                + [(preprocessor.source_length, preprocessor.target_length)],
                budget_schedule=(
                    args.peak_learning_rate, args.warmup_steps, args.decay_fraction
                )
                if name == "transformer" and args.schedule == "budget_linear"
                else None,
            )
            figures["schedule"] = (
                f"{args.schedule}(peak={args.peak_learning_rate}, "
                f"warmup={args.warmup_steps}, decay_fraction="
                f"{args.decay_fraction})" if name == "transformer"
                else "constant 1e-3"
            )
            figures["batch_size"] = batch_size
        if args.save and not args.evaluate_saved:
            os.makedirs(args.output, exist_ok=True)
            model.save(saved)
        beam_width, length_penalty = args.beam_width, args.length_penalty
        figures["length_penalty"] = length_penalty
        for width in sorted({1, beam_width}):
            wall = time.time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a few truncated test sentences
                hypotheses = model.translate(
                    test_sources, beam_width=width, length_penalty=length_penalty
                )
            figures[f"decode_wall_s_beam{width}"] = round(time.time() - wall, 1)
            figures[f"test2016_bleu_beam{width}"] = round(
                corpus_bleu(test_references, hypotheses), 2
            )
            print(f"[{name}] beam {width}: BLEU "
                  f"{figures[f'test2016_bleu_beam{width}']}", flush=True)
        figures["examples"] = list(zip(test_sources[:3], hypotheses[:3]))
        results[name] = figures
        print(f"[{name}] {json.dumps(figures)}", flush=True)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiment", choices=["dates", "bahdanau", "multi30k"])
    parser.add_argument("--minutes", type=float, default=5.0,
                        help="wall-clock training budget per model")
    parser.add_argument("--cpu-minutes", type=float, default=None,
                        help="CPU-time budget per model (all threads), for a "
                        "shared machine: 90 = 45 minutes on 2 dedicated cores")
    parser.add_argument("--save", action="store_true",
                        help="multi30k: write each trained model to --output")
    parser.add_argument(
        "--evaluate-saved", action="store_true",
        help="multi30k: no training; decode test2016 with the models a "
        "`--save` run wrote to --output",
    )
    parser.add_argument("--models", nargs="*", default=["rnn", "transformer"])
    parser.add_argument("--num-train", type=int, default=50000)
    parser.add_argument("--num-test", type=int, default=1000,
                        help="dates scored (test or validation)")
    parser.add_argument(
        "--evaluate-on", choices=["test", "validation"], default="test",
        help="dates only: score validation dates (calendar days apart from "
        "training and test) instead of the test dates; tune on this",
    )
    parser.add_argument("--rnn-batch-size", type=int, default=128)
    parser.add_argument("--transformer-batch-size", type=int, default=64)
    parser.add_argument("--steps-per-execution", type=int, default=16)
    parser.add_argument("--rnn-learning-rate", type=float, default=3e-3)
    parser.add_argument("--transformer-learning-rate", type=float, default=2e-3)
    parser.add_argument("--data", default="shared/data/multi30k")
    parser.add_argument("--steps", type=int, default=800, help="bahdanau only")
    parser.add_argument("--max-dates", type=int, default=3, help="bahdanau only")
    parser.add_argument("--max-lines", type=int, default=None)
    parser.add_argument(
        "--max-steps", type=int, default=None,
        help="multi30k: train on at most this many batches per epoch",
    )
    parser.add_argument(
        "--schedule", choices=["budget_linear", "inverse_sqrt"],
        default="budget_linear",
        help="multi30k Transformer: warm-up, constant, then linear decay to "
        "zero as the time budget ends (default), or Vaswani's inverse "
        "square root",
    )
    parser.add_argument("--peak-learning-rate", type=float, default=1e-3,
                        help="multi30k Transformer: the schedule's peak")
    parser.add_argument("--warmup-steps", type=int, default=400,
                        help="multi30k Transformer: linear warm-up steps")
    parser.add_argument(
        "--decay-fraction", type=float, default=0.3,
        help="multi30k Transformer, budget_linear: the final share of the "
        "budget over which the rate decays linearly to zero",
    )
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6,
                        help="the exponent of Wu et al.'s length normalisation")
    parser.add_argument("--output", default="out/translation")
    args = parser.parse_args(argv)
    print(f"# {describe()}", flush=True)
    args.batch_size = {
        "rnn": args.rnn_batch_size,
        "transformer": args.transformer_batch_size,
    }
    args.learning_rate = {
        "rnn": args.rnn_learning_rate,
        "transformer": args.transformer_learning_rate,
    }
    print(
        f"keras {keras.__version__}, backend {keras.backend.backend()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()}",
        flush=True,
    )
    run = {"dates": run_dates, "bahdanau": run_bahdanau, "multi30k": run_multi30k}
    results = run[args.experiment](args)
    print(json.dumps({"experiment": args.experiment, "results": results}, indent=1))


if __name__ == "__main__":
    main()
