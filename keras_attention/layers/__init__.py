"""The attention layers; importing this module registers them all."""

from keras_attention.layers.multi_head import MultiHeadAttention
