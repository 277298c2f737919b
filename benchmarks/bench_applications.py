"""Training throughput of every application: graph, XLA, mixed_bfloat16.

Each application in a small configuration (below) trains with Adam through
`Model.train_on_batch` on a fixed random batch, in four modes built from
the same seed: float32 `tf.function` (`jit_compile=False`), float32 XLA
(`jit_compile=True`), and both again under the `mixed_bfloat16` policy.
After `--warmup` steps (tracing, compilation), the modes are timed
round-robin, `--steps` steps per round, `--rounds` rounds; the table gives
steps per second (median round) and the ratios XLA / graph and bf16 / f32.

    python benchmarks/bench_applications.py
    python benchmarks/bench_applications.py --apps VisionTransformer DETR --rounds 5
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention import applications  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


def images(n, size, classes, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((n, size, size, 1)).astype("float32"),
            rng.integers(0, classes, n).astype("int32"))


def vision_transformer():
    model = applications.VisionTransformer(
        image_size=32, patch_size=4, num_classes=10, hidden_dim=64, depth=2,
        num_heads=4, mlp_dim=128, num_channels=1,
    )
    x, y = images(32, 32, 10)
    return model, x, y


def cbam_resnet():
    model = applications.CBAMResNet(
        image_size=32, num_channels=1, num_classes=10, filters=(16, 32)
    )
    x, y = images(32, 32, 10)
    return model, x, y


def text_classifier():
    model = applications.TextClassifier(
        vocabulary_size=1000, sequence_length=64, num_classes=2, hidden_dim=64,
        depth=2, num_heads=4, mlp_dim=128, dropout=0.1, pooling_units=32,
    )
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 1000, size=(32, 64)).astype("int32")
    ids[::2, 40:] = 0
    return model, ids, (ids[:, 0] % 2).astype("int32")


def gat_node_classifier():
    rng = np.random.default_rng(2)
    nodes, features, edges = 2000, 256, 10000
    x = rng.normal(size=(1, nodes, features)).astype("float32")
    e = rng.integers(0, nodes, size=(1, 2, edges)).astype("int32")
    labels = (np.arange(nodes) % 7).astype("int32")[None]
    model = applications.GATNodeClassifier(
        num_features=features, num_classes=7, hidden_units=8, num_heads=8,
        dropout=0.6,
    )
    return model, [x, e], labels


def _words(n, seed):
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("abcdefgh"), size=int(rng.integers(3, 12))))
            for _ in range(n)]


def seq2seq_translator():
    model = applications.Seq2SeqTranslator(
        applications.TranslationPreprocessor(source_length=16, target_length=16),
        embedding_dim=32, hidden_dim=64,
    )
    words = _words(32, 3)
    x, y = model.prepare(words, words[::-1])
    return model, x, y


def transformer_translator():
    model = applications.TransformerTranslator(
        applications.TranslationPreprocessor(source_length=16, target_length=16),
        num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128,
        dropout=0.1,
    )
    words = _words(32, 3)
    x, y = model.prepare(words, words[::-1])
    return model, x, y


def detr():
    model = applications.DETR(
        num_classes=3, num_queries=10, hidden_dim=32, num_heads=4,
        num_encoder_layers=1, num_decoder_layers=2, feedforward_dim=64,
        backbone_filters=(16, 32),
    )
    rng = np.random.default_rng(4)
    n, size = 8, 32
    x = rng.random((n, size, size, 1)).astype("float32")
    boxes = np.zeros((n, 3, 4), "float32")
    labels = np.full((n, 3), -1, "int32")
    for i in range(n):
        for j in range(i % 4):
            labels[i, j] = int(rng.integers(3))
            boxes[i, j] = [rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), 0.2, 0.2]
    return model, x, {"boxes": boxes, "labels": labels}


APPLICATIONS = {
    "VisionTransformer": vision_transformer,
    "CBAMResNet": cbam_resnet,
    "TextClassifier": text_classifier,
    "GATNodeClassifier": gat_node_classifier,
    "Seq2SeqTranslator": seq2seq_translator,
    "TransformerTranslator": transformer_translator,
    "DETR": detr,
}
MODES = [("f32", False), ("f32", True), ("bf16", False), ("bf16", True)]


def build(name, dtype, jit):
    keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if dtype == "bf16" else "float32"
    )
    try:
        keras.utils.set_random_seed(0)
        model, x, y = APPLICATIONS[name]()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=jit)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    batch = (x[0] if isinstance(x, (list, tuple)) else
             next(iter(x.values())) if isinstance(x, dict) else x).shape[0]

    def step():
        return float(np.asarray(model.train_on_batch(x, y)).reshape(-1)[0])

    return step, batch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--apps", nargs="+", default=list(APPLICATIONS),
                        choices=list(APPLICATIONS))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.warmup < 2:
        # A graph-mode model's second step can still cost seconds once
        # (after other models were built in between): with one warm-up
        # step that cost was timed, and XLA / graph read 33-45x.
        parser.error("--warmup must be at least 2 (the second step can "
                     f"still compile). Received: --warmup {args.warmup}")
    devices = sorted({d.device_type for d in tf.config.list_logical_devices()})
    print(f"# {' '.join(sys.argv)}")
    print(f"# {describe()}; devices {devices}", flush=True)
    rows = []
    for name in args.apps:
        steps, losses, firsts = {}, {}, {}
        for dtype, jit in MODES:
            key = (dtype, jit)
            try:
                step, batch = build(name, dtype, jit)
                start = time.perf_counter()
                for _ in range(args.warmup):
                    losses[key] = step()
                firsts[key] = time.perf_counter() - start
                steps[key] = step
            except Exception as e:  # noqa: BLE001 - report and continue
                print(f"  {name} {dtype} jit={jit}: failed: {type(e).__name__}: "
                      f"{str(e)[:300]}", flush=True)
        rates = {k: [] for k in steps}
        for _ in range(args.rounds):
            for key, step in steps.items():
                start = time.perf_counter()
                for _ in range(args.steps):
                    losses[key] = step()
                rates[key].append(args.steps / (time.perf_counter() - start))
        med = {k: float(np.median(v)) for k, v in rates.items()}
        for key in steps:
            print(f"  {name:<22} {key[0]:<4} jit={key[1]!s:<5} warm-up "
                  f"{firsts[key]:6.1f} s  {med[key]:7.2f} steps/s  loss "
                  f"{losses[key]:.4f}", flush=True)
        rows.append((name, batch, med, firsts))

    print(f"\n# load average at the end: {'%.2f %.2f %.2f' % os.getloadavg()}")
    print("| application | batch | f32 graph steps/s | f32 XLA | bf16 graph "
          "| bf16 XLA | XLA / graph (f32) | bf16 / f32 (best mode each) |")
    print("|" + " --- |" * 8)
    for name, batch, med, firsts in rows:
        def get(k):
            return f"{med[k]:.2f}" if k in med else "failed"

        xla = (f"{med[('f32', True)] / med[('f32', False)]:.2f}"
               if ('f32', True) in med and ('f32', False) in med else "-")
        f32 = max([med[k] for k in med if k[0] == "f32"], default=None)
        bf16 = max([med[k] for k in med if k[0] == "bf16"], default=None)
        ratio = f"{bf16 / f32:.2f}" if f32 and bf16 else "-"
        print(f"| {name} | {batch} | {get(('f32', False))} | {get(('f32', True))} | "
              f"{get(('bf16', False))} | {get(('bf16', True))} | {xla} | {ratio} |")


if __name__ == "__main__":
    main()
