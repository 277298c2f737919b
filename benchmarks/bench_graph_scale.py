"""Sampled GAT training at scale: generated graphs of 10^4 to 10^6 nodes.

For each size, in a fresh process (so that its peak memory is its own):
`make_graph` (degree-corrected SBM, average in-degree 20, 128 features,
8 classes), then the GAT paper's model (`GATNodeClassifier`: 8 heads x 8,
one output head) trained for one epoch over the training nodes with
neighbour sampling (fan-outs 10, 10; batches of 1,024 seeds; every batch
padded to one shape, so XLA compiles one step), then layer-wise inference
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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def one_size(num_nodes, args):
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
    # The first step compiles (XLA): timed on its own.
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
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_size(args.one, args)), flush=True)
        return
    forwarded = [
        "--fanouts", *map(str, args.fanouts), "--batch-size", str(args.batch_size),
        "--train-fraction", str(args.train_fraction), "--chunk-size", str(args.chunk_size),
    ] + ([] if args.inference else ["--no-inference"])
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
            f"peak RSS {r['peak_rss_gb']:.2f} GB; load {r['load_start']:.1f} -> "
            f"{r['load_end']:.1f}",
            flush=True,
        )
        print("  " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
