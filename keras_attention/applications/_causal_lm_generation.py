"""`CausalLM`'s generation machinery: the sampler, the prompts, the loop.

`_sampler` makes a named keras-hub sampler once per model (seeded at each
call), or checks a given one (`_check_sampler`: what keras-hub would only
fail on deep in the loop) and runs the model's twin of it (`_twin_of`: one
compiled loop per settings, not per sampler object); `_check_prompts`
turns the prompts into padded `(B, max_length)` ids, their mask and
lengths; `_generate_function` builds (once per batch size, bucket of
lengths and setting) the loop that prefills the cache and runs the
sampler, through the key/value cache or re-running the whole sequence.
`CausalLM.generate` puts them together.
"""

import json
import numbers
import random

import keras
import numpy as np
from keras import ops

from keras_attention import _validation as base
from keras_attention.ops.shapes import jax_x64

SAMPLERS = ("greedy", "top_k", "top_p", "random")
# Generated rows are padded with 0 after a stop token, as prompts are: 0 is
# never generated (`CausalLMPreprocessor` never writes it in a text).
PAD_ID = 0
# The padding id's logit: float32's lowest, so that it stays far below the
# others once a sampler divides by its temperature (-1e9 / 1e30 did not).
_NEG_INF = float(np.finfo("float32").min)
# keras-hub's own sampler classes: their config holds every setting, so a
# loop is kept per settings (`_twin_of`); any other class runs as given.
_HUB_SAMPLERS = (
    "GreedySampler", "TopKSampler", "TopPSampler", "RandomSampler",
    "BeamSampler",
)


