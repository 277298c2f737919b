"""The Transformer translator decodes exactly as it did before its decoder
used `MultiHeadAttention`'s public key/value cache.

`tests/data/translator_decoding.npz` holds the ids and cross-attention
weights that `generate_ids` gave on main at commit 68509c2 (the decoder
blocks' private `(B, L, K, D)` caches) for two tiny seeded models (plain
multi-head and grouped-query attention), greedy and beam search, eager and
under XLA. The model is rebuilt here from the same seed; nothing is trained.
The grouped-query entries were recorded again once decoding stopped choosing
padding and `[START]` (their old ids held both before `[END]`; the
multi-head entries never did and are unchanged).
"""

import os

import keras
import numpy as np
import pytest

from keras_attention.applications import TransformerTranslator
from keras_attention.applications import TranslationPreprocessor

DATA = os.path.join(os.path.dirname(__file__), "data", "translator_decoding.npz")
SOURCES = ["abc", "hgfe", "a", "dcbabcd"]
MODELS = {"mha": {}, "gqa": {"attention_kwargs": {"num_key_value_heads": 1}}}


def seeded_model(**kwargs):
    keras.utils.set_random_seed(7)
    preprocessor = TranslationPreprocessor(source_length=8, target_length=8)
    config = dict(
        num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32, dropout=0.0
    )
    config.update(kwargs)
    return TransformerTranslator(preprocessor, **config)


@pytest.mark.parametrize("tag", sorted(MODELS))
def test_decoding_equals_the_recorded_private_cache_outputs(tag):
    recorded = np.load(DATA)
    model = seeded_model(**MODELS[tag])
    source_ids = model.preprocessor.encode_sources(SOURCES)
    for beam_width in (1, 3):
        for jit_compile in (False, True):
            key = f"{tag}_beam{beam_width}_{'xla' if jit_compile else 'eager'}"
            ids, weights = model.generate_ids(
                source_ids, beam_width=beam_width, jit_compile=jit_compile
            )
            np.testing.assert_array_equal(ids, recorded[f"{key}_ids"])
            p = model.preprocessor
            for row in ids:  # no padding or [START] before [END]
                end = list(row).index(p.end_id) if p.end_id in row else len(row)
                assert not np.isin(row[:end], (p.pad_id, p.start_id)).any()
            np.testing.assert_allclose(
                weights, recorded[f"{key}_weights"], atol=1e-5
            )
