"""GAT node classification on the Planetoid citation graphs, standard split.

Trains `GATNodeClassifier` (the GAT paper's model and recipe: Adam 0.005,
dropout 0.6 on the layers' inputs, the coefficients and each node's
projected features, L2 5e-4, early stopping with patience 100 on
validation loss and accuracy) over several seeds and prints the mean test accuracy, next to
the paper's figures (Cora 83.0 +- 0.7 %, CiteSeer 72.5 +- 0.7 %).

    python benchmarks/bench_gat_cora.py --data /work/shared/data/planetoid \
        --datasets cora citeseer --seeds 10

The data is read from `--data` (the `ind.<name>.*` files); nothing is
downloaded. `--first-seed` runs a later range of seeds (to split a long
run); each seed's run depends only on its seed.

Each split's accuracy is counted on that split's nodes only (by hand from
the predictions, checked equal to `evaluate` with the split's weights);
early stopping and both restore rules see the validation nodes only.

The figures, each with its command, machine and commit, are in
BENCHMARKS.md ("GAT accuracy on Cora and CiteSeer") and the README's
node-classification table; none are repeated here, where they would go
stale (this docstring quoted the figures of an earlier recipe until
2026-12-05).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention.applications.node_classification import (  # noqa: E402
    GATEarlyStopping,
    GATNodeClassifier,
    node_classification_data,
)
from keras_attention.datasets import load_planetoid  # noqa: E402
from keras_attention.training import cpu_seconds  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402

PAPER = {"cora": (83.0, 0.7), "citeseer": (72.5, 0.7), "pubmed": (79.0, 0.3)}


class BestValidationAccuracy(keras.callbacks.Callback):
    """Keeps the weights of the epoch with the best validation accuracy
    (ties: the lower validation loss): a second restore rule, read from the
    same training run as the paper's (validation nodes only)."""

    def on_train_begin(self, logs=None):
        self.best = (-np.inf, -np.inf)
        self.weights = None
        self.epoch = None

    def on_epoch_end(self, epoch, logs=None):
        key = (logs["val_accuracy"], -logs["val_cross_entropy"])
        if key > self.best:
            self.best, self.weights, self.epoch = key, self.model.get_weights(), epoch


def split_accuracy(model, data, weights):
    """Accuracy on the nodes of one split, from the predictions by hand."""
    logits = keras.ops.convert_to_numpy(model(data.inputs, training=False))[0]
    mask = weights[0] > 0
    return float(np.mean(logits.argmax(-1)[mask] == data.labels[0][mask]))


def run(name, path, seeds, max_epochs, patience, jit_compile, first_seed=0,
        version="v1"):
    graph = load_planetoid(path, name, normalize_features=True)
    data = node_classification_data(graph)
    tests, vals, epochs, times = [], [], [], []
    alt_tests, alt_vals = [], []
    start_cpu, load = cpu_seconds(), os.getloadavg()[0]
    for seed in range(first_seed, first_seed + seeds):
        keras.utils.set_random_seed(seed)
        model = GATNodeClassifier.from_preset(f"gat_{name}", version=version)
        if name == "pubmed":
            model.compile(
                optimizer=keras.optimizers.Adam(0.01), jit_compile=jit_compile
            )
        else:
            model.compile(jit_compile=jit_compile)
        # Stops and restores on the validation nodes only (weighted
        # `val_cross_entropy` and `val_accuracy`); the test nodes are not looked at
        # until the weights are final.
        stopper = GATEarlyStopping(patience=patience)
        by_accuracy = BestValidationAccuracy()
        start = time.perf_counter()
        model.fit(
            data.inputs,
            data.labels,
            sample_weight=data.train_weights,
            validation_data=(data.inputs, data.labels, data.val_weights),
            epochs=max_epochs,
            callbacks=[stopper, by_accuracy],
            verbose=0,
        )
        seconds = time.perf_counter() - start
        accuracy = split_accuracy(model, data, data.test_weights)
        val_accuracy = split_accuracy(model, data, data.val_weights)
        # The compiled metric must say the same (weighted by the test mask).
        logs = model.evaluate(
            data.inputs, data.labels, sample_weight=data.test_weights,
            return_dict=True, verbose=0,
        )
        assert abs(logs["accuracy"] - accuracy) < 1e-6, (logs, accuracy)
        ran = (stopper.stopped_epoch or max_epochs - 1) + 1
        tests.append(accuracy)
        vals.append(val_accuracy)
        # The other restore rule, from the same run.
        model.set_weights(by_accuracy.weights)
        alt_tests.append(split_accuracy(model, data, data.test_weights))
        alt_vals.append(split_accuracy(model, data, data.val_weights))
        epochs.append(ran)
        times.append(seconds)
        print(
            f"{name} {version} seed {seed}: validation {val_accuracy:.4f}, "
            f"test {accuracy:.4f}, {ran} epochs (restored epoch "
            f"{stopper.best_epoch}), {seconds:.1f} s; restored at the best "
            f"validation accuracy (epoch {by_accuracy.epoch}): validation "
            f"{alt_vals[-1]:.4f}, test {alt_tests[-1]:.4f}",
            flush=True,
        )
    tests, vals = np.array(tests) * 100, np.array(vals) * 100
    alt_tests, alt_vals = np.array(alt_tests) * 100, np.array(alt_vals) * 100
    print(
        f"{name} {version}, restored at the best validation accuracy: test "
        f"{alt_tests.mean():.2f} +- {alt_tests.std():.2f} %, validation "
        f"{alt_vals.mean():.2f} +- {alt_vals.std():.2f} %",
        flush=True,
    )
    paper_mean, paper_std = PAPER.get(name, (float("nan"), float("nan")))
    print(
        f"{name} {version}: test {tests.mean():.2f} +- {tests.std():.2f} %, "
        f"validation {vals.mean():.2f} +- {vals.std():.2f} % over {seeds} seeds "
        f"({first_seed}-{first_seed + seeds - 1}) (test min {tests.min():.1f}, "
        f"max {tests.max():.1f}); paper {paper_mean} +- {paper_std} %; mean "
        f"{np.mean(epochs):.0f} epochs, {np.mean(times):.1f} s per run; "
        f"{cpu_seconds() - start_cpu:.0f} CPU s in all, load average "
        f"{load:.1f} -> {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return tests.mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/work/shared/data/planetoid")
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. +seeds-1"
    )
    parser.add_argument("--max-epochs", type=int, default=1000)
    parser.add_argument("--patience", type=int, default=100)
    parser.add_argument("--no-jit", action="store_true")
    parser.add_argument(
        "--version", default="v1", choices=["v1", "v2"],
        help="GAT (v1) or GATv2 (v2) attention in the same model and recipe",
    )
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)
    start, cpu = time.perf_counter(), cpu_seconds()
    load = os.getloadavg()[0]
    for name in args.datasets:
        run(
            name,
            args.data,
            args.seeds,
            args.max_epochs,
            args.patience,
            not args.no_jit,
            args.first_seed,
            args.version,
        )
    print(
        f"total: {time.perf_counter() - start:.0f} s wall, "
        f"{cpu_seconds() - cpu:.0f} s CPU; load average "
        f"{load:.1f} at start, {os.getloadavg()[0]:.1f} at end "
        f"({os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
