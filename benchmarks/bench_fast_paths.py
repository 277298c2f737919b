"""Each fast path against the simple path it replaces, in one run.

Forward + backward under XLA (`tf.function(jit_compile=True)`), batch 8,
8 heads of 64, self-attention of length `--length`; interleaved rounds,
median wall time:

- the attention core (`keras_attention.ops.dot_product_attention` on
  projected heads): the dense path with autodiff's backward pass
  (`keras_attention.ops.set_dense_custom_gradient(False)`), the dense path with its own backward
  pass (the default), the blocked memory-efficient path, and
  `keras.ops.dot_product_attention`;
- the `MultiHeadAttention` layer with and without the dense core's own
  backward pass, against `keras.layers.MultiHeadAttention` (XLA and
  `tf.function`);
- dropout: one training step of the `TransformerTranslator` `small` preset
  (batch 128, 16 source / 18 target tokens, the vocabulary sizes of the
  Multi30k recipe, synthetic tokens) with Keras's dropout (`keras.layers.
  Dropout` and `keras.random.dropout` on the attention weights), with the
  counter-based `HashDropout` / `hash_dropout` (the default), and with
  dropout 0.

    python benchmarks/bench_fast_paths.py --length 512 --repeats 5
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

from keras_attention import ops as attention_ops  # noqa: E402
from keras_attention.applications import translation_transformer  # noqa: E402
from keras_attention.applications.text_preprocessing import (  # noqa: E402
    TranslationPreprocessor,
)
from keras_attention.applications import TransformerTranslator  # noqa: E402
from keras_attention.applications.blocks import transformer as transformer_blocks  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402
from keras_attention.layers.dropout import HashDropout  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402

KERAS_RANDOM_DROPOUT = keras.random.dropout


def apply_flags(custom=True, dropout="hash"):
    """Sets the module switches (read when a function is traced)."""
    attention_ops.set_dense_custom_gradient(custom)
    if dropout == "keras":
        # The simple path: the backend's generator everywhere.
        translation_transformer.HashDropout = transformer_blocks.HashDropout = (
            lambda rate, seed=None, **kwargs: keras.layers.Dropout(
                rate, seed=seed, **kwargs
            )
        )
        attention_ops.dispatch.hash_dropout = (
            lambda x, rate, seed: KERAS_RANDOM_DROPOUT(x, rate, seed=seed)
        )
    else:
        translation_transformer.HashDropout = HashDropout
        transformer_blocks.HashDropout = HashDropout
        attention_ops.dispatch.hash_dropout = HASH_DROPOUT


HASH_DROPOUT = attention_ops.hash_dropout


def core_case(impl, custom, q, k, v):
    @tf.function(jit_compile=True)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            if impl == "keras":
                out = keras.ops.dot_product_attention(q, k, v)
            else:
                out = attention_ops.dot_product_attention(
                    q, k, v, implementation=impl
                )
            loss = tf.reduce_mean(out**2)
        grads = tape.gradient(loss, [q, k, v])
        return loss + sum(tf.reduce_sum(g[:1, :1]) for g in grads)

    def run():
        apply_flags(custom=custom)
        return float(step(q, k, v))

    return run


def layer_case(kind, custom, x, heads, size, jit=True):
    keras.utils.set_random_seed(0)
    if kind == "keras":
        layer = keras.layers.MultiHeadAttention(heads, size)
        call = lambda t: layer(t, t)  # noqa: E731
    else:
        layer = MultiHeadAttention(heads, size)
        call = layer
    call(x)

    @tf.function(jit_compile=jit)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_mean(call(x) ** 2)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return loss + sum(tf.reduce_sum(tf.reshape(g, [-1])[:1]) for g in grads)

    def run():
        apply_flags(custom=custom)
        return float(step(x))

    return run


def translator_case(dropout_kind, batch=128, lengths=(16, 18)):
    specials = ["[PAD]", "[UNK]", "[START]", "[END]"]
    preprocessor = TranslationPreprocessor.from_config({
        "tokenizer": "word_piece",
        "source_vocabulary": specials + [f"s{i}" for i in range(3038)],
        "target_vocabulary": specials + [f"t{i}" for i in range(3629)],
        "source_length": 33,
        "target_length": 39,
        "lowercase_source": False,
        "character_vocabulary_size": 128,
    })
    kind = "keras" if dropout_kind == "keras" else "hash"
    apply_flags(dropout=kind)
    keras.utils.set_random_seed(0)
    model = TransformerTranslator.from_preset(
        "small", preprocessor=preprocessor,
        dropout=0.0 if dropout_kind == "none" else 0.1,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    x = {
        "source_ids": rng.integers(4, 3000, (batch, lengths[0])).astype("int32"),
        "target_ids": rng.integers(4, 3600, (batch, lengths[1])).astype("int32"),
    }
    y = rng.integers(4, 3600, (batch, lengths[1])).astype("int32")

    def run():
        apply_flags(dropout=kind)  # read when the step is traced
        return model.train_on_batch(x, y)

    return run


def interleaved(cases, repeats):
    times = {name: [] for name in cases}
    for name, run in cases.items():
        start = time.perf_counter()
        run()
        run()
        print(f"  warm-up {name}: {time.perf_counter() - start:.1f} s", flush=True)
    for _ in range(repeats):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def table(title, medians, reference):
    print(f"\n### {title}\n\n| variant | ms (median) | x {reference} |\n| --- | --- | --- |")
    for name, t in medians.items():
        print(f"| {name} | {t * 1000:.1f} | {medians[reference] / t:.2f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sections", nargs="*", default=["core", "layer", "dropout"],
                        choices=["core", "layer", "dropout"])
    args = parser.parse_args(argv)
    b, h, d, length = 8, 8, 64, args.length
    print(f"# {describe()}", flush=True)
    rng = np.random.default_rng(0)
    if "core" in args.sections:
        q, k, v = (tf.constant(rng.normal(size=(b, length, h, d)).astype("float32"))
                   for _ in range(3))
        medians = interleaved({
            "dense, autodiff backward (simple path)": core_case("dense", False, q, k, v),
            "dense, own backward (default)": core_case("dense", True, q, k, v),
            "blocked (memory-efficient)": core_case("blocked", True, q, k, v),
            "keras.ops.dot_product_attention": core_case("keras", True, q, k, v),
        }, args.repeats)
        table(f"Core, length {length}, fwd+bwd, XLA", medians,
              "dense, autodiff backward (simple path)")
    if "layer" in args.sections:
        x = tf.constant(rng.normal(size=(b, length, h * d)).astype("float32"))
        medians = interleaved({
            "ours, autodiff core (simple path)": layer_case("ours", False, x, h, d),
            "ours, own-backward core (default)": layer_case("ours", True, x, h, d),
            "keras MultiHeadAttention, XLA": layer_case("keras", True, x, h, d),
            "keras MultiHeadAttention, tf.function":
                layer_case("keras", True, x, h, d, jit=False),
        }, args.repeats)
        table(f"Layer, length {length}, fwd+bwd", medians,
              "ours, autodiff core (simple path)")
    if "dropout" in args.sections:
        medians = interleaved({
            "keras dropout (simple path)": translator_case("keras"),
            "hash dropout (default)": translator_case("hash"),
            "no dropout": translator_case("none"),
        }, args.repeats)
        table("TransformerTranslator small, one training step (batch 128, "
              "lengths 16/18), XLA", medians, "keras dropout (simple path)")
    apply_flags()


if __name__ == "__main__":
    main()
