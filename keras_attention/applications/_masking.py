"""BERT's masking of a batch of word pieces, drawn from a seed.

BERT's reference recipe (Devlin et al.'s `create_pretraining_data.py`):
each row chooses `min(mask_length, max(1, round(rate * n)))` of its `n`
selectable positions uniformly, and of those 80 % become `[MASK]`, 10 % a
random id (never 0, the padding id here), 10 % stay. keras-hub's `MaskedLMMaskGenerator` (tf.text's
`RandomItemSelector` and `MaskValuesChooser`), used before, draws with
unseeded ops that follow no seed (neither `tf.random.set_seed` nor an op
seed), so masked-LM pretraining never repeated; its counts also differ
(they vary between rows of one length). Here every random number comes
from a stateless op on the batch's seed.
"""

import tensorflow as tf


def bert_masks(token_ids, seed, mask_token_id, vocabulary_size, rate, mask_length,
               unselectable_ids):
    """The masked batch of `token_ids` `(B, T)` for the seed `(2,)`.

    Returns:
        `(masked token ids (B, T), mask_positions (B, L), mask_ids (B, L),
        mask_weights (B, L))`, `L = mask_length`: the chosen positions in
        increasing order, their original ids and 1.0, then 0 (0.0) padding.
    """
    token_ids = tf.convert_to_tensor(token_ids, tf.int32)
    select_seed, value_seed, random_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3)
    )
    length = tf.shape(token_ids)[1]
    unselectable = tf.constant(list(unselectable_ids) or [-1], tf.int32)
    selectable = tf.reduce_all(
        token_ids[:, :, None] != unselectable[None, None, :], axis=-1
    )
    count = tf.reduce_sum(tf.cast(selectable, tf.float32), axis=-1)
    chosen = tf.cast(tf.maximum(tf.round(count * rate), 1.0), tf.int32)
    chosen = tf.minimum(chosen, tf.minimum(tf.cast(count, tf.int32), mask_length))
    # Random scores, the selectable positions' above all others: the top
    # `chosen` of a row are a uniform draw of its selectable positions.
    scores = tf.random.stateless_uniform(tf.shape(token_ids), select_seed)
    scores = tf.where(selectable, scores, -1.0)
    top = tf.minimum(mask_length, length)
    _, order = tf.math.top_k(scores, k=top)
    keep = tf.range(top)[None, :] < chosen[:, None]
    positions = tf.sort(tf.where(keep, order, length), axis=-1)
    positions = tf.pad(positions, [[0, 0], [0, mask_length - top]],
                       constant_values=length)
    weights = positions < length
    positions = tf.where(weights, positions, 0)
    mask_ids = tf.where(weights, tf.gather(token_ids, positions, batch_dims=1), 0)
    # 80 % [MASK], 10 % a random id, 10 % kept.
    draw = tf.random.stateless_uniform(tf.shape(positions), value_seed)
    # A random id is never 0: the encoder reads id 0 as padding and would
    # hide the piece from every other position (BERT's `[PAD]` stays seen,
    # its attention mask being its own input).
    random_ids = tf.random.stateless_uniform(
        tf.shape(positions), random_seed, minval=1,
        maxval=tf.maximum(vocabulary_size, 2), dtype=tf.int32,
    )
    values = tf.where(
        draw < 0.8, mask_token_id, tf.where(draw < 0.9, random_ids, mask_ids)
    )
    rows = tf.broadcast_to(tf.range(tf.shape(positions)[0])[:, None], tf.shape(positions))
    indices = tf.boolean_mask(tf.stack([rows, positions], axis=-1), weights)
    masked = tf.tensor_scatter_nd_update(
        token_ids, indices, tf.boolean_mask(values, weights)
    )
    return masked, positions, mask_ids, tf.cast(weights, tf.float32)
