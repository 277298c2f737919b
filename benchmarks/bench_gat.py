"""GAT on Cora: the time of one training epoch, by dropout implementation.

The GAT paper's Cora model (Veličković et al., 2018): dropout 0.6 on the
inputs, `GraphAttention(8, num_heads=8, activation="elu")` with dropout 0.6
on its coefficients, dropout 0.6, `GraphAttention(7, concat_heads=False)`
with dropout 0.6 on its coefficients; L2 5e-4 (as `l2_loss`, i.e.
`keras.regularizers.L2(2.5e-4)`), Adam with learning rate 0.005, the
cross-entropy of the 140 training nodes. One epoch is one full-graph step
(forward, backward, Adam update) through `Model.train_on_batch`.

The dropout implementations compared:

- `hash`: `HashDropout` on the inputs and the layer's own coefficient
  dropout (`hash_dropout`, a counter-based mask);
- `keras`: `keras.layers.Dropout` on the inputs and `keras.random.dropout`
  on the coefficients (a SeedGenerator and the backend's generator);
- `none`: no dropout at all, the floor.

Each runs as a `tf.function` and compiled with XLA (`jit_compile=True`) on
TensorFlow, `jax.jit` on JAX. The table gives the first step (tracing and
compilation) and the median of `--epochs` steps after `--warmup` more.
With `--train-epochs N` it also trains the `hash` model compiled for N
epochs and reports the test accuracy at the best validation accuracy (the
paper: 83.0 +- 0.7 %).

    python benchmarks/bench_gat.py --data /work/shared/data/planetoid
    python benchmarks/bench_gat.py --skip-dropout-table --pyg   # vs GATConv
    KERAS_ATTENTION_DATA=/work/shared/data/planetoid python benchmarks/bench_gat.py \
        --epochs 20 --train-epochs 300
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# This checkout's package, whichever one is installed (an installed copy
# elsewhere would be measured otherwise).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "--pyg" in sys.argv:
    # torch.compile loads Triton, whose CUDA build crashes the process when
    # TensorFlow was imported first: load it before.
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention.datasets.graphs import load_planetoid  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402
from keras_attention.layers.graph import GraphAttention  # noqa: E402
from keras_attention.layers import HashDropout  # noqa: E402


class KerasDropoutGraphAttention(GraphAttention):
    """GraphAttention with `keras.random.dropout` on its coefficients."""

    def _coefficient_dropout(self, alpha, training):
        if training and self.dropout > 0.0:
            return keras.random.dropout(alpha, self.dropout, seed=self.seed_generator)
        return alpha


def gat_model(graph, dropout="hash", rate=0.6, seed=0):
    """The GAT paper's two-layer Cora model with the given dropout."""
    num_nodes, num_features = graph.features.shape
    features = keras.Input(shape=(num_features,), batch_size=num_nodes)
    edges = keras.Input(shape=(graph.edges.shape[1],), batch_size=2, dtype="int32")
    if dropout == "none":
        rate = 0.0
    layer_class = KerasDropoutGraphAttention if dropout == "keras" else GraphAttention

    def drop(x, offset):
        if rate == 0.0:
            return x
        if dropout == "keras":
            return keras.layers.Dropout(rate, seed=seed + offset)(x)
        return HashDropout(rate, seed=seed + offset)(x)

    l2 = keras.regularizers.L2(2.5e-4)  # 5e-4 * l2_loss = 5e-4 * sum(w^2) / 2
    x = drop(features, 1)
    x = layer_class(
        8, num_heads=8, activation="elu", dropout=rate, seed=seed + 2,
        kernel_regularizer=l2,
    )([x, edges])
    x = drop(x, 3)
    logits = layer_class(
        graph.num_classes, num_heads=1, concat_heads=False, dropout=rate,
        seed=seed + 4, kernel_regularizer=l2,
    )([x, edges])
    model = keras.Model([features, edges], logits)
    return model


def compile_model(model, jit_compile):
    model.compile(
        optimizer=keras.optimizers.Adam(0.005),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"
        ),
        jit_compile=jit_compile,
    )


def time_epochs(model, inputs, labels, weights, warmup, epochs):
    start = time.perf_counter()
    model.train_on_batch(inputs, labels, sample_weight=weights)
    first = time.perf_counter() - start
    for _ in range(warmup):
        model.train_on_batch(inputs, labels, sample_weight=weights)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        loss = model.train_on_batch(inputs, labels, sample_weight=weights)
        float(np.asarray(loss))  # wait for the step
        times.append(time.perf_counter() - start)
    return first, float(np.median(times)), float(np.percentile(times, 25)), float(
        np.percentile(times, 75)
    )


