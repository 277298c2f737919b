"""`MultiHeadAttention`'s key/value cache (keras-hub's
`CachedMultiHeadAttention` convention), ring caches for a sliding window,
and the projection helpers of decoders that cache."""

import numbers
from operator import attrgetter

import keras
from keras import ops
# No public API sets a tensor's Keras mask; keras's own layer uses this.
from keras.src.backend import get_keras_mask

from keras_attention._validation import invalid
from keras_attention._validation import is_symbolic
from keras_attention._validation import shape_fits
from keras_attention.ops import positions
from keras_attention.ops.shapes import start_indices


class KVCache:
    """Cached calls of `MultiHeadAttention`: `call(..., cache=...)`."""

    def _check_cache(
        self, query, cache, cache_update_index, value=None, key=None,
        return_attention_scores=False,
    ):
        """Static checks of a cache and its index, before any work (for
        `call` and `compute_output_spec` alike)."""
        if cache is None:
            raise ValueError(
                "`cache_update_index` is given without a `cache`. Received: "
                f"cache=None, cache_update_index={cache_update_index!r}"
            )
        if return_attention_scores:
            raise ValueError(
                "A cached call returns `(output, cache)`, no attention "
                "scores. Received: return_attention_scores=True"
            )
        if len(query.shape) != 3:
            raise ValueError(
                "Received an invalid value for argument `query`, expected "
                "tokens (B, T, dim) in a cached call (`cache=`). Received: "
                f"query.shape={tuple(query.shape)}"
            )
        shape = tuple(cache.shape)
        expected = (query.shape[0], 2, None, self.kv_heads, self._key_dim)
        if not shape_fits(shape, expected):
            raise ValueError(
                "Received an invalid value for argument `cache`, expected a "
                "tensor (B, 2, S_max, K, D) = "
                f"{expected[:2] + ('S_max',) + expected[3:]}. "
                f"Received: cache.shape={shape}"
            )
        if shape[2] is None:
            raise ValueError(
                "Received an invalid value for argument `cache`, expected "
                "its length S_max (axis 2) known when traced (the slots' "
                "positions and a ring cache's window are static): give it in "
                "the `tf.function` or export signature. Received: "
                f"cache.shape={shape}"
            )
        if self._value_dim != self._key_dim:
            raise ValueError(
                "A key/value cache needs value_dim == key_dim. Received: "
                f"key_dim={self._key_dim}, value_dim={self._value_dim}"
            )
        dtype = keras.backend.standardize_dtype(cache.dtype)
        if dtype != self.compute_dtype:
            raise ValueError(
                "Received an invalid value for argument `cache`, expected "
                f"the layer's compute dtype {self.compute_dtype}. "
                f"Received: cache.dtype={dtype}"
            )
        if cache_update_index is not None:
            # The new keys and values are those of the T new positions.
            for name, x in (("value", value), ("key", key)):
                length = None if x is None else x.shape[1]
                if None not in (length, query.shape[1]) and (
                    length != query.shape[1]
                ):
                    raise ValueError(
                        f"Received an invalid value for argument `{name}`, "
                        "expected the query's length T = "
                        f"{query.shape[1]} with `cache_update_index` (the "
                        "keys and values of the new positions). Received: "
                        f"{name}.shape={tuple(x.shape)}"
                    )
        self._check_cache_index(cache_update_index, query.shape[1], shape[2])

    @staticmethod
    def _refuse_masks_in_cached_call(tensors, masks):
        """`query_mask`, `value_mask`, `key_mask` given by hand in a cached
        call raise (they were dropped silently); Keras's own masks, which
        Keras passes in the same arguments, are not read there, as
        documented. The cache does not keep earlier tokens' padding: only
        `attention_mask` over its slots says it."""
        for name, x, mask in zip(("query", "value", "key"), tensors, masks):
            if mask is None or isinstance(x, (list, tuple)):
                continue
            if x is not None and mask is get_keras_mask(x):
                continue  # Keras's mask of the tensor, filled in by Keras
            raise ValueError(
                f"`{name}_mask` is not read in a cached call (`cache=`): "
                "pass `attention_mask` (B, T, S_max), True where a query may "
                "attend to a cache slot. Received: "
                f"{name}_mask.shape={tuple(getattr(mask, 'shape', ()))}"
            )

    def _check_cache_index(self, index, t_len, s_max):
        """`cache_update_index`: an integer or an integer scalar tensor with
        `0 <= index` and `index + T <= S_max` (a ring takes any
        `index >= 0`), checked wherever its value is known (not inside a
        traced function, where a write past the end would be clamped)."""
        if index is None:
            return
        expected = "an integer or an integer scalar tensor"
        if isinstance(index, bool):
            raise invalid("cache_update_index", expected, index)
        if isinstance(index, numbers.Integral):
            value = int(index)
        elif hasattr(index, "shape") and hasattr(index, "dtype"):
            dtype = keras.backend.standardize_dtype(index.dtype)
            if tuple(index.shape) != () or "int" not in dtype:
                raise invalid(
                    "cache_update_index", expected,
                    f"<tensor shape={tuple(index.shape)} dtype={dtype}>",
                )
            value = None if is_symbolic(index) else int(
                ops.convert_to_numpy(index)
            )
        else:
            raise invalid("cache_update_index", expected, index)
        if value is None:
            return
        ring = self._is_ring(s_max)
        if value < 0 or (
            not ring and None not in (t_len, s_max) and value + t_len > s_max
        ):
            bound = "" if ring else (
                f" and index + T <= S_max = {s_max} (T = {t_len})"
            )
            raise invalid(
                "cache_update_index", f"0 <= index{bound}", value
            )

    def _is_ring(self, s_max):
        """A cache of `sliding_window` entries is a ring: position `p` sits
        in slot `p % sliding_window`."""
        return self._sliding_window is not None and s_max == self._sliding_window

    def _call_cached(
        self, query, value, key, attention_mask, cache, cache_update_index,
        training, use_causal_mask, return_attention_scores,
    ):
        """keras-hub's `CachedMultiHeadAttention` convention.

        `cache` `(B, 2, S_max, K, D)` holds the projected (and, with RoPE,
        rotated) keys and values of the earlier positions. With
        `cache_update_index` the new tokens' keys and values are written at
        that position and the queries, at positions `index + arange(T)`,
        attend to every filled slot (causally with `use_causal_mask`, within
        the window with `sliding_window`); without it the cache is read as
        it is (cross-attention to a fixed memory). A cache of exactly
        `sliding_window` entries is a ring. `attention_mask` is read as
        keras reads it, over the `S_max` slots of the cache (a ring's keys
        are its `W` slots, then the `T` new tokens: `S = W + T`). Returns
        `(output, cache)`.
        """
        self._check_cache(
            query, cache, cache_update_index, value, key, return_attention_scores
        )
        causal = self.use_causal_mask if use_causal_mask is None else use_causal_mask
        key = value if key is None else key
        if self._use_gate:
            gate = self._gate_dense(query)
        q = self._query_dense(query)
        t_len, s_max = ops.shape(query)[1], cache.shape[2]
        index = 0 if cache_update_index is None else cache_update_index
        q_pos = ops.arange(t_len, dtype="int32") + ops.cast(index, "int32")
        key_cache, value_cache = cache[:, 0], cache[:, 1]
        if cache_update_index is None:
            k, v = key_cache, value_cache
            k_pos = ops.arange(s_max, dtype="int32")
            valid = ops.ones((1, s_max), "bool")
            q, _, _ = self._encode_positions(q, q, {}, True, q_start=index)
        else:
            new_k = self._key_dense(key)
            new_v = self._value_dense(value)
            q, new_k, _ = self._encode_positions(
                q, new_k, {}, True, q_start=index, k_start=index
            )
            new_k = ops.cast(new_k, cache.dtype)
            new_v = ops.cast(new_v, cache.dtype)
            if self._is_ring(s_max):
                k, v, k_pos, cache = self._ring_update(
                    key_cache, value_cache, new_k, new_v, index
                )
            else:
                # One in-place write of the new rows into the 5-D cache
                # (writing the halves and stacking them again would copy
                # the whole cache at every step).
                cache = ops.slice_update(
                    cache, start_indices(0, 0, index, 0, 0),
                    ops.stack((new_k, new_v), axis=1),
                )
                k, v = cache[:, 0], cache[:, 1]
                k_pos = ops.arange(s_max, dtype="int32")
            filled = ops.logical_and(
                k_pos >= 0, k_pos < ops.cast(index, "int32") + t_len
            )
            valid = filled[None, :]
        distance = q_pos[:, None] - k_pos[None, :]  # (T, S)
        allowed = ops.broadcast_to(valid, ops.shape(distance))
        if causal:
            allowed = ops.logical_and(allowed, distance >= 0)
        if self._sliding_window is not None:
            allowed = ops.logical_and(
                allowed, ops.abs(distance) < self._sliding_window
            )
        mask = allowed[None]
        if attention_mask is not None:
            self._check_attention_mask_shape(
                attention_mask, query.shape[0], query.shape[1], k.shape[1],
                " (S: the ring's W slots, then the T new tokens)"
                if k.shape[1] != s_max else " (S: the cache's S_max slots)",
            )
            mask = ops.logical_and(ops.cast(attention_mask, "bool"), mask)
        slopes = None
        if self.position_encoding == "alibi":
            if k.shape[1] != s_max:  # a ring: its slots put in position order
                k, v, mask = self._in_position_order(k, v, mask, index)
            # Keys at positions `start + s` (0, `index - W` for a ring):
            # the core's `slope * (s - t)` is `slope * (k_pos - q_pos)` plus
            # a constant, the same over a row, so the same softmax, added
            # block by block on the long paths (as a dense `(H, T, S)` bias
            # on the dense path, a prompt of 8,192 tokens took 4 GB, 0.9
            # uncached).
            slopes = positions.alibi_slopes(self._num_heads, self.alibi_bias_max)
        # The layer's own core (`attend`): its `implementation` and
        # `flash_attention` hold in a cached call too (they were dropped:
        # an explicit "blocked" path then ran dropout it refuses uncached).
        heads = self.attend(
            q, k, v, mask, return_weights=False, training=training,
            alibi_slopes=slopes,
        )
        if self._use_gate:
            heads = ops.multiply(heads, gate)
        out = self._output_dense(heads)
        if cache_update_index is not None:
            # Inside a traced function the index is not known when the
            # call is checked, and a write past the end lands on the last
            # slots (a negative index on the first): NaN outputs then, not
            # wrong numbers without a sign. A ring takes any index >= 0.
            position = ops.cast(index, "int32")
            outside = position < 0
            if not self._is_ring(s_max):
                outside = ops.logical_or(outside, position + t_len > s_max)
            out = ops.where(outside, ops.full_like(out, float("nan")), out)
        return out, cache

    def _in_position_order(self, k, v, mask, index):
        """A ring's keys, values and mask `(..., S)` with its `W` slots in
        the order of their positions (`index - W + s`, the slot `(index +
        s) % W`), then the new tokens: every key at `index - W + s`."""
        window = self._sliding_window
        order = ops.concatenate([
            ops.mod(
                ops.cast(index, "int32") + ops.arange(window, dtype="int32"),
                window,
            ),
            window + ops.arange(ops.shape(k)[1] - window, dtype="int32"),
        ])
        return (
            ops.take(k, order, axis=1),
            ops.take(v, order, axis=1),
            ops.take(mask, order, axis=-1),
        )

    def _ring_update(self, key_cache, value_cache, new_k, new_v, index):
        """Keys/values to attend to and the new ring, for a ring cache.

        The queries see the ring's earlier entries and the new tokens
        (concatenated, `(B, W + T, K, D)`, with their positions); the new
        ring keeps, per slot `j`, the newest position `p = j (mod W)`.
        """
        window = self._sliding_window
        t_len = ops.shape(new_k)[1]
        index = ops.cast(index, "int32")
        slots = ops.arange(window, dtype="int32")
        # Slot j holds the newest position before `index` with p % W == j.
        old_pos = index - 1 - ops.mod(index - 1 - slots, window)
        last = index + t_len - 1
        newest = last - ops.mod(last - slots, window)
        from_new = newest >= index
        take = ops.clip(newest - index, 0, t_len - 1)
        ring_k = ops.where(
            from_new[None, :, None, None], ops.take(new_k, take, axis=1), key_cache
        )
        ring_v = ops.where(
            from_new[None, :, None, None], ops.take(new_v, take, axis=1), value_cache
        )
        k = ops.concatenate([key_cache, new_k], axis=1)
        v = ops.concatenate([value_cache, new_v], axis=1)
        k_pos = ops.concatenate(
            [old_pos, ops.arange(t_len, dtype="int32") + index], axis=0
        )
        return k, v, k_pos, ops.stack((ring_k, ring_v), axis=1)

    # ---------------------------------------- helpers of cached decoding

    # The projections (`EinsumDense`, their biases inside), for `project`.
    query_kernel = property(attrgetter("_query_dense"), doc="The query projection.")
    key_kernel = property(attrgetter("_key_dense"), doc="The key projection.")
    value_kernel = property(attrgetter("_value_dense"), doc="The value projection.")
    query_bias = key_bias = value_bias = None

    def project(self, x, projection, bias=None):
        """`(B, T, dim) -> (B, T, heads, size)` with one of the projections.

        For decoders that project one new position at a time (a key/value
        cache): `layer.project(x, layer.key_kernel)` is `layer._key_dense(x)`,
        LoRA and quantization included.
        """
        del bias  # in the sublayer
        return projection(x)

    def project_output(self, heads):
        """`(B, T, H, Dv) -> (B, T, *output_shape)` (no gate)."""
        return self._output_dense(heads)
