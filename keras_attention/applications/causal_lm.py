"""A small decoder-only language model with cached generation.

`CausalLMBackbone` embeds token ids (`keras_hub.layers.ReversibleEmbedding`)
and runs `depth` pre-norm `TransformerEncoderBlock`s whose
`MultiHeadAttention` is causal, with rotary positions (RoPE, default) or
ALiBi, an optional sliding window (Mistral's causal band) and grouped-query
attention (`num_key_value_heads`). `CausalLM` puts the output projection on
it, tied to the embedding or not, as keras-hub's `GPT2CausalLM` does.

`CausalLM.generate` decodes with keras-hub's samplers (greedy, top-k,
top-p, or any `keras_hub.samplers.Sampler`) through the attention layer's
public key/value cache (`cache=`, `cache_update_index=`): the prompt is
prefilled in one call, then the sampler's loop feeds one token per step,
the whole loop one XLA program (TensorFlow, JAX). With a sliding window of `W`
shorter than the generation, each layer's cache is a ring of `W` entries,
so memory stays flat however long the text. `use_cache=False` re-runs the
whole sequence every step instead (the reference the tests and
`benchmarks/bench_generation.py` compare with).
"""

import numbers
import threading
import types

import keras
import numpy as np
from keras import ops

from keras_attention import _validation as base
from keras_attention import registry
from keras_attention.applications import base as app_base
from keras_attention.applications import compiling
from keras_attention.applications import presets
from keras_attention.applications._causal_lm_generation import PAD_ID
from keras_attention.applications._causal_lm_generation import SAMPLERS  # noqa: F401
from keras_attention.applications._causal_lm_generation import CausalLMGeneration
from keras_attention.applications.blocks import TransformerEncoderBlock
from keras_attention.applications.causal_lm_preprocessing import (
    CausalLMPreprocessor,
)
from keras_attention.applications.translation_metrics import PaddedTokenLoss
from keras_attention.applications.translation_metrics import TokenAccuracy
from keras_attention.ops.masks import check_sliding_window

