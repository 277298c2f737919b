"""Translation with attention: what the two translators share.

`Translator` is the base of `Seq2SeqTranslator` (recurrent encoder-decoder
with additive attention, Bahdanau et al. 2015; `translation_rnn.py`) and
`TransformerTranslator` (Vaswani et al. 2017; `translation_transformer.py`).
It owns the `TranslationPreprocessor` (keras-hub tokenizers), the default
`compile` (masked cross-entropy, XLA), the presets, and the decoding: greedy
search and beam search on `keras.ops` with a fixed maximum length, compiled
with XLA, with the decoder's cross-attention weights of every generated token
(the searches themselves in `translation_decoding.py`).

A subclass provides four hooks:

- `encode(source_ids, training)`: a dict of encoder tensors, batch first.
- `decode_sequence(target_ids, encoded, training)`: teacher forcing;
  `(logits (B, T, V), cross-attention weights (B, T, S))`.
- `initial_cache(encoded, max_length)`: the decoder's incremental state.
- `decode_step(tokens, index, cache, encoded)`: one generated token from the
  cache; `(logits (B, V), new cache, weights (B, S))`.

Every tensor of `encoded` and of the cache has the batch axis first, so beam
search repeats and reorders them without knowing what they are.
"""


import keras
import numpy as np
from keras import ops

from keras_attention.applications.text_preprocessing import (
    TranslationPreprocessor,
)
from keras_attention.applications.text_preprocessing import corpus_bleu
from keras_attention._validation import check_known_ids
from keras_attention._validation import check_positive_int
from keras_attention._validation import invalid
from keras_attention.applications.compiling import CompileDefaults
from keras_attention.applications.compiling import CompiledLoops
from keras_attention.applications.base import deserialize_preprocessor
from keras_attention.applications.input_checks import InputChecks
from keras_attention._config import ArgumentConfig
from keras_attention._config import DTypeArgument
from keras_attention._config import build_with_graph_state
from keras_attention._config import graph_state_config
from keras_attention.applications.base import PresetMixin
from keras_attention.applications.base import QuickQuantize
from keras_attention.applications.translation_decoding import SearchDecoding
from keras_attention.applications.translation_export import TranslatorExport
from keras_attention.applications.translation_metrics import PaddedTokenLoss
from keras_attention.applications.translation_metrics import TokenAccuracy
from keras_attention.applications.translation_metrics import TokenCrossEntropy



def date_task_preprocessor():
    """The character preprocessor of the date task (`make_date_task`).

    Sources of up to 32 characters (the longest date the generator writes
    has 30), lowercased; targets `YYYY-MM-DD` plus `[END]`.
    """
    return TranslationPreprocessor(
        tokenizer="character",
        source_length=32,
        target_length=11,
        lowercase_source=True,
    )


# What builds a translator for the date task before its weights load.
DATE_TASK_INPUT_SHAPE = {"source_ids": (None, 32), "target_ids": (None, 11)}


def load_translation_corpus(
    path=None,
    src="en",
    tgt="de",
    splits=None,
    max_lines=None,
    num_train=20000,
    num_val=1000,
    num_test=1000,
    seed=0,
):
    """Sentence pairs split by split: the date task, or a corpus folder.

    Args:
        path: `None` for the generated date-normalisation task (no
            download), or a folder of line-aligned `<split>.<src>` /
            `<split>.<tgt>` files such as Multi30k.
        src, tgt: language suffixes of the files.
        splits: split names to read from `path` (all by default).
        max_lines: read at most this many lines per file.
        num_train, num_val, num_test, seed: size and seed of the date task
            (disjoint calendar days per split).

    Returns:
        `{split: (sources, targets)}`; the date task has `"train"`, `"val"`
        and `"test"`.

    Raises:
        FileNotFoundError (also a `ValueError`) naming a missing file, and
        `ValueError` for files with different line counts or empty lines.
    """
    from keras_attention import datasets

    if path is None:
        return datasets.make_date_corpus(
            num_train=num_train, num_val=num_val, num_test=num_test, seed=seed
        )
    return datasets.load_parallel_corpus(
        path, src=src, tgt=tgt, splits=splits, max_lines=max_lines
    )


def _next_power_of_two(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def _check_token_ids(argument, ids, size):
    """Ids `(B, length)` in `[0, size)`, where their values are known (an
    id outside the embedding is a gather error on TensorFlow and a silent
    clamp elsewhere). Float ids pass: keras itself hands the model float32
    ids under a `tf.distribute` strategy."""
    shape = getattr(ids, "shape", None)
    if shape is not None and len(shape) != 2:
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, "
            f"expected token ids (B, length). Received: "
            f"{argument}.shape={tuple(shape)}"
        )
    check_known_ids(
        argument, ids, size, "token ids",
        f"the preprocessor's vocabulary of {size}",
    )


