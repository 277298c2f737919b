"""The attention core shared by every layer, on `keras.ops` only.

Shape letters, used everywhere in keras_attention: `B` batch, `T` query
length, `S` key length, `H` query heads, `K` key/value heads (grouped-query
attention, `H % K == 0`), `D` head size, `E` edges, `N` nodes.

One module per topic:

- `masks`: `masked_softmax` (float32 whatever the input dtype, or in the
  input's with `float32=False`, as the bfloat16 core does; a row whose
  entries are all masked gives zeros, never NaN), `segment_softmax`
  (softmax over groups of entries, a graph's incoming edges), `causal_mask`,
  `sliding_window_mask` (keras's band, causal or symmetric).
- `dispatch`: `dot_product_attention`, scaled dot-product attention with
  padding masks, an arbitrary boolean mask, a causal flag, an additive bias,
  dropout on the weights and optionally the weights themselves (taken before
  dropout). It checks its inputs once and takes the backend's fused kernel
  (`fused_attention`), the blocked or the chunked path for long sequences,
  or the dense path with its own backward pass (`dense_custom_gradient`).
- `dense`: the dense core with its own backward pass, whole or over chunks
  of queries with the weights recomputed (the chunked path: `O(rows * S)`
  memory, the dense core's large products).
- `autotune`: which of the dense, blocked and chunked paths
  `implementation="auto"` takes for a long sequence, measured per machine
  and shape at the first call (`dispatch_choices()` says what it picked and
  why; `set_autotune`), and whether TensorFlow runs its oneDNN kernels
  (`onednn_status()`).
- `choice_file`: measured choices kept in a JSON file for later processes
  on the same machine (opt-in: `set_autotune(cache_file=...)`).
- `timing`: how `autotune` times a candidate path (the best of a few
  calls, a losing path timed once), its whole measurement on JAX, and one
  measurement at a time in a process, its state each thread's own.
- `blocked`: `blocked_attention`, key blocks with an online softmax and
  recomputation in the backward pass; never holds the `T x S` scores. With
  `sliding_window` each query block visits only the key blocks its band
  meets: `O(T * window)` work. On TensorFlow on a CPU outside XLA (a plain
  `tf.function`, eager) its forward and backward passes each run as their
  own XLA computation (`xla_cpu.compiles_blocked_core`; recorded in
  `dispatch_choices()`).
- `xla_cpu`: forms XLA's CPU backend runs faster than the simple ones.
- `gradients`: `custom_gradient`, how every core above gets its own
  backward pass (keras's, without TensorFlow's registry entry per trace).
- `positions`: `rotary_embedding` (RoPE, the half-split rotation of
  LLaMA and keras-hub) and `alibi_slopes` (ALiBi's per-head slopes).
- `random`: `hash_bits`, `hash_dropout`, counter-based random bits and
  dropout masks that XLA fuses (the backend's generator is slow under XLA on
  CPU); the attention core's dropout when a seed is given.
"""

from keras_attention.ops.autotune import clear_dispatch_choices
from keras_attention.ops.autotune import dispatch_choices
from keras_attention.ops.autotune import onednn_status
from keras_attention.ops.autotune import set_autotune
from keras_attention.ops.blocked import DEFAULT_BLOCK_SIZE
from keras_attention.ops.blocked import DEFAULT_QUERY_BLOCK_SIZE
from keras_attention.ops.blocked import blocked_attention
from keras_attention.ops.dispatch import DENSE_THRESHOLD
from keras_attention.ops.dispatch import dense_custom_gradient
from keras_attention.ops.dispatch import dot_product_attention
from keras_attention.ops.dispatch import fused_attention
from keras_attention.ops.dispatch import set_dense_custom_gradient
from keras_attention.ops.masks import causal_mask
from keras_attention.ops.masks import masked_softmax
from keras_attention.ops.masks import segment_softmax
from keras_attention.ops.masks import sliding_window_mask
from keras_attention.ops.positions import alibi_slopes
from keras_attention.ops.positions import rotary_embedding
from keras_attention.ops.random import hash_bits
from keras_attention.ops.random import hash_dropout

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_QUERY_BLOCK_SIZE",
    "DENSE_THRESHOLD",
    "alibi_slopes",
    "blocked_attention",
    "causal_mask",
    "clear_dispatch_choices",
    "dispatch_choices",
    "dense_custom_gradient",
    "dot_product_attention",
    "fused_attention",
    "hash_bits",
    "hash_dropout",
    "masked_softmax",
    "onednn_status",
    "rotary_embedding",
    "segment_softmax",
    "set_autotune",
    "sliding_window_mask",
    "set_dense_custom_gradient",
]
