"""`MultiHeadAttention`'s position encodings: rotary embeddings of the
query and key heads (RoPE) and ALiBi's per-head distance penalty."""

from keras import ops

from keras_attention._validation import invalid
from keras_attention.ops import positions

POSITION_ENCODINGS = (None, "rope", "alibi")


def check_position_arguments(
    position_encoding, rope_max_wavelength, rope_scaling_factor, alibi_bias_max
):
    """Raise keras's `ValueError` for a bad position-encoding argument."""
    if position_encoding not in POSITION_ENCODINGS:
        raise invalid(
            "position_encoding", f"one of {POSITION_ENCODINGS}",
            position_encoding,
        )
    for name, number in (
        ("rope_max_wavelength", rope_max_wavelength),
        ("rope_scaling_factor", rope_scaling_factor),
        ("alibi_bias_max", alibi_bias_max),
    ):
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not number > 0
        ):
            raise invalid(name, "a positive number", number)


class PositionEncodings:
    """RoPE and ALiBi of `MultiHeadAttention` (`position_encoding`)."""

    def _check_position_shapes(self, query_shape):
        if self.position_encoding and len(query_shape) != 3:
            raise ValueError(
                f"position_encoding={self.position_encoding!r} needs "
                "sequences `(B, T, dim)`. Received: "
                f"query.shape={tuple(query_shape)}"
            )
        if self.position_encoding == "rope" and self._key_dim % 2:
            raise invalid(
                "key_dim", "an even head size for rotary embeddings",
                self._key_dim,
            )

    def _encode_positions(self, q, k, extra, own_core, q_start=0, k_start=0):
        """RoPE rotates the heads; ALiBi's slopes go to the core."""
        if self.position_encoding == "rope":
            rope = dict(
                max_wavelength=self.rope_max_wavelength,
                scaling_factor=self.rope_scaling_factor,
            )
            q = positions.rotary_embedding(q, start_index=q_start, **rope)
            k = positions.rotary_embedding(k, start_index=k_start, **rope)
        elif self.position_encoding == "alibi":
            if not own_core:
                raise ValueError(
                    "position_encoding='alibi' needs keras_attention's "
                    "`_compute_attention`; a subclass overrides it."
                )
            extra["alibi_slopes"] = positions.alibi_slopes(
                self._num_heads, self.alibi_bias_max
            )
        return q, k, extra
