"""The translators' search: greedy and beam search on `keras.ops` with a
fixed maximum length (one XLA program under TensorFlow and JAX), with the cross-
attention weights of every generated token. Neither search chooses padding
or `[START]`; after `[END]` a row holds padding. `Translator` takes it as a
mixin; it calls the subclass hooks `encode`, `prepare_decoding`,
`initial_cache`, `decode_step` and `decode_sequence`."""

import keras
from keras import ops

_NEG_INF = -1e9


class SearchDecoding:
    """Greedy and beam search over a translator's decoding hooks."""

    def _uncached_step(self, tokens, index, buffer, encoded):
        """One step by re-running the whole decoder on the prefix so far."""
        length = buffer.shape[1]
        here = ops.equal(ops.arange(length), index)[None, :]
        buffer = ops.where(here, tokens[:, None], buffer)
        logits, weights = self.decode_sequence(buffer, encoded, training=False)
        return (
            ops.take(logits, index, axis=1),
            buffer,
            ops.take(weights, index, axis=1),
        )

    @property
    def supports_cache(self):
        """Whether `decode_step` can run; else decoding re-runs the prefix."""
        return True

    def _never_generated(self):
        """`(1, V)` bool: the ids a search never chooses before `[END]`.

        Padding and `[START]` are not tokens of a translation (an untrained
        model would otherwise write them mid-sentence, and a generated pad
        would be hidden from the uncached decoder but not the cached one).
        """
        p = self.preprocessor
        ids = ops.arange(p.target_vocabulary_size)
        return ops.logical_or(
            ops.equal(ids, p.pad_id), ops.equal(ids, p.start_id)
        )[None, :]

    def _step_function(self, encoded, batch, max_length, use_cache):
        if use_cache and self.supports_cache:
            return self.decode_step, self.initial_cache(encoded, max_length)
        return self._uncached_step, ops.zeros((batch, max_length), "int32")

    def _greedy(self, source_ids, max_length, use_cache):
        p = self.preprocessor
        encoded = self.prepare_decoding(self.encode(source_ids))
        batch = ops.shape(source_ids)[0]
        s_len = source_ids.shape[1]
        step, cache = self._step_function(encoded, batch, max_length, use_cache)
        positions = ops.arange(max_length)[None, :]
        banned = self._never_generated()

        def cond(i, previous, tokens, weights, finished, cache):
            return ops.logical_and(
                i < max_length, ops.logical_not(ops.all(finished))
            )

        def body(i, previous, tokens, weights, finished, cache):
            logits, cache, step_weights = step(previous, i, cache, encoded)
            logits = ops.where(banned, _NEG_INF, ops.cast(logits, "float32"))
            chosen = ops.cast(ops.argmax(logits, axis=-1), "int32")
            chosen = ops.where(finished, p.pad_id, chosen)
            # Finished rows write padding, and no attention.
            step_weights = ops.where(
                finished[:, None], 0.0, ops.cast(step_weights, "float32")
            )
            here = ops.equal(positions, i)  # (1, L)
            tokens = ops.where(here, chosen[:, None], tokens)
            weights = ops.where(
                here[:, :, None], step_weights[:, None, :], weights
            )
            finished = ops.logical_or(finished, ops.equal(chosen, p.end_id))
            return i + 1, chosen, tokens, weights, finished, cache

        state = (
            ops.convert_to_tensor(0, "int32"),
            ops.full((batch,), p.start_id, "int32"),
            ops.zeros((batch, max_length), "int32"),
            ops.zeros((batch, max_length, s_len), "float32"),
            ops.zeros((batch,), "bool"),
            cache,
        )
        state = ops.while_loop(cond, body, state)
        return state[2], state[3]

    def _beam_search(
        self, source_ids, max_length, beam_width, length_penalty, use_cache
    ):
        p = self.preprocessor
        k = beam_width
        batch = ops.shape(source_ids)[0]
        s_len = source_ids.shape[1]
        encoded = self.prepare_decoding(self.encode(source_ids))
        # Beam j of sentence b is row b * k + j of every tensor.
        encoded = keras.tree.map_structure(
            lambda x: ops.repeat(x, k, axis=0), encoded
        )
        rows = batch * k
        step, cache = self._step_function(encoded, rows, max_length, use_cache)
        vocabulary = self.preprocessor.target_vocabulary_size
        positions = ops.arange(max_length)[None, :]
        # A finished beam can only continue with padding, at no cost.
        pad_only = ops.where(
            ops.equal(ops.arange(vocabulary), p.pad_id), 0.0, _NEG_INF
        )[None, :]
        banned = self._never_generated()
        offsets = ops.repeat(ops.arange(batch) * k, k)  # (B*k,)

        def cond(i, previous, scores, tokens, weights, finished, cache):
            return ops.logical_and(
                i < max_length, ops.logical_not(ops.all(finished))
            )

        def body(i, previous, scores, tokens, weights, finished, cache):
            logits, cache, step_weights = step(previous, i, cache, encoded)
            log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
            # Scores stay the model's log-probabilities (no renormalisation
            # over the allowed ids), as in Hugging Face's bad-word masks.
            log_probs = ops.where(banned, _NEG_INF, log_probs)
            log_probs = ops.where(finished[:, None], pad_only, log_probs)
            step_weights = ops.where(
                finished[:, None], 0.0, ops.cast(step_weights, "float32")
            )
            total = ops.reshape(scores, (-1, 1)) + log_probs  # (B*k, V)
            total = ops.reshape(total, (-1, k * vocabulary))
            best, index = ops.top_k(total, k)  # (B, k)
            index = ops.cast(index, "int32")
            origin = ops.reshape(index // vocabulary, (-1,)) + offsets
            chosen = ops.reshape(index % vocabulary, (-1,))

            def reorder(x):
                return ops.take(x, origin, axis=0)

            cache = keras.tree.map_structure(reorder, cache)
            tokens = reorder(tokens)
            weights = reorder(weights)
            finished = reorder(finished)
            step_weights = reorder(step_weights)
            here = ops.equal(positions, i)
            tokens = ops.where(here, chosen[:, None], tokens)
            weights = ops.where(here[:, :, None], step_weights[:, None, :], weights)
            finished = ops.logical_or(finished, ops.equal(chosen, p.end_id))
            return i + 1, chosen, best, tokens, weights, finished, cache

        # Only the first beam is live at the start, so the k beams do not
        # all extend the same prefix.
        first = ops.where(ops.equal(ops.arange(k), 0), 0.0, _NEG_INF)
        state = (
            ops.convert_to_tensor(0, "int32"),
            ops.full((rows,), p.start_id, "int32"),
            ops.tile(first[None, :], (batch, 1)),
            ops.zeros((rows, max_length), "int32"),
            ops.zeros((rows, max_length, s_len), "float32"),
            ops.zeros((rows,), "bool"),
            cache,
        )
        _, _, scores, tokens, weights, _, _ = ops.while_loop(cond, body, state)
        # Length normalisation of Wu et al. (2016): ((5 + |y|) / 6) ** alpha.
        lengths = ops.sum(ops.cast(ops.not_equal(tokens, p.pad_id), "float32"), -1)
        penalty = ops.power((5.0 + lengths) / 6.0, length_penalty)
        normalised = scores / ops.reshape(penalty, (-1, k))
        winner = ops.cast(ops.argmax(normalised, axis=-1), "int32")
        winner = winner + ops.arange(batch) * k
        return ops.take(tokens, winner, axis=0), ops.take(weights, winner, axis=0)
