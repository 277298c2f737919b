"""GAT on Cora: mini-batch training with neighbour sampling vs full batch.

The same model and recipe as `bench_gat_cora.py` (the GAT paper's: Adam
0.005, dropout 0.6, L2 5e-4, `GATEarlyStopping` with patience 100 on the
validation nodes' loss and accuracy), trained either on the whole graph
each step (full batch) or on sampled sub-graphs (`sampled_node_dataset`:
fan-outs 10, 10, batches of 64 training nodes, PyG `NeighborLoader`
semantics), for several seeds. Validation runs on the whole graph (exact
inference, validation nodes only) after every epoch in both modes; the test
accuracy is computed once, after early stopping restored the weights, on
the test nodes only, by layer-wise inference (`layerwise_predict`, checked
against the full-graph call).

    python benchmarks/bench_gat_minibatch.py --data /work/shared/data/planetoid \
        --seeds 5 --modes full minibatch
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention.applications import GATEarlyStopping  # noqa: E402
from keras_attention.applications import GATNodeClassifier  # noqa: E402
from keras_attention.applications import layerwise_predict  # noqa: E402
from keras_attention.applications import masked_accuracy  # noqa: E402
from keras_attention.applications import node_classification_data  # noqa: E402
from keras_attention.applications import sampled_node_dataset  # noqa: E402
from keras_attention.datasets import load_planetoid  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


def run_seed(graph, data, mode, seed, fanouts, batch_size, max_epochs, patience):
    keras.utils.set_random_seed(seed)
    model = GATNodeClassifier.from_preset("gat_cora")
    model.compile()
    stopper = GATEarlyStopping(patience=patience)
    validation = (data.inputs, data.labels, data.val_weights)
    start = time.perf_counter()
    if mode == "full":
        model.fit(
            data.inputs, data.labels, sample_weight=data.train_weights,
            validation_data=validation, epochs=max_epochs, callbacks=[stopper],
            verbose=0,
        )
    else:
        train = sampled_node_dataset(
            graph, graph.train_mask, fanouts, batch_size=batch_size, seed=seed
        )
        model.fit(
            train, validation_data=validation, epochs=max_epochs,
            callbacks=[stopper], verbose=0,
        )
    seconds = time.perf_counter() - start
    logits = layerwise_predict(model, graph.features, graph.edges, chunk_size=512)
    full = keras.ops.convert_to_numpy(model(data.inputs, training=False))[0]
    assert np.abs(logits - full).max() < 1e-4, np.abs(logits - full).max()
    test = masked_accuracy(logits, graph.labels, graph.test_mask)
    val = masked_accuracy(logits, graph.labels, graph.val_mask)
    epochs = (stopper.stopped_epoch or max_epochs - 1) + 1
    return test, val, epochs, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="/work/shared/data/planetoid")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", default=["full", "minibatch"])
    parser.add_argument("--fanouts", type=int, nargs="+", default=[10, 10])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-epochs", type=int, default=1000)
    parser.add_argument("--patience", type=int, default=100)
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)
    graph = load_planetoid(args.data, "cora", normalize_features=True)
    data = node_classification_data(graph)
    load = os.getloadavg()[0]
    for mode in args.modes:
        tests = []
        cpu = time.process_time()
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            test, val, epochs, seconds = run_seed(
                graph, data, mode, seed, args.fanouts, args.batch_size,
                args.max_epochs, args.patience,
            )
            tests.append(test)
            print(
                f"{mode} seed {seed}: test {test:.4f}, validation {val:.4f}, "
                f"{epochs} epochs, {seconds:.0f} s (load average "
                f"{os.getloadavg()[0]:.1f})",
                flush=True,
            )
        tests = np.array(tests) * 100
        print(
            f"{mode}: test {tests.mean():.2f} +- {tests.std():.2f} % over "
            f"{args.seeds} seeds ({' '.join(f'{t:.2f}' for t in tests)}); "
            f"{time.process_time() - cpu:.0f} CPU s; load average {load:.1f} "
            f"-> {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)",
            flush=True,
        )


if __name__ == "__main__":
    main()
