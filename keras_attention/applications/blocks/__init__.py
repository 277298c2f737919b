"""The blocks the applications share: Transformer encoder and decoder blocks
and the residual attention block.

Every block builds its attention layer by registry name
(`registry.build(attention, offered, attention_kwargs)`), so any registered
layer, plugins included, fits where its input kind does:

- `TransformerEncoderBlock` (ViT, Swin, the text classifier, the Transformer
  translator's encoder, DETR's encoder): self-attention then an MLP, each a
  residual branch, pre-norm (`x + f(LN(x))`) or post-norm (`LN(x + f(x))`).
  A `"tokens"` layer gets `(B, N, C)`, a `"grid"` layer the grid
  `(B, h, w, C)`.
- `TransformerDecoderBlock` (the translator's decoder, DETR's decoder):
  self-attention (causal for text), cross-attention to the encoder's output,
  MLP; with a key/value cache for step-by-step decoding.
- `ResidualAttentionBlock` (CBAM-ResNet, DETR's backbone): a ResNet basic
  block whose residual branch goes through a `"grid"` attention layer.

The blocks call a `"tokens"` layer as keras's `MultiHeadAttention` is called,
`layer(query, value=, key=, query_mask=, value_mask=, use_causal_mask=,
return_attention_scores=, training=)`, passing only the arguments its `call`
names (a layer that takes `mask` and not `query_mask` gets the padding mask
as `mask`). The dropout policy is `dropout_kind`: `"keras"` (keras's
`Dropout`) or `"hash"` (`HashDropout`, counter-based: under XLA on CPU the
backend's random generator took a quarter of a translation training step).
Every sublayer takes the block's dtype policy.
"""

from keras_attention.applications.blocks.attention_call import accepted_call_arguments
from keras_attention.applications.blocks.attention_call import call_attention
from keras_attention.applications.blocks.residual import ResidualAttentionBlock
from keras_attention.applications.blocks.residual import default_reduction
from keras_attention.applications.blocks.transformer import TransformerDecoderBlock
from keras_attention.applications.blocks.transformer import TransformerEncoderBlock
