"""Masked-LM pretraining on unlabelled text vs the same model from scratch.

BERT's recipe at small scale on the embedded sentiment task
(`datasets.make_sentiment_task`): per seed, a pool of 3,000 generated
sentences (generator seed 0) is shuffled; its first 1,000 are the labelled
candidates (the first 100 of them for the 100-example setting), the other
2,000 are the unlabelled text (labels dropped) that the masked LM trains on
(`training.pretrain_masked_lm`: 15 % of the word pieces, 80/10/10). The
WordPiece vocabulary comes from the unlabelled text. Then the same
classifier (`TextClassifier`, the `text_sentiment_small` size) is fine-tuned
on the labelled examples twice: from the pretrained backbone
(`with_head(2)`) and from scratch. The epoch kept is the one with the best
validation accuracy (500 sentences of generator seed 2; with 100 examples
the validation loss is lowest in the first epochs, before the model has
learned anything); accuracy is measured
once, on the test split (1,000 sentences of generator seed 1), which no
step before sees. The generator repeats sentences, across seeds too: the
validation sentences leave out the test ones, and the pool both (before
this, 79 of the 1,000 test sentences were also in the pool, and 42 of the
validation ones).

    python benchmarks/bench_pretraining.py            # 5 seeds, 100 and 1,000
    python benchmarks/bench_pretraining.py --quick    # a smoke test
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import machine  # noqa: E402
from keras_attention import datasets  # noqa: E402
from keras_attention.applications import TextClassifier  # noqa: E402
from keras_attention.applications import TextClassifierBackbone  # noqa: E402
from keras_attention.training import KeepBest  # noqa: E402
from keras_attention.training import accuracy  # noqa: E402
from keras_attention.training import pretrain_masked_lm  # noqa: E402

ENCODER = dict(hidden_dim=64, depth=2, num_heads=4, mlp_dim=128, dropout=0.1)


def held_out_splits():
    """`(validation, test)`: 500 sentences of generator seed 2 and 1,000 of
    seed 1. The generator repeats sentences across seeds, so the
    validation split leaves out the test sentences and `split` both."""
    test = datasets.make_sentiment_task(1000, seed=1)
    validation = datasets.make_sentiment_task(500, seed=2, exclude=test[0])
    return validation, test


def split(seed, held_out, pool=3000, labelled=1000):
    """`(labelled texts, labels, unlabelled texts)` of the pool (generator
    seed 0, without a sentence of the `held_out` splits), shuffled by
    `seed`."""
    excluded = [text for texts, _ in held_out for text in texts]
    texts, labels = datasets.make_sentiment_task(pool, seed=0, exclude=excluded)
    order = np.random.default_rng(seed).permutation(pool)
    texts = [texts[i] for i in order]
    labels = labels[order]
    return texts[:labelled], labels[:labelled], texts[labelled:]


def fine_tune(model, x, y, validation, epochs, seed):
    keras.utils.set_random_seed(seed)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    model.fit(
        x, y, batch_size=16 if len(y) <= 100 else 32,
        epochs=epochs if len(y) <= 100 else max(1, epochs // 3),
        validation_data=validation, callbacks=[KeepBest("val_accuracy")],
        verbose=0,
    )
    return model


def run_seed(seed, sizes, args, validation, test):
    labelled_texts, labels, unlabelled = split(seed, (validation, test))
    start = time.perf_counter()
    mlm, history = pretrain_masked_lm(
        unlabelled, vocabulary_size=256, sequence_length=32,
        epochs=args.pretrain_epochs, batch_size=64, seed=seed, verbose=0,
        jit_compile=False, **ENCODER,
    )
    pretrain_seconds = time.perf_counter() - start
    preprocessor = mlm.preprocessor
    x_val, x_test = preprocessor(validation[0]), preprocessor(test[0])
    initial = mlm.backbone.get_weights()
    results = {}
    for size in sizes:
        x, y = preprocessor(labelled_texts[:size]), labels[:size]
        mlm.backbone.set_weights(initial)  # every setting starts pretrained
        keras.utils.set_random_seed(seed)
        pretrained = mlm.with_head(2)
        fine_tune(pretrained, x, y, (x_val, validation[1]), args.epochs, seed)
        keras.utils.set_random_seed(seed)
        scratch = TextClassifier(
            backbone=TextClassifierBackbone(
                preprocessor.vocabulary_size, 32, **ENCODER
            ),
            num_classes=2,
            preprocessor=preprocessor,
        )
        fine_tune(scratch, x, y, (x_val, validation[1]), args.epochs, seed)
        results[size] = (
            accuracy(pretrained, x_test, test[1]),
            accuracy(scratch, x_test, test[1]),
        )
        print(
            f"seed {seed}, {size} labelled: pretrained {results[size][0]:.4f}, "
            f"scratch {results[size][1]:.4f}",
            flush=True,
        )
    masked = history.history["accuracy"][-1]
    print(
        f"seed {seed}: masked-LM accuracy {masked:.3f} after "
        f"{args.pretrain_epochs} epochs on {len(unlabelled)} texts "
        f"({pretrain_seconds:.0f} s)",
        flush=True,
    )
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument(
        "--epochs", type=int, default=30,
        help="fine-tuning epochs with 100 examples (a third with 1,000)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.pretrain_epochs, args.epochs = 1, 1, 2
    print(machine.describe(), flush=True)
    validation, test = held_out_splits()
    start = time.perf_counter()
    runs = [run_seed(s, args.sizes, args, validation, test) for s in range(args.seeds)]
    print(
        f"\n| labelled examples | from scratch | masked-LM pretrained |\n"
        f"|---|---|---|"
    )
    for size in args.sizes:
        pretrained = np.array([r[size][0] for r in runs])
        scratch = np.array([r[size][1] for r in runs])
        print(
            f"| {size} | {scratch.mean():.3f} ± {scratch.std():.3f} | "
            f"{pretrained.mean():.3f} ± {pretrained.std():.3f} |"
        )
    print(
        f"\n{args.seeds} seeds (mean ± std), test split of 1,000 sentences; "
        f"{(time.perf_counter() - start) / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
