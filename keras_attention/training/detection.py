"""The optimizer of DETR's digit recipe (`detr_digits`)."""

import keras


def detr_optimizer(
    total_steps,
    learning_rate=2e-3,
    weight_decay=1e-4,
    clipnorm=1.0,
    warmup_steps=100,
):
    """AdamW with a linear warm-up and a cosine decay to 5 % of the peak.

    The recipe of `benchmarks/bench_detection.py` (the shipped
    `detr_digits` weights): `total_steps` is the steps of the whole epoch
    budget; the global gradient norm is clipped at `clipnorm` (0 or `None`
    for no clipping).
    """
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(total_steps - warmup_steps, 1),
        warmup_target=learning_rate,
        warmup_steps=warmup_steps,
        alpha=0.05,
    )
    return keras.optimizers.AdamW(
        learning_rate=schedule,
        weight_decay=weight_decay,
        global_clipnorm=clipnorm or None,
    )