def modes():
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return [("tf.function", False), ("XLA", True)]
    if backend == "jax":
        return [("jax.jit", True)]
    return [("eager", False)]


def device_name():
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    if backend == "jax":
        import jax

        return jax.devices()[0].platform.upper()
    import torch

    return "GPU" if torch.cuda.is_available() else "CPU"


def train_accuracy(graph, inputs, labels, weights, epochs, jit_compile, seed=0):
    keras.utils.set_random_seed(seed)
    model = gat_model(graph, "hash", seed=10 * seed)
    compile_model(model, jit_compile)
    best_val, test_at_best, best_epoch = -1.0, 0.0, 0
    for epoch in range(epochs):
        model.train_on_batch(inputs, labels, sample_weight=weights)
        predicted = np.asarray(model.predict_on_batch(inputs)).argmax(-1)
        correct = predicted == graph.labels
        val = correct[graph.val_mask].mean()
        if val > best_val:
            best_val, best_epoch = val, epoch + 1
            test_at_best = correct[graph.test_mask].mean()
    final_test = correct[graph.test_mask].mean()
    return best_val, test_at_best, best_epoch, final_test


def pyg_epoch_function(graph, seed=0, compiled=False):
    """The same model in PyTorch Geometric (`GATConv`), one epoch per call.

    Sizes, dropout (0.6 on inputs, coefficients and hidden features), ELU,
    Adam 0.005 with weight decay 5e-4 on every parameter (the PyG example's
    recipe); returns a function that runs one full-graph training step and
    returns its loss as a float (which waits for the step). `compiled`:
    the model's forward under `torch.compile` (PyG's recommended way to
    speed it up; the backward follows through AOTAutograd).
    """
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv

    torch.manual_seed(seed)

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            num_features = graph.features.shape[1]
            self.conv1 = GATConv(num_features, 8, heads=8, dropout=0.6)
            self.conv2 = GATConv(64, graph.num_classes, heads=1, concat=False,
                                 dropout=0.6)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.6, training=self.training)
            x = F.elu(self.conv1(x, edge_index))
            x = F.dropout(x, p=0.6, training=self.training)
            return self.conv2(x, edge_index)

    model = GAT()
    forward = torch.compile(model, dynamic=False) if compiled else model
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    x = torch.tensor(graph.features, dtype=torch.float32)
    edge_index = torch.tensor(graph.edges, dtype=torch.long)
    labels = torch.tensor(np.maximum(graph.labels, 0), dtype=torch.long)
    mask = torch.tensor(graph.train_mask)
    model.train()

    def epoch():
        optimizer.zero_grad()
        out = forward(x, edge_index)
        loss = F.cross_entropy(out[mask], labels[mask])
        loss.backward()
        optimizer.step()
        return loss.item()

    return epoch