POSITION_ENCODINGS = ("rope", "alibi")


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class CausalLMBackbone(app_base.Backbone):
    """Decoder-only Transformer: token ids to hidden states `(B, T, C)`.

    `ReversibleEmbedding`, `depth` pre-norm `TransformerEncoderBlock`s with
    causal self-attention, a final layer normalization. No position table:
    positions enter the attention (RoPE or ALiBi), so any length runs.

    Args:
        vocabulary_size: number of token ids `V`.
        hidden_dim: token size `C`.
        depth: number of blocks.
        num_heads: query heads `H` (`C // H` per head).
        num_key_value_heads: key/value heads `K` dividing `H` (grouped-query
            attention); `None` for `H`.
        mlp_dim: MLP hidden size; `None` for `4 * C`.
        dropout: dropout rate of the embedding and the blocks.
        sliding_window: if set, position `t` attends to `t - W < s <= t`.
        position_encoding: `"rope"` or `"alibi"`.
        tie_weights: the output projection is the embedding's transpose.
        attention: registry name of the self-attention (`"multi_head"`;
            another layer must take `use_causal_mask`, `position_encoding`,
            `sliding_window`, `num_key_value_heads` and, for cached
            generation, `cache=`).
        attention_kwargs: extra constructor arguments of that layer.

    Raises:
        ValueError: naming the argument: `vocabulary_size`,
            `hidden_dim`, `depth`, `num_heads`, `mlp_dim` or
            `num_key_value_heads` not positive integers; `dropout`
            outside `[0, 1)`; `sliding_window`, `position_encoding` or
            `tie_weights` not one of theirs; an `attention` the registry
            lacks, or whose constructor does not take a causal mask,
            position encodings, a sliding window and key/value heads;
            token ids outside `[0, vocabulary_size)`.

    Example:

    ```python
    backbone = CausalLMBackbone(vocabulary_size=128, hidden_dim=32, depth=2)
    backbone(np.ones((2, 10), "int32")).shape  # (2, 10, 32)
    ```
    """

    scored_blocks = (TransformerEncoderBlock,)

    def __init__(
        self,
        vocabulary_size,
        hidden_dim=64,
        depth=2,
        num_heads=4,
        num_key_value_heads=None,
        mlp_dim=None,
        dropout=0.0,
        sliding_window=None,
        position_encoding="rope",
        tie_weights=True,
        attention="multi_head",
        attention_kwargs=None,
        **kwargs,
    ):
        import keras_hub

        for name in ("vocabulary_size", "hidden_dim", "depth", "num_heads"):
            base.check_positive_int(name, locals()[name])
        base.check_positive_int("mlp_dim", mlp_dim, allow_none=True)
        base.check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        base.check_rate("dropout", dropout)
        check_sliding_window(sliding_window)
        if position_encoding not in POSITION_ENCODINGS:
            raise base.invalid(
                "position_encoding", f"one of {POSITION_ENCODINGS}",
                position_encoding,
            )
        if not isinstance(tie_weights, bool):
            raise base.invalid("tie_weights", "True or False", tie_weights)
        attention = registry.check_name(attention, kinds=("tokens",))
        layer_kwargs = {
            "use_causal_mask": True,
            "position_encoding": position_encoding,
            "sliding_window": sliding_window,
            "num_key_value_heads": num_key_value_heads,
            **(attention_kwargs or {}),
        }
        missing = sorted(
            set(layer_kwargs) - set(registry.accepted_arguments(attention, layer_kwargs))
        )
        if missing:
            raise ValueError(
                "Received an invalid value for argument `attention`, expected "
                "a layer whose constructor takes use_causal_mask, "
                "position_encoding, sliding_window and num_key_value_heads "
                f"(a causal LM's self-attention). Received: attention="
                f"{attention!r}, which does not take {missing}"
            )
        inputs = keras.Input((None,), dtype="int32", name="token_ids")
        embedding = keras_hub.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=tie_weights,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="token_embedding",
        )
        x = embedding(inputs)
        chain = ["token_embedding"]
        if dropout:
            x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
            chain.append("embedding_dropout")
        for index in range(depth):
            x = TransformerEncoderBlock(
                num_heads=num_heads,
                mlp_dim=mlp_dim or 4 * hidden_dim,
                dropout=dropout,
                attention=attention,
                attention_kwargs=layer_kwargs,
                name=f"block_{index}",
            )(x)
            chain.append(f"block_{index}")
        x = keras.layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
        super().__init__(inputs=inputs, outputs=x, **kwargs)
        self.token_embedding = embedding
        self._chain = tuple(chain + ["final_norm"])
        self.keep_config(locals())

    def check_inputs(self, inputs):
        shape = tuple(inputs.shape)
        if len(shape) != 2:
            raise ValueError(
                "Received an invalid value for argument `token_ids`, expected "
                "integer ids of shape (B, T). Received: "
                f"token_ids.shape={shape}"
            )
        # Values known before `fit`, `evaluate` or `predict` trace the model.
        base.check_known_ids(
            "token_ids", inputs, self.vocabulary_size, "token ids",
            f"vocabulary_size={self.vocabulary_size}",
        )

    @property
    def blocks(self):
        return [self.get_layer(f"block_{i}") for i in range(self.depth)]

    def empty_cache(self, batch_size, max_length):
        """Zero key/value caches, one `(B, 2, S, K, D)` per block.

        `S` is `max_length`, or the `sliding_window` `W` when that is
        shorter: the layer then uses the cache as a ring.
        """
        layer = self.blocks[0].attention_layer
        size = max_length
        if self.sliding_window is not None:
            size = min(size, self.sliding_window)
        shape = (batch_size, 2, size, layer.kv_heads, layer.key_dim)
        return tuple(
            ops.zeros(shape, layer.compute_dtype) for _ in range(self.depth)
        )

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Hidden states `(B, T, C)` of tokens at `cache_update_index + t`.

        Each block reads and updates its layer's cache; returns the states
        and the tuple of new caches.
        """
        x = self.token_embedding(token_ids)
        new_cache = []
        for block, layer_cache in zip(self.blocks, cache):
            x, layer_cache = block(
                x, cache=layer_cache, cache_update_index=cache_update_index,
                training=False,
            )
            new_cache.append(layer_cache)
        return self.get_layer("final_norm")(x), tuple(new_cache)


# Generation compiles one loop per bucket of lengths (`generate`).
LENGTH_BUCKET = 16


def _bucket(length, up=False):
    """`length` rounded down (or up) to a multiple of `LENGTH_BUCKET`."""
    steps = -(-length // LENGTH_BUCKET) if up else length // LENGTH_BUCKET
    return steps * LENGTH_BUCKET


def _is_beam(sampler):
    import keras_hub

    return isinstance(sampler, keras_hub.samplers.BeamSampler)


@keras.saving.register_keras_serializable(package=app_base.PACKAGE)
class CausalLM(
    app_base.TaskConfig, app_base.PresetMixin, compiling.CompileDefaults,
    app_base.InputChecks, app_base.QuickQuantize, CausalLMGeneration,
    PaddedTokenLoss, keras.Model,
):
    """Decoder-only language model: `CausalLMBackbone` and next-token logits.

    Trained with `fit(x, y)` on token ids `x` `(B, T)` and the next ids
    `y` (`CausalLMPreprocessor.sequences`); `generate` continues prompts
    with keras-hub's samplers and the attention layers' key/value cache.

    Args:
        backbone: a `CausalLMBackbone`; built from `**backbone_kwargs` when
            `None`.
        preprocessor: an optional `CausalLMPreprocessor` (its config is kept
            in the `.keras` file), for `generate_text`; with it
            `vocabulary_size` defaults to its own.
        **backbone_kwargs: the backbone's arguments (`vocabulary_size`,
            `hidden_dim`, `depth`, `num_heads`, `num_key_value_heads`,
            `mlp_dim`, `dropout`, `sliding_window`, `position_encoding`,
            `tie_weights`, `attention`, `attention_kwargs`), and `name`.

    Call arguments:
        token_ids: int `(B, T)`. Every id is a token here, id 0 too: pad
            a batch of lines on the right (causal attention keeps the
            padding out of the real tokens' logits; `fit` and `evaluate`
            leave padded targets, id 0, out of the loss and accuracy).
            Padding on the left changes the logits (`generate` drops it).

    Returns:
        Logits `(B, T, V)`: position `t` predicts token `t + 1`.

    Raises:
        ValueError: naming the argument: `backbone` not a
            `CausalLMBackbone` (or given with backbone arguments), an
            argument `CausalLMBackbone` does not take, or one it refuses
            (as it checks them); `preprocessor` not a
            `CausalLMPreprocessor`; in `fit` and `evaluate`, next-token
            labels outside `[0, vocabulary_size)`; in `generate`, a
            `sampler` it cannot run (or its settings out of range), empty
            or all-padding `prompt_ids`, or a `max_length` not above the
            longest prompt.

    Example:

    ```python
    model = CausalLM.from_preset("causal_lm_dates")
    model.generate_text("14 july 1989 = ")  # '14 july 1989 = 1989-07-14'
    ids = model.generate(np.array([[50, 32, 109]]), max_length=20,
                         sampler="top_k")  # (1, 20)
    ```

    References:
        - Radford et al., Language Models are Unsupervised Multitask
          Learners, 2019.
        - Su et al., RoFormer (rotary embeddings), 2021.
          https://arxiv.org/abs/2104.09864
        - Jiang et al., Mistral 7B (sliding window, ring cache), 2023.
          https://arxiv.org/abs/2310.06825
    """

    backbone_class = CausalLMBackbone

    def __init__(self, backbone=None, preprocessor=None, **backbone_kwargs):
        # The rest go to keras.Model, whose check (`DTypeArgument`) names
        # an unknown one.
        model_kwargs = {
            k: backbone_kwargs.pop(k)
            for k in list(backbone_kwargs)
            if k not in CausalLMBackbone.config_keys
        }
        preprocessor = app_base.deserialize_preprocessor(preprocessor)
        if preprocessor is not None and not isinstance(
            preprocessor, CausalLMPreprocessor
        ):
            raise base.invalid(
                "preprocessor", "a CausalLMPreprocessor or None", preprocessor
            )
        backbone = self._make_backbone(backbone, preprocessor, backbone_kwargs)
        inputs = backbone.input
        logits = backbone.token_embedding(backbone(inputs), reverse=True)
        super().__init__(inputs=inputs, outputs=logits, **model_kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor
        # A plain object: Keras tracks dict attributes.
        self._generation = types.SimpleNamespace(
            loops=compiling.CompiledLoops(), samplers={}, lock=threading.RLock()
        )

    @classmethod
    def _make_backbone(cls, backbone, preprocessor, kwargs):
        if backbone is not None:
            if isinstance(backbone, dict):
                backbone = keras.layers.deserialize(backbone)
            if not isinstance(backbone, CausalLMBackbone) or kwargs:
                raise ValueError(
                    "Expected a CausalLMBackbone as `backbone`, and no "
                    "backbone arguments with it. Received: "
                    f"backbone={backbone!r}, arguments={sorted(kwargs)}"
                )
            return backbone
        if preprocessor is not None:
            kwargs.setdefault("vocabulary_size", preprocessor.vocabulary_size)
        return app_base.make_backbone(
            cls.__name__, CausalLMBackbone, kwargs, "a `preprocessor` or "
        )

    def compile_defaults(self):
        """AdamW, the next-token cross-entropy from logits and its accuracy,
        both over the targets that are not padding (id 0), weighted by a
        `sample_weight` `(B,)` or `(B, T)` when one is given."""
        return {
            "optimizer": keras.optimizers.AdamW(2e-3, weight_decay=0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=PAD_ID
            ),
            "weighted_metrics": [TokenAccuracy(padding_id=PAD_ID, name="accuracy")],
            "jit_compile": True,
        }

    def check_inputs(self, inputs):
        self.backbone.check_inputs(inputs)

    def label_ids(self, x):
        """The next token's id at every position, `(B, T)` as `x`."""
        shape = tuple(getattr(self._single_input(x), "shape", ()))
        size = self.backbone.vocabulary_size
        return shape, size, f"vocabulary_size={size}"

    def attention_scores(self, token_ids):
        """The causal attention weights `(B, H, T, T)` of every block."""
        return self.backbone.attention_scores(token_ids)

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Logits `(B, T, V)` of tokens at `cache_update_index + t` and the
        updated caches (see `CausalLMBackbone.empty_cache`)."""
        x, cache = self.backbone.call_with_cache(
            token_ids, cache, cache_update_index
        )
        return self.backbone.token_embedding(x, reverse=True), cache

    # Generation --------------------------------------------------------------

    def generate(
        self,
        prompt_ids,
        max_length,
        sampler="greedy",
        stop_token_ids=None,
        use_cache=True,
        jit_compile=True,
    ):
        """Continues token-id prompts to `max_length` ids.

        Args:
            prompt_ids: ids `(P,)`, `(B, P)` (NumPy or a backend tensor),
                or a list of rows of different lengths. Zeros before or
                after a row's ids are padding (left or right) and dropped:
                each output row is its prompt, then its continuation.
            max_length: the total length of each row, prompt included.
            sampler: `"greedy"`, `"top_k"`, `"top_p"`, `"random"` or a
                `keras_hub.samplers.Sampler` (its settings: temperature,
                `k`, `p`, seed; `BeamSampler` too, not `ContrastiveSampler`;
                a beam search runs the prompts of each length on their own,
                so a row's result does not depend on the others').
                A named sampler has keras-hub's defaults (`"top_k"`: k=5;
                `"top_p"`: p=0.1, close to greedy; temperature 1): pass
                e.g. `keras_hub.samplers.TopPSampler(p=0.9)` for others.
                It draws its seed at each call from Python's `random`:
                `keras.utils.set_random_seed` repeats its ids.
            stop_token_ids: ids in `[1, vocabulary_size)` that end a row;
                the ids after the first generated one are 0 (the padding
                id, never generated).
            use_cache: decode through the attention layers' key/value cache
                (one token per step); `False` re-runs the whole sequence
                every step (same tokens, much slower).
            jit_compile: compile the loop with XLA (TensorFlow, JAX; torch
                runs it eagerly), once per batch size, setting and bucket
                of lengths (`max_length` and the shortest prompt in steps
                of `LENGTH_BUCKET`; a beam search per exact lengths). A
                sampler object's settings count, not the object: a new
                `TopPSampler(p=0.9)` at each call reuses the loop (with its
                seed state, which advances as its own would). That holds
                for keras-hub's own sampler classes; an object of another
                class (a subclass of yours) runs as given, in a loop of
                its own.

        Returns:
            int32 ids `(B, max_length)` (`(max_length,)` for a `(P,)`
            prompt), the prompts followed by the generated ids.

        Calls from several threads run one at a time: they share the
        samplers' seed state (each gets the ids it would get alone).
        """
        with self._generation.lock:
            return self._generate(prompt_ids, max_length, sampler,
                                  stop_token_ids, use_cache, jit_compile)

    def _generate(self, prompt_ids, max_length, sampler, stop_token_ids,
                  use_cache, jit_compile):
        given, sampler = sampler, self._sampler(sampler)
        ids, mask, lengths, single = self._check_prompts(prompt_ids, max_length)
        if _is_beam(sampler) and len(set(lengths)) > 1:
            # keras-hub's beam search ranks the beams before it puts a
            # prompt's next id back: a row still inside its prompt while
            # others generate got duplicate beams, and another (worse)
            # result than alone. Each prompt length runs on its own.
            out = np.zeros_like(ids)
            for length in sorted(set(lengths)):
                rows = [i for i, n in enumerate(lengths) if n == length]
                out[rows] = self.generate(
                    ids[rows, :length], max_length, sampler, stop_token_ids,
                    use_cache, jit_compile,
                )
            self._hand_back(given, sampler)
            return out
        stop = self._check_stop_ids(stop_token_ids)
        width, start = ids.shape[1], min(lengths)
        if not _is_beam(sampler):
            # One compiled loop for prompts and lengths of a bucket: a loop
            # that starts inside a prompt keeps its ids, and one that runs
            # past `max_length` is cut (each step's id depends on the
            # earlier ones only; a beam's ranking is not, so beams don't).
            width, start = _bucket(width, up=True), max(1, _bucket(start))
            ids = np.pad(ids, [(0, 0), (0, width - ids.shape[1])])
            mask = np.pad(mask, [(0, 0), (0, width - mask.shape[1])])
        key = (len(ids), width, start, bool(use_cache), stop, bool(jit_compile))
        function = self._generate_function(key, sampler)
        out = np.array(ops.convert_to_numpy(function(ids, mask)), "int32")
        self._hand_back(given, sampler)
        out = out[:, :max_length]
        if stop is not None:
            for row, length in zip(out, lengths):
                hits = np.flatnonzero(np.isin(row[length:], stop))
                if hits.size:
                    row[length + hits[0] + 1:] = 0
        return out[0] if single else out

    def _check_stop_ids(self, stop_token_ids):
        """A tuple of ids in `[1, vocabulary_size)`, or `None`: keras-hub's
        loop read 0 (padding, its slots not yet written) as a stop at
        once, and failed on none ("tuple index out of range")."""
        if stop_token_ids is None:
            return None
        ids = np.ravel(np.asarray(stop_token_ids, dtype=object))
        size = self.backbone.vocabulary_size
        if not ids.size or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, (bool, np.bool_))
            and 0 < i < size for i in ids
        ):
            raise base.invalid(
                "stop_token_ids",
                f"one or more integer ids in [1, vocabulary_size={size}) "
                "(0 is padding, never generated; None for no stop)",
                stop_token_ids,
            )
        return tuple(int(i) for i in ids)

    def generate_text(self, prompts, max_length=None, sampler="greedy", **kwargs):
        """Continues text prompts (needs a `preprocessor`) to the end of the
        line; returns the prompts and their continuations (a string for a
        string). `max_length` defaults to the longest prompt plus 32
        characters; other arguments are those of `generate`."""
        if self.preprocessor is None:
            raise ValueError(
                "generate_text needs a `preprocessor`; use `generate` with "
                "token ids. Received: preprocessor=None"
            )
        single = isinstance(prompts, str)
        texts = [prompts] if single else list(prompts)
        if not texts:  # no prompt: no continuation (as `translate([])`)
            return []
        rows = self.preprocessor.encode(texts)
        if max_length is None:
            max_length = max(len(r) for r in rows) + 32
        kwargs.setdefault("stop_token_ids", (self.preprocessor.end_id,))
        out = self.generate(rows, max_length, sampler=sampler, **kwargs)
        decoded = [t.rstrip("\n") for t in self.preprocessor.decode(out)]
        return decoded[0] if single else decoded

    # Config ------------------------------------------------------------------

    @classmethod
    def from_preset(cls, preset, load_weights=True, preprocessor=None, **kwargs):
        """A preset with its shipped weights and a `CausalLMPreprocessor` of
        its vocabulary (unless `preprocessor` is given); `kwargs` override
        the preset's backbone arguments."""
        if preprocessor is None:
            config = {**presets.get_preset(preset, cls.__name__).config, **kwargs}
            preprocessor = CausalLMPreprocessor(config["vocabulary_size"])
        return super().from_preset(
            preset, load_weights=load_weights, preprocessor=preprocessor,
            **kwargs,
        )


# `CausalLMBackbone.from_preset(name)`: the backbone of a CausalLM preset.
CausalLMBackbone.classifier_class = CausalLM

_DATES_CONFIG = dict(
    vocabulary_size=128, hidden_dim=64, depth=2, num_heads=4,
    num_key_value_heads=2, mlp_dim=192, sliding_window=64,
)
presets.register_preset(
    "causal_lm_dates",
    "CausalLM",
    _DATES_CONFIG,
    weights="causal_lm_dates.weights.h5",
    description="Character language model (2 blocks of 64, RoPE, GQA 4/2, "
    "window 64) trained on the date lines; completes '<date> = ' with the "
    "ISO date.",
)
