"""`MultiHeadAttention`'s shape checks and shape inference.

`_check_shapes` raises keras's `ValueError`s for the query, value and key
shapes a call receives (ranks, batch sizes, value against key, positions);
`compute_output_shape` and `compute_output_spec` give the output (and the
scores' or the cache's) shape without computing it, the checks included.
They read the layer's other mixins: `_check_masks` and `_scores_shape`
(`KerasMasks`), `_check_cache` (`KVCache`), `_check_position_shapes`
(`PositionEncodings`).
"""

import keras

from keras_attention._validation import shape_fits
from keras_attention.layers import base
from keras_attention.ops.dispatch import check_path_takes_weights


class ShapeInference:
    """Mixin of `MultiHeadAttention`: shape checks and output specs."""

    @staticmethod
    def _check_value_key(value_shape, key_shape):
        if not shape_fits(value_shape[1:-1], key_shape[1:-1]):
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, "
                f"must be equal. Received: value_shape={tuple(value_shape)} "
                f"and key_shape={tuple(key_shape)}"
            )

    def _check_shapes(self, query_shape, value_shape, key_shape):
        shapes = {"query": query_shape, "value": value_shape, "key": key_shape}
        self._check_value_key(value_shape, key_shape)  # keras's first check
        # The ranks before the batch sizes: an unbatched (T, dim) pair is
        # not a batch-size mismatch.
        for name, shape in shapes.items():
            if len(shape) < 3:
                raise ValueError(
                    f"Received an invalid value for argument `{name}`, "
                    "expected a tensor of rank 3 (B, T, dim) or more. "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        built = getattr(self, "_built_feature_sizes", None)
        for name, size in (built or {}).items():
            got = shapes[name][-1]
            if got is not None and got != size:
                raise ValueError(
                    f"Received an invalid value for argument `{name}`, "
                    f"expected {size} features in its last axis, as when the "
                    f"layer was built. Received: {name}.shape="
                    f"{tuple(shapes[name])}"
                )
        base.check_batch(query_shape, value_shape, key_shape)
        if len(query_shape) != len(value_shape):
            raise ValueError(
                "Expected `query` and `value` of the same rank. Received: "
                f"query.shape={tuple(query_shape)}, "
                f"value.shape={tuple(value_shape)}"
            )
        self._check_attention_axes(len(query_shape))
        self._check_position_shapes(query_shape)

    def _check_attention_axes(self, rank):
        """Raise unless every one of `attention_axes` is an axis between the
        batch and the features of a rank-`rank` input, once each (keras
        would attend over another axis, or fail in an einsum)."""
        if self._attention_axes is None:
            return
        axes = [a if a >= 0 else rank + a for a in self._attention_axes]
        if len(set(axes)) != len(axes) or any(not 1 <= a <= rank - 2 for a in axes):
            raise ValueError(
                "Received an invalid value for argument `attention_axes`, "
                f"expected distinct axes of the rank-{rank} inputs between "
                f"the batch and the features, i.e. among "
                f"{tuple(range(1, rank - 1))} (or {tuple(range(1 - rank, -1))}). "
                f"Received: attention_axes={tuple(self._attention_axes)}"
            )

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        query_shape, value_shape, key_shape = base.split_shapes(
            query_shape, value_shape, key_shape
        )
        self._check_value_key(value_shape, key_shape)
        if self._output_shape:
            return tuple(query_shape[:-1]) + tuple(self._output_shape)
        return tuple(query_shape)

    def compute_output_spec(
        self, query, value=None, key=None, query_mask=None, value_mask=None,
        key_mask=None, attention_mask=None, return_attention_scores=False,
        training=None, use_causal_mask=None, mask=None, cache=None,
        cache_update_index=None,
    ):
        # The arguments of `call`, and its checks.
        cached = cache is not None or cache_update_index is not None
        if cached:
            self._refuse_masks_in_cached_call(
                (query, value, key), (query_mask, value_mask, key_mask)
            )
        query, value, key, query_mask, value_mask, key_mask = (
            base.SequenceAttention.flatten_inputs(
                query, value, key, query_mask, value_mask, key_mask, mask
            )
        )
        attention_mask = base.as_mask(attention_mask)
        if cached:
            self._check_cache(
                query, cache, cache_update_index, value, key,
                return_attention_scores,
            )
            output = keras.KerasTensor(
                self.compute_output_shape(query.shape, query.shape, query.shape),
                dtype=self.compute_dtype,
            )
            return output, keras.KerasTensor(cache.shape, dtype=cache.dtype)
        value = query if value is None else value
        key = value if key is None else key
        self._check_shapes(
            tuple(query.shape), tuple(value.shape), tuple(key.shape)
        )
        self._check_masks(
            query, value, query_mask, value_mask, key_mask, attention_mask
        )
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return output
        check_path_takes_weights(
            self.implementation, "return_attention_scores=True"
        )
        if self._flash_attention:
            raise ValueError(
                "Returning attention scores is not supported when flash "
                "attention is enabled. Please disable flash attention to access"
                " attention scores."
            )
        scores = keras.KerasTensor(
            self._scores_shape(tuple(query.shape), tuple(key.shape)),
            dtype=self.compute_dtype,
        )
        return output, scores