def compare_with_pyg(graph, inputs, labels, weights, rounds, per_round):
    """Ours (hash dropout, each mode) and PyG's `GATConv`, interleaved.

    Round after round, `per_round` epochs of each implementation in turn,
    so that a change of load falls on all of them alike; medians over all
    the timed epochs.
    """
    import torch

    # As many threads as TensorFlow's default (every core): torch's own
    # default is the physical cores, fewer where cores are hyper-threads.
    torch.set_num_threads(os.cpu_count())
    runners = {}
    for mode, jit_compile in modes():
        keras.utils.set_random_seed(0)
        model = gat_model(graph, "hash")
        compile_model(model, jit_compile)
        model.train_on_batch(inputs, labels, sample_weight=weights)  # compile

        def ours(model=model):
            return float(np.asarray(
                model.train_on_batch(inputs, labels, sample_weight=weights)
            ))

        runners[f"ours, {mode}"] = ours
    for pyg_mode, compiled in (("eager", False), ("torch.compile", True)):
        name = f"PyG GATConv ({pyg_mode})"
        runners[name] = pyg_epoch_function(graph, compiled=compiled)
        for _ in range(3):  # compilation and warm-up outside the timing
            runners[name]()
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            for _ in range(per_round):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    pyg_best = min(
        (name for name in times if name.startswith("PyG")),
        key=lambda name: float(np.median(times[name])),
    )
    pyg = float(np.median(times[pyg_best]))
    print(
        f"\nagainst PyTorch Geometric (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads); {rounds} interleaved rounds of "
        f"{per_round} epochs; ratio = our time / PyG's best mode "
        f"({pyg_best}; target <= 0.6)"
    )
    print(f"{'implementation':<22} {'epoch ms':>9} {'IQR ms':>13} {'/ PyG':>7}")
    for name, values in times.items():
        median = float(np.median(values))
        low, high = np.percentile(values, [25, 75])
        print(
            f"{name:<22} {median * 1e3:>9.1f} {low * 1e3:>6.1f}-{high * 1e3:<6.1f} "
            f"{median / pyg:>6.2f}x",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("KERAS_ATTENTION_DATA", "/work/shared/data/planetoid"),
        help="folder with the Planetoid ind.cora.* files "
        "(default: $KERAS_ATTENTION_DATA or /work/shared/data/planetoid)",
    )
    parser.add_argument("--name", default="cora")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--dropouts", nargs="+", default=["hash", "keras", "none"],
        choices=["hash", "keras", "none"],
    )
    parser.add_argument(
        "--pyg", action="store_true",
        help="also time PyTorch Geometric's GATConv (torch and torch_geometric "
        "installed: the `bench` extra), interleaved with ours",
    )
    parser.add_argument("--pyg-rounds", type=int, default=10)
    parser.add_argument("--skip-dropout-table", action="store_true")
    parser.add_argument("--train-epochs", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="training runs")
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)

    data = args.data
    if os.path.isdir(os.path.join(data, "planetoid")):
        data = os.path.join(data, "planetoid")
    graph = load_planetoid(data, args.name, normalize_features=True)
    num_nodes, num_features = graph.features.shape
    inputs = [
        keras.ops.convert_to_tensor(graph.features),
        keras.ops.convert_to_tensor(graph.edges, "int32"),
    ]
    labels = keras.ops.convert_to_tensor(np.maximum(graph.labels, 0), "int32")
    weights = keras.ops.convert_to_tensor(graph.train_mask.astype("float32"))
    print(
        f"keras {keras.__version__}, backend {keras.backend.backend()} on "
        f"{device_name()}, {os.cpu_count()} CPUs; {args.name}: {num_nodes} nodes, "
        f"{num_features} features, {graph.edges.shape[1]} edges "
        f"(+{num_nodes} self loops), {graph.num_classes} classes; one epoch = "
        f"forward + backward + Adam; median of {args.epochs} after "
        f"{args.warmup} warm-up"
    )
    header = (
        f"{'mode':<12} {'dropout':<8} {'first step s':>12} {'epoch ms':>9} "
        f"{'IQR ms':>13} {'vs hash':>8}"
    )
    print(header)
    print("-" * len(header))
    for mode, jit_compile in [] if args.skip_dropout_table else modes():
        results = {}
        for dropout in args.dropouts:
            keras.utils.set_random_seed(0)
            model = gat_model(graph, dropout)
            compile_model(model, jit_compile)
            first, median, low, high = time_epochs(
                model, inputs, labels, weights, args.warmup, args.epochs
            )
            results[dropout] = median
            ratio = (
                f"{median / results['hash']:>7.2f}x" if "hash" in results else ""
            )
            print(
                f"{mode:<12} {dropout:<8} {first:>12.1f} {median * 1e3:>9.1f} "
                f"{low * 1e3:>6.1f}-{high * 1e3:<6.1f} {ratio:>8}",
                flush=True,
            )
    if args.pyg:
        compare_with_pyg(graph, inputs, labels, weights, args.pyg_rounds, 5)
    if args.train_epochs:
        mode, jit_compile = modes()[-1]
        start = time.perf_counter()
        runs = [
            train_accuracy(
                graph, inputs, labels, weights, args.train_epochs, jit_compile, seed
            )
            for seed in range(args.seeds)
        ]
        for seed, (best_val, test, epoch, final) in enumerate(runs):
            print(
                f"seed {seed}: best validation accuracy {best_val:.3f} at epoch "
                f"{epoch}, test accuracy there {test:.3f} (final {final:.3f})"
            )
        tests = np.array([run[1] for run in runs])
        print(
            f"trained {args.seeds} x {args.train_epochs} epochs ({mode}, hash "
            f"dropout) in {time.perf_counter() - start:.0f} s: test accuracy at "
            f"the best validation epoch {tests.mean():.3f} +- {tests.std():.3f} "
            "(paper: 0.830 +- 0.007 over 100 runs)"
        )


if __name__ == "__main__":
    main()