class Translator(
    DTypeArgument, ArgumentConfig, PresetMixin, CompileDefaults, InputChecks,
    SearchDecoding, TranslatorExport, QuickQuantize, PaddedTokenLoss,
    keras.Model,
):
    """Base of the translators: preprocessing, training defaults, decoding.

    Not used directly; see `Seq2SeqTranslator` and `TransformerTranslator`.

    Args:
        preprocessor: a `TranslationPreprocessor` (or its config); defaults
            to `date_task_preprocessor()`.

    Raises:
        ValueError: naming the argument: `preprocessor` not a
            `TranslationPreprocessor`; inputs not `(B, S)` source and
            `(B, T)` target ids in its vocabularies; labels outside the
            target vocabulary; in `translate` and `generate_ids`, a bad
            `search` or decoding settings out of range.
    """

    default_learning_rate = 1e-3

    def __init__(self, preprocessor=None, **kwargs):
        super().__init__(**kwargs)
        if preprocessor is None:
            preprocessor = date_task_preprocessor()
        preprocessor = deserialize_preprocessor(preprocessor)
        if not isinstance(preprocessor, TranslationPreprocessor):
            raise invalid(
                "preprocessor", "a TranslationPreprocessor", preprocessor
            )
        # A plain object, not a layer: its vocabularies travel in the config.
        self.preprocessor = preprocessor
        # Not a dict: Keras and TensorFlow track dict attributes, and a
        # SavedModel cannot hold a dict with tuple keys.
        self._generate_functions = CompiledLoops()

    # Hooks -----------------------------------------------------------------

    def encode(self, source_ids, training=False):
        raise NotImplementedError

    def decode_sequence(self, target_ids, encoded, training=False):
        raise NotImplementedError

    def initial_cache(self, encoded, max_length):
        raise NotImplementedError

    def decode_step(self, tokens, index, cache, encoded):
        raise NotImplementedError

    def prepare_decoding(self, encoded):
        """Hook: add what decoding reuses at every step (cross keys, ...)."""
        return encoded

    @property
    def max_decode_length(self):
        """The longest translation the model can write; `None`: no limit."""
        return None

    # Keras -------------------------------------------------------------------

    @staticmethod
    def _unpack(inputs):
        if isinstance(inputs, dict):
            missing = {"source_ids", "target_ids"} - set(inputs)
            if missing:
                raise ValueError(
                    "Expected the inputs to be a dict with keys 'source_ids' "
                    f"and 'target_ids'. Missing: {sorted(missing)}"
                )
            return inputs["source_ids"], inputs["target_ids"]
        if isinstance(inputs, (list, tuple)) and len(inputs) == 2:
            return inputs[0], inputs[1]
        raise ValueError(
            "Expected the inputs to be {'source_ids': (B, S), 'target_ids': "
            "(B, T)} or a list of the two. Received: "
            + (f"a tensor of shape {tuple(inputs.shape)}"
               if hasattr(inputs, "shape") else f"{type(inputs).__name__}")
        )

    takes_dict_inputs = True  # `InputChecks`: {"source_ids", "target_ids"}

    def check_inputs(self, inputs):
        """`(B, S)` and `(B, T)` ids in the preprocessor's vocabularies,
        checked before any tracing (an id outside an embedding is a gather
        error on TensorFlow and a silent clamp, garbage, on JAX and torch)."""
        source_ids, target_ids = self._unpack(inputs)
        sizes = (
            self.preprocessor.source_vocabulary_size,
            self.preprocessor.target_vocabulary_size,
        )
        for argument, ids, size in zip(
            ("source_ids", "target_ids"), (source_ids, target_ids), sizes
        ):
            _check_token_ids(argument, ids, size)

    def label_ids(self, x):
        """The next target token's id at every position, `(B, T)` as
        `target_ids` (id 0, padding, is ignored by the loss)."""
        try:
            _, target_ids = self._unpack(x)
        except ValueError:  # left to `check_inputs`
            return None
        size = self.preprocessor.target_vocabulary_size
        return (
            tuple(target_ids.shape), size,
            f"the preprocessor's target vocabulary of {size}",
        )

    def call(self, inputs, training=None):
        self.check_inputs(inputs)
        source_ids, target_ids = self._unpack(inputs)
        source_ids = ops.cast(source_ids, "int32")
        target_ids = ops.cast(target_ids, "int32")
        encoded = self.encode(source_ids, training=training)
        logits, _ = self.decode_sequence(target_ids, encoded, training=training)
        return logits

    def cross_attention(self, inputs):
        """Teacher-forced cross-attention weights `(B, T, S)` of a batch
        (its ids checked as `call` checks them)."""
        self.check_inputs(inputs)
        source_ids, target_ids = self._unpack(inputs)
        encoded = self.encode(ops.cast(source_ids, "int32"), training=False)
        _, weights = self.decode_sequence(
            ops.cast(target_ids, "int32"), encoded, training=False
        )
        return weights

    def compile_defaults(self):
        """Adam (`default_learning_rate`, gradient norm clipped at 1),
        cross-entropy on logits that ignores padding (id 0), and over the
        non-padding tokens of the whole evaluation (weighted by
        `sample_weight` when one is given) `TokenAccuracy` and
        `TokenCrossEntropy` (`token_loss`: the per-token `loss`), and XLA."""
        return {
            "optimizer": keras.optimizers.Adam(
                learning_rate=self.default_learning_rate, clipnorm=1.0
            ),
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=0
            ),
            "weighted_metrics": [
                TokenAccuracy(name="token_accuracy"),
                TokenCrossEntropy(name="token_loss"),
            ],
            "jit_compile": True,
        }

    def prepare(self, sources, targets):
        """`(x, labels)` for `fit`/`evaluate` from sentence pairs."""
        return self.preprocessor.encode_pairs(sources, targets)

    def get_config(self):
        config = super().get_config()
        config["preprocessor"] = keras.saving.serialize_keras_object(
            self.preprocessor
        )
        # Frozen and quantized layers, which the constructor does not make
        # again (a quantized translator's file could not load before).
        config.update(graph_state_config(self))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        preprocessor = deserialize_preprocessor(config.pop("preprocessor", None))
        return build_with_graph_state(
            lambda **kwargs: cls(preprocessor=preprocessor, **kwargs), config
        )

    @classmethod
    def from_preset(cls, preset, preprocessor=None, **kwargs):
        """A model of a named size; `kwargs` override the preset's values.

        Args:
            preset: a preset name (see `presets()`), or its short name
                (`"tiny"`, `"small"`).
            preprocessor: a `TranslationPreprocessor`; the date task's by
                default.
        """
        return super().from_preset(preset, preprocessor=preprocessor, **kwargs)

    # Decoding ----------------------------------------------------------------

    def _generate_function(
        self, search, beam_width, max_length, length_penalty, use_cache, jit_compile
    ):
        key = (
            search, beam_width, max_length, float(length_penalty),
            bool(use_cache), bool(jit_compile),
        )

        def generate(source_ids):
            if search == "greedy":
                return self._greedy(source_ids, max_length, use_cache)
            return self._beam_search(
                source_ids, max_length, beam_width, length_penalty, use_cache
            )

        return self._generate_functions.get(
            self, key, lambda: generate, jit_compile
        )

    def generate_ids(
        self,
        source_ids,
        beam_width=1,
        max_length=None,
        length_penalty=0.6,
        use_cache=True,
        search=None,
        jit_compile=True,
    ):
        """Generated target ids `(B, L)` and cross-attention `(B, L, S)`.

        The decoding behind `translate`, on token ids: greedy search for
        `beam_width=1`, beam search otherwise (`search="greedy"` or
        `"beam"` forces one). Positions after `[END]` hold padding. With
        `jit_compile=True` the whole loop is one XLA program (TensorFlow,
        JAX; torch runs it eagerly), compiled once per setting and input
        shape.
        """
        beam_width, max_length = self._check_decoding(
            beam_width, max_length, length_penalty
        )
        if search is None:
            search = "greedy" if beam_width == 1 else "beam"
        if search not in ("greedy", "beam"):
            raise invalid("search", "'greedy', 'beam' or None", search)
        if search == "greedy" and beam_width != 1:
            raise invalid("beam_width", "1 for greedy search", beam_width)
        function = self._generate_function(
            search, beam_width, max_length, length_penalty, use_cache, jit_compile
        )
        if isinstance(source_ids, (list, tuple)):
            source_ids = np.asarray(source_ids)
        dtype = getattr(source_ids, "dtype", None)
        if dtype is not None and "int" not in keras.backend.standardize_dtype(dtype):
            # Cast to int32 below: 4.7 would have been the id 4.
            raise invalid("source_ids", "integer token ids", f"dtype {dtype}")
        _check_token_ids(
            "source_ids", source_ids, self.preprocessor.source_vocabulary_size
        )
        tokens, weights = function(ops.convert_to_tensor(source_ids, "int32"))
        return ops.convert_to_numpy(tokens), ops.convert_to_numpy(weights)

    def _check_decoding(self, beam_width, max_length, length_penalty=0.6):
        beam_width = check_positive_int("beam_width", beam_width)
        # A NaN or infinite exponent made every normalised score NaN, and the
        # search returned an arbitrary beam without an error.
        if isinstance(length_penalty, (bool, np.bool_)) or not isinstance(
            length_penalty, (int, float, np.integer, np.floating)
        ) or not np.isfinite(length_penalty):
            raise invalid("length_penalty", "a finite number", length_penalty)
        limit = self.max_decode_length
        if max_length is None:
            max_length = self.preprocessor.target_length
        max_length = check_positive_int("max_length", max_length)
        if limit is not None and max_length > limit:
            raise invalid(
                "max_length",
                f"at most {limit} (the model's target positions)",
                max_length,
            )
        return beam_width, max_length

    def translate(
        self,
        sentences,
        beam_width=1,
        max_length=None,
        return_attention=False,
        length_penalty=0.6,
        batch_size=64,
        use_cache=True,
        jit_compile=True,
    ):
        """Translates sentences: greedy search, or beam search of `beam_width`.

        Args:
            sentences: a string or a list of non-empty strings. Sentences
                longer than `preprocessor.source_length` tokens are
                truncated with a warning; unknown characters/word pieces are
                read as the unknown token.
            beam_width: 1 for greedy search, `k > 1` for beam search.
            max_length: most tokens to generate, `[END]` included; defaults
                to `preprocessor.target_length`.
            return_attention: also return, per sentence, the decoder's
                cross-attention for every generated token.
            length_penalty: the exponent `alpha` of the length normalisation
                that picks the best finished beam (beam search only).
            batch_size: sentences decoded at once.
            use_cache: decode from the cached decoder state (`True`), or
                re-run the decoder on the whole prefix at every step.
            jit_compile: compile the decoding loop with XLA (TensorFlow,
                JAX);
                `False` runs it eagerly (no compilation; slower per token).

        Returns:
            The translations (a string for a string input, a list
            otherwise). With `return_attention=True`, also a list of dicts
            `{"weights": (generated tokens, source tokens) float32 array,
            "source_tokens": [...], "target_tokens": [...]}` (the generated
            tokens include `[END]` when it was written).
        """
        single = isinstance(sentences, str)
        if single:
            sentences = [sentences]
        batch_size = check_positive_int("batch_size", batch_size)
        self._check_decoding(beam_width, max_length, length_penalty)
        source_ids = self.preprocessor.encode_sources(sentences)
        count = len(source_ids)
        chunk = min(batch_size, _next_power_of_two(max(count, 1)))
        tokens, weights = [], []
        for start in range(0, count, chunk):
            part = source_ids[start : start + chunk]
            padded = np.zeros((chunk, part.shape[1]), "int32")
            padded[: len(part)] = part
            t, w = self.generate_ids(
                padded,
                beam_width,
                max_length,
                length_penalty,
                use_cache,
                jit_compile=jit_compile,
            )
            tokens.append(t[: len(part)])
            weights.append(w[: len(part)])
        if count:
            tokens = np.concatenate(tokens)
            weights = np.concatenate(weights)
        texts = self.preprocessor.decode(tokens) if count else []
        if not return_attention:
            return texts[0] if single else texts
        maps = []
        for i in range(count):
            source_tokens = self.preprocessor.token_strings(
                source_ids[i], source=True
            )
            generated = self._generated_ids(tokens[i])
            maps.append(
                {
                    "weights": weights[i, : len(generated), : len(source_tokens)],
                    "source_tokens": source_tokens,
                    "target_tokens": self.preprocessor.token_strings(
                        generated, source=False
                    ),
                }
            )
        if single:
            return texts[0], maps[0]
        return texts, maps

    def _generated_ids(self, row):
        out = []
        for i in row.tolist():
            if i == self.preprocessor.pad_id:
                break
            out.append(i)
            if i == self.preprocessor.end_id:
                break
        return out

    def evaluate_translations(self, sources, references, beam_width=1, **kwargs):
        """`{"bleu": corpus BLEU, "exact_match": share of exact translations}`.

        `references` holds one string per source, or a list of reference
        strings per source (as `corpus_bleu` takes them): a translation
        equal to any of its references is exact.
        """
        sources, references = list(sources), list(references)
        if len(sources) != len(references):
            raise ValueError(
                "Expected one reference (or list of references) per source. "
                f"Received: len(sources)={len(sources)}, "
                f"len(references)={len(references)}"
            )
        hypotheses = self.translate(sources, beam_width=beam_width, **kwargs)
        exact = float(np.mean([
            h in ([r] if isinstance(r, str) else list(r))
            for h, r in zip(hypotheses, references)
        ])) if hypotheses else 0.0
        return {
            "bleu": corpus_bleu(references, hypotheses),
            "exact_match": exact,
        }
