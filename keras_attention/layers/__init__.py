"""The attention layers; importing this module registers them all."""

from keras_attention.layers.additive import AdditiveAttention
from keras_attention.layers.base import enable_lora
from keras_attention.layers.cbam import CBAM
from keras_attention.layers.cbam import ChannelAttention
from keras_attention.layers.cbam import SpatialAttention
from keras_attention.layers.dot_product import ScaledDotProductAttention
from keras_attention.layers.dropout import HashDropout
from keras_attention.layers.graph import GraphAttention
from keras_attention.layers.local_window import LocalWindowAttention
from keras_attention.layers.multi_head import MultiHeadAttention
from keras_attention.layers.non_local import NonLocalBlock