class CausalLMGeneration:
    """Mixin of `CausalLM`: samplers, prompt checks and the compiled
    generation loop (reads `backbone`, `call_with_cache` and
    `_generation`)."""

    def _sampler(self, sampler):
        import keras_hub

        if jax_x64():
            # keras-hub's samplers write each id at `[0, index]` with an
            # int32 index: under x64 the 0 is an int64 and JAX refuses the
            # mix (keras-hub's own causal LMs fail alike).
            raise RuntimeError(
                "Generation runs keras-hub's samplers, which fail in JAX's "
                "x64 mode. Generate with it off: "
                "`jax.config.update('jax_enable_x64', False)`."
            )
        if isinstance(sampler, keras_hub.samplers.Sampler):
            self._check_sampler(sampler)
            hub = [getattr(keras_hub.samplers, n, None) for n in _HUB_SAMPLERS]
            if type(sampler) in hub:
                return self._twin_of(sampler)
            # A class of the user's: its own settings (beyond keras-hub's
            # `get_config`) and code run, in a loop of its own.
            return sampler
        if sampler not in SAMPLERS:
            raise base.invalid(
                "sampler", f"one of {SAMPLERS} or a keras_hub.samplers.Sampler",
                sampler,
            )
        if sampler not in self._generation.samplers:
            python_state = random.getstate()  # its seed is drawn per call
            try:
                self._generation.samplers[sampler] = self._check_sampler(
                    keras_hub.samplers.get(sampler), named=sampler
                )
            finally:  # a refused one leaves Python's `random` as it was too
                random.setstate(python_state)
        sampler = self._generation.samplers[sampler]
        # Seeded at each call as a new sampler would be (from Python's
        # `random`, which `keras.utils.set_random_seed` seeds), keeping the
        # compiled loop that reads the seed variable.
        for state in sampler.variables:
            seed = random.randint(1, int(1e9))
            state.assign(np.array([seed, 0], keras.backend.standardize_dtype(
                state.dtype)))
        return sampler

    def _twin_of(self, sampler):
        """The model's own sampler of `sampler`'s class and settings, its
        seed state copied from `sampler`: the compiled loop is kept per
        settings (a new `TopPSampler(p=0.9)` at each call compiled anew,
        and every loop stayed cached). `_hand_back` copies the state
        back after the call, so `sampler` advances as if it had run."""
        config = sampler.get_config()
        key = (type(sampler), json.dumps(config, sort_keys=True, default=str))
        twin = self._generation.samplers.get(key)
        if twin is None:
            python_state = random.getstate()  # an unseeded one draws a seed
            twin = type(sampler).from_config(config)
            random.setstate(python_state)
            self._generation.samplers[key] = twin
        if twin is not sampler:
            for mine, theirs in zip(twin.variables, sampler.variables):
                mine.assign(theirs)
        return twin

    @staticmethod
    def _hand_back(given, twin):
        """`given`'s seed state from its twin's after a call (`_twin_of`)."""
        if given is not twin and not isinstance(given, str):
            for theirs, mine in zip(given.variables, twin.variables):
                theirs.assign(mine)

    def _check_sampler(self, sampler, named=None):
        """Settings keras-hub would only fail on deep in the loop (`named`:
        the name it was given by, with keras-hub's defaults)."""
        import keras_hub

        name = type(sampler).__name__
        if named is not None:
            name = f"{named!r}, keras-hub's {name}"
        if isinstance(sampler, keras_hub.samplers.ContrastiveSampler):
            raise base.invalid(
                "sampler", "a sampler that needs no hidden states (not "
                "ContrastiveSampler)", name,
            )
        if getattr(sampler, "return_all_beams", False):
            raise base.invalid(
                "sampler", "a BeamSampler with return_all_beams=False "
                "(generate returns ids only)", name,
            )
        temperature = sampler.temperature
        if isinstance(temperature, (bool, np.bool_)) or not isinstance(
            temperature, numbers.Real
        ) or not 0 < temperature < np.inf:
            raise base.invalid(
                "sampler", "a positive finite temperature (\"greedy\" for "
                "the most likely ids)", f"{name}(temperature={temperature!r})",
            )
        vocabulary = self.backbone.vocabulary_size
        k = getattr(sampler, "k", None)
        if k is not None and (
            isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral)
            or not 0 < k <= vocabulary
        ):
            raise base.invalid(
                "sampler", f"an integer k in [1, vocabulary_size={vocabulary}]",
                f"{name}(k={k!r})",
            )
        p = getattr(sampler, "p", None)
        if isinstance(sampler, keras_hub.samplers.TopPSampler) and (
            isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real)
            or not 0 < p <= 1
        ):
            raise base.invalid(
                "sampler", "p in (0, 1] (the probability mass kept)",
                f"{name}(p={p!r})",
            )
        return sampler

    def _check_prompts(self, prompt_ids, max_length):
        """`(B, max_length)` int32 ids, the prompt mask, the rows' lengths
        and whether one row `(P,)` was given."""
        if ops.is_tensor(prompt_ids):  # a backend tensor: (P,) or (B, P)
            prompt_ids = ops.convert_to_numpy(prompt_ids)
        if isinstance(prompt_ids, np.ndarray) and prompt_ids.ndim == 2:
            rows = list(prompt_ids)
        elif isinstance(prompt_ids, (list, tuple)) and prompt_ids and all(
            isinstance(r, (list, tuple, np.ndarray)) for r in prompt_ids
        ):
            rows = list(prompt_ids)
        else:
            rows = None
        single = rows is None
        rows = [prompt_ids] if single else rows
        rows = [np.asarray(r) for r in rows]
        vocabulary = self.backbone.vocabulary_size
        for r in rows:
            if (
                r.ndim != 1 or not r.size
                or not np.issubdtype(r.dtype, np.integer)
                or r.min() < 0 or r.max() >= vocabulary
            ):
                raise base.invalid(
                    "prompt_ids",
                    "non-empty rows of integer ids in "
                    f"[0, vocabulary_size={vocabulary})",
                    prompt_ids,
                )
        # Zeros around a row are padding (a left- or right-padded batch).
        rows = [np.trim_zeros(r) for r in rows]
        if not all(r.size for r in rows):
            raise base.invalid(
                "prompt_ids", "rows with an id other than the padding 0",
                prompt_ids,
            )
        lengths = [len(r) for r in rows]
        if (  # NumPy's integers too; a bool is not
            isinstance(max_length, (bool, np.bool_))
            or not isinstance(max_length, numbers.Integral)
            or max_length <= max(lengths)
        ):
            raise base.invalid(
                "max_length",
                "an integer above the longest prompt's length "
                f"{max(lengths)} (the total length, prompt included)",
                max_length,
            )
        max_length = int(max_length)
        ids = np.zeros((len(rows), max_length), "int32")
        mask = np.zeros((len(rows), max_length), bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = r, True
        return ids, mask, lengths, single

    def _generate_function(self, key, sampler):
        batch, max_length, start, use_cache, stop, jit_compile = key
        vocabulary = self.backbone.vocabulary_size
        padding = ops.equal(ops.arange(vocabulary), PAD_ID)[None, :]

        def no_padding(logits):
            return ops.where(padding, _NEG_INF, ops.cast(logits, "float32"))

        def next_cached(prompt, cache, index):
            # The sampler's rows: B, or B * num_beams for a BeamSampler.
            token = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
            logits, cache = self.call_with_cache(token, cache, index - 1)
            return no_padding(logits[:, 0]), None, cache

        def next_recomputed(prompt, cache, index):
            # The whole sequence again; causal, so later slots don't matter.
            logits = self(prompt, training=False)
            return no_padding(ops.take(logits, index - 1, axis=1)), None, cache

        def generate(prompt, mask):
            cache = None
            if use_cache:
                cache = self.backbone.empty_cache(batch, max_length)
                if start > 1:  # prefill every prompt token but the last
                    _, cache = self.call_with_cache(
                        prompt[:, : start - 1], cache, 0
                    )
            return sampler(
                next_cached if use_cache else next_recomputed,
                prompt, cache=cache, index=start, mask=mask,
                stop_token_ids=stop, model=self,
            )

        return self._generation.loops.get(
            self, key + (sampler,), lambda: generate, jit_compile,
            variables=sampler.variables,
        )
