"""Sampled GAT training at scale: generated graphs of 10^4 to 10^6 nodes.

For each size, in a fresh process (so that its peak memory is its own):
`make_graph` (degree-corrected SBM, average in-degree 20, 128 features,
8 classes), then the GAT paper's model (`GATNodeClassifier`: 8 heads x 8,
one output head) trained for one epoch over the training nodes with
neighbour sampling (fan-outs 10, 10; batches of 1,024 seeds; every batch
padded to one shape, so `fit` traces one step; the compile default,
`jit_compile="auto"`, is graph mode without XLA on a CPU), then layer-wise inference
over every node. Reported: graph generation time, sampler throughput alone
(seeds/s over one epoch of batches, NumPy), the epoch's wall time
(sampling included, first-step compilation excluded and reported
separately), inference time, and the process's peak resident memory.

    python benchmarks/bench_graph_scale.py --sizes 10000 100000 1000000

The training nodes are `--train-fraction` (10 %) of the nodes, about the
share of ogbn-products (8 %).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def pyg_epoch(graph, sampler, seeds, args):
    """One epoch of PyG's `GATConv` model fed by the same NumPy sampler.

    PyG's own `NeighborLoader` needs `pyg-lib` or `torch-sparse`, which
    cannot be installed here; the sub-graphs are those of
    `NeighborSampler` (same fan-outs, batch, seed order), unpadded (eager
    PyTorch takes any shape), so only the model and its training step
    differ: the GAT paper's model as in PyG's examples (`GATConv(F, 8,
    heads=8, dropout=0.6)`, ELU, `GATConv(64, C, heads=1, concat=False,
    dropout=0.6)`, dropout 0.6 on both inputs), Adam 0.005 with weight
    decay 5e-4, cross-entropy on the seed nodes.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv

    torch.manual_seed(0)
    # As many threads as TensorFlow's default (every core): torch's own
    # default is the physical cores, fewer where cores are hyper-threads.
    torch.set_num_threads(os.cpu_count())

    class GAT(torch.nn.Module):
        def __init__(self, features, classes):
            super().__init__()
            self.conv1 = GATConv(features, 8, heads=8, dropout=0.6)
            self.conv2 = GATConv(64, classes, heads=1, concat=False, dropout=0.6)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.6, training=self.training)
            x = F.elu(self.conv1(x, edge_index))
            x = F.dropout(x, p=0.6, training=self.training)
            return self.conv2(x, edge_index)

    model = GAT(graph.features.shape[1], int(graph.num_classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    features = torch.from_numpy(graph.features)
    labels = torch.from_numpy(graph.labels.astype(np.int64))
    order = np.random.default_rng(0).permutation(seeds)

    def step(batch, b):
        sub = sampler.sample(batch, seed=[0, 0, b])
        nodes = torch.from_numpy(sub.nodes)
        edge_index = torch.from_numpy(sub.edges)
        optimizer.zero_grad()
        out = model(features[nodes], edge_index)[: sub.num_seeds]
        loss = F.cross_entropy(out, labels[nodes[: sub.num_seeds]])
        loss.backward()
        optimizer.step()
        return float(loss)

    model.train()
    start = time.perf_counter()
    step(order[: args.batch_size], 0)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for b in range(0, len(order), args.batch_size):
        step(order[b : b + args.batch_size], b // args.batch_size)
    return dict(
        pyg_epoch_s=time.perf_counter() - start,
        pyg_first_step_s=first,
        pyg_threads=torch.get_num_threads(),
        pyg_version=__import__("torch_geometric").__version__,
        torch_version=torch.__version__,
    )


def one_size(num_nodes, args):
    if args.pyg:
        # Before TensorFlow: importing torch_geometric after it crashes
        # (segmentation fault) with TF 2.21 / torch 2.13 here.
        import torch_geometric.nn  # noqa: F401
    import keras
    import numpy as np

    from keras_attention.applications import GATNodeClassifier
    from keras_attention.applications import layerwise_predict
    from keras_attention.applications import masked_accuracy
    from keras_attention.applications import sampled_node_dataset
    from keras_attention.datasets import NeighborSampler
    from keras_attention.datasets import make_graph

    result = dict(num_nodes=num_nodes, load_start=os.getloadavg()[0])
    start = time.perf_counter()
    graph = make_graph(
        num_nodes=num_nodes, avg_degree=20, feature_dim=128, num_classes=8,
        train_fraction=args.train_fraction, val_fraction=0.1, seed=0,
    )
    result["generate_s"] = time.perf_counter() - start
    result["num_edges"] = int(graph.edges.shape[1])
    result["rss_after_graph_gb"] = peak_rss_gb()

    fanouts = args.fanouts
    start = time.perf_counter()
    sampler = NeighborSampler(graph.edges, num_nodes, fanouts)
    result["csr_s"] = time.perf_counter() - start
    seeds = np.flatnonzero(graph.train_mask)
    result["num_seeds"] = len(seeds)
    order = np.random.default_rng(0).permutation(seeds)
    start = time.perf_counter()
    sampled_nodes = 0
    for b in range(0, len(order), args.batch_size):
        sub = sampler.sample(order[b : b + args.batch_size], seed=[0, b])
        sampled_nodes += len(sub.nodes)
    seconds = time.perf_counter() - start
    result["sampler_seeds_per_s"] = len(seeds) / seconds
    result["sampler_epoch_s"] = seconds
    result["mean_sampled_nodes"] = sampled_nodes / -(-len(seeds) // args.batch_size)

    keras.utils.set_random_seed(0)
    model = GATNodeClassifier(num_features=128, num_classes=8)
    model.compile()
    train = sampled_node_dataset(
        graph, seeds, fanouts, batch_size=args.batch_size, seed=0, sampler=sampler
    )
    # The first step traces (and compiles, where "auto" means XLA): timed
    # on its own.
    first = train.take(1)
    start = time.perf_counter()
    model.fit(first, epochs=1, verbose=0)
    result["first_step_s"] = time.perf_counter() - start
    start = time.perf_counter()
    history = model.fit(train, epochs=1, verbose=0)
    result["epoch_s"] = time.perf_counter() - start
    result["steps"] = int(train.cardinality())
    result["train_accuracy"] = float(history.history["accuracy"][-1])
    result["rss_after_training_gb"] = peak_rss_gb()

    if args.pyg:
        result.update(pyg_epoch(graph, sampler, seeds, args))
        result["rss_after_pyg_gb"] = peak_rss_gb()

    if args.inference:
        start = time.perf_counter()
        logits = layerwise_predict(
            model, graph.features, graph.edges, chunk_size=args.chunk_size
        )
        result["inference_s"] = time.perf_counter() - start
        result["test_accuracy"] = masked_accuracy(logits, graph.labels, graph.test_mask)
    result["peak_rss_gb"] = peak_rss_gb()
    result["load_end"] = os.getloadavg()[0]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--fanouts", type=int, nargs="+", default=[10, 10])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--train-fraction", type=float, default=0.1)
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--no-inference", dest="inference", action="store_false")
    parser.add_argument(
        "--pyg", action="store_true",
        help="also one epoch of PyG's GATConv fed by the same sampler",
    )
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_size(args.one, args)), flush=True)
        return
    forwarded = [
        "--fanouts", *map(str, args.fanouts), "--batch-size", str(args.batch_size),
        "--train-fraction", str(args.train_fraction), "--chunk-size", str(args.chunk_size),
    ] + ([] if args.inference else ["--no-inference"]) + (
        ["--pyg"] if args.pyg else []
    )
    print_machine()
    for size in args.sizes:
        completed = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", str(size)] + forwarded,
            capture_output=True, text=True,
        )
        lines = [l for l in completed.stdout.splitlines() if l.startswith("RESULT ")]
        if completed.returncode or not lines:
            print(f"{size}: failed\n{completed.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        print(
            f"N={r['num_nodes']:,} E={r['num_edges']:,} seeds={r['num_seeds']:,}: "
            f"generate {r['generate_s']:.1f} s; sampler {r['sampler_seeds_per_s']:,.0f} "
            f"seeds/s ({r['mean_sampled_nodes']:,.0f} nodes per batch); epoch "
            f"{r['epoch_s']:.1f} s for {r['steps']} steps (+ {r['first_step_s']:.1f} s "
            f"first step); inference {r.get('inference_s', float('nan')):.1f} s; "
            + (
                f"PyG GATConv epoch {r['pyg_epoch_s']:.1f} s (same sampler); "
                if "pyg_epoch_s" in r else ""
            )
            + f"peak RSS {r['peak_rss_gb']:.2f} GB; load {r['load_start']:.1f} -> "
            f"{r['load_end']:.1f}",
            flush=True,
        )
        print("  " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
