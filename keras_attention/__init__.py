"""keras_attention: attention layers, applications and attention pictures for Keras 3."""

from keras_attention.version import __version__
from keras_attention.registry import get, names, register
