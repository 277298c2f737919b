"""Attention pictures: attention maps of any model, rollout, Grad-CAM, plots."""

from keras_attention.visualization.maps import attention_layers
from keras_attention.visualization.maps import attention_maps
from keras_attention.visualization.maps import capture_attention
