"""Applications: ready-made models composed from the registry's layers."""

from keras_attention.applications.vision_transformer import VisionTransformer
from keras_attention.applications.vision_transformer import VisionTransformerBackbone
