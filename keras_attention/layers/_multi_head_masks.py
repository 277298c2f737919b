"""`MultiHeadAttention`'s keras-compatible masks and `attention_axes`.

keras's mask broadcasting and merge (`query_mask`, `value_mask`,
`key_mask`, `attention_mask`, causal and sliding-window masks), their
static checks, and the flattening of `attention_axes` to the core's
`(B, T, H, D)` heads and back to keras's score layout.
"""

from keras import ops

from keras_attention.layers import base


def _product(dims):
    total = 1
    for d in dims:
        total = total * d
    return total


class KerasMasks:
    """keras's masks and attention axes on keras_attention's core (`attend`)."""

    # The output is aligned with the query, so it keeps the query's mask.
    compute_mask = base.SequenceAttention.compute_mask

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
        sliding_window=None,
        alibi_slopes=None,
    ):
        """keras's hook, on the core: projected heads in, heads out.

        `query` `(B, <axes>, H, D)`, `key`/`value` `(B, <axes>, K, D|Dv)`;
        `attention_mask` as keras broadcasts it. Returns the heads
        `(B, <axes>, H, Dv)` and the weights in keras's layout (or `None`).
        """
        if self._flash_attention and return_attention_scores:
            raise ValueError(
                "Returning attention scores is not supported when flash "
                "attention is enabled. Please disable flash attention to access"
                " attention scores."
            )
        rank = len(query.shape)
        axes = tuple(self._attention_axes)
        others = [i for i in range(1, rank - 2) if i not in axes]
        scores_rank = 2 + len(others) + 2 * len(axes)
        mask = attention_mask
        if mask is not None:
            mask = ops.cast(mask, "bool")
            # keras's broadcasting: missing axes go before the query axes.
            while len(mask.shape) < scores_rank:
                mask = ops.expand_dims(mask, -2 * len(axes) - 1)
        simple = rank == 4
        if simple:
            q, k, v = query, key, value
        else:
            # (B, <others>, <axes>, H, D) -> (B * others, prod(axes), H, D)
            perm = [0] + others + list(axes) + [rank - 2, rank - 1]
            q_shape, k_shape = ops.shape(query), ops.shape(key)
            outer = [q_shape[0]] + [q_shape[i] for i in others]
            q_axes = [q_shape[i] for i in axes]
            k_axes = [k_shape[i] for i in axes]

            def flat(x, axes_dims):
                x = ops.transpose(x, perm)
                return ops.reshape(
                    x, (-1, _product(axes_dims)) + tuple(x.shape[-2:])
                )

            q, k, v = flat(query, q_axes), flat(key, k_axes), flat(value, k_axes)
            if mask is not None:
                # (b|1, <others>|1, h|1, <q axes>, <k axes>) -> rank 4.
                heads = mask.shape[len(others) + 1]
                mask = ops.broadcast_to(
                    mask, tuple(outer) + (heads,) + tuple(q_axes) + tuple(k_axes)
                )
                mask = ops.reshape(
                    mask, (-1, heads, _product(q_axes), _product(k_axes))
                )
        extra = {"sliding_window": sliding_window} if sliding_window else {}
        if alibi_slopes is not None:
            extra["alibi_slopes"] = alibi_slopes
        result = self.attend(
            q, k, v, mask, return_attention_scores, training, use_causal_mask,
            **extra,
        )
        out, weights = result if return_attention_scores else (result, None)
        if not simple:
            out = ops.reshape(
                out, tuple(outer) + tuple(q_axes) + tuple(out.shape[-2:])
            )
            out = ops.transpose(out, [perm.index(i) for i in range(rank)])
            if weights is not None:
                weights = ops.reshape(
                    weights,
                    tuple(outer) + (self._num_heads,) + tuple(q_axes) + tuple(k_axes),
                )
        return out, weights

    def _check_masks(
        self, query, value, query_mask, value_mask, key_mask, attention_mask
    ):
        """Static checks of the masks, alike in eager and symbolic calls."""
        for name, m, like in (
            ("query_mask", query_mask, query),
            ("value_mask", value_mask, value),
            ("key_mask", key_mask, value),
        ):
            base.check_mask_shape(name, m, tuple(like.shape[:-1]))
        if attention_mask is None or len(query.shape) != 3:
            return
        self._check_attention_mask_shape(
            attention_mask, query.shape[0], query.shape[1], value.shape[1]
        )

    def _check_attention_mask_shape(self, attention_mask, batch, t_len, s_len,
                                    keys=""):
        base.check_attention_mask(
            attention_mask, batch, self._num_heads, t_len, s_len, keys
        )

    def _compute_attention_mask(
        self,
        query,
        value,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        use_sliding_window=True,
    ):
        """keras's mask merge; `use_sliding_window=False` leaves the band
        to the core. Returns a boolean mask broadcastable to `(B, T, S)`
        or `None`."""
        masks = []
        if len(query.shape) > 3:
            masks = self._padding_masks_over_axes(
                len(query.shape), query_mask, value_mask, key_mask
            )
            query_mask = value_mask = key_mask = None
        if query_mask is not None:
            masks.append(ops.expand_dims(ops.cast(query_mask, "bool"), -1))
        for m in (value_mask, key_mask):
            if m is not None:
                masks.append(ops.expand_dims(ops.cast(m, "bool"), -2))
        if use_causal_mask:
            if tuple(self._attention_axes) != (1,):
                raise ValueError(
                    "Received an invalid value for argument "
                    "`use_causal_mask`: a causal mask runs along the "
                    "sequence axis 1 only (as keras's layer makes it), and "
                    "this layer attends over axes "
                    f"{tuple(self._attention_axes)} of a query of shape "
                    f"{tuple(query.shape)}. Received: use_causal_mask=True "
                    f"with attention_axes={self._attention_axes}"
                )
            masks.append(self._compute_causal_mask(query, value))
        if use_sliding_window and self._sliding_window is not None:
            masks.append(self._compute_sliding_window_mask(query, value))
        if attention_mask is not None:
            masks.insert(0, ops.cast(attention_mask, "bool"))
        if not masks:
            return None
        merged = masks[0]
        for m in masks[1:]:
            merged = ops.logical_and(merged, m)
        return merged

    def _padding_masks_over_axes(self, rank, query_mask, value_mask, key_mask):
        """Keras masks `(B, d1, ..., dn)` of rank-`rank` inputs laid out as
        the scores without heads, `(B, <other axes>, <query's attention
        axes>, <key's>)`: a query's mask over the key axes' ones, a key's
        or a value's under the query axes' ones."""
        axes = [a if a >= 0 else rank + a for a in self._attention_axes]
        others = [i for i in range(1, rank - 1) if i not in axes]
        masks = []
        for m, is_query in ((query_mask, True), (value_mask, False),
                            (key_mask, False)):
            if m is None:
                continue
            m = ops.transpose(ops.cast(m, "bool"), [0] + others + axes)
            for _ in axes:
                m = ops.expand_dims(m, -1 if is_query else 1 + len(others))
            masks.append(m)
        return masks

    def _scores_shape(self, query_shape, key_shape):
        rank = len(query_shape) + 1
        if self._attention_axes is None:
            axes = tuple(range(1, rank - 2))
        else:
            axes = tuple(a if a >= 0 else rank - 1 + a for a in self._attention_axes)
        others = [i for i in range(1, rank - 2) if i not in axes]
        return (
            (query_shape[0],)
            + tuple(query_shape[i] for i in others)
            + (self._num_heads,)
            + tuple(query_shape[i] for i in axes)
            + tuple(key_shape[i] for i in axes)
        )
