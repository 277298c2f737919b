"""keras_attention: attention layers, applications and attention pictures for Keras 3.

```python
import keras
import keras_attention

model = keras.Sequential([
    keras.Input((16, 32)),
    keras_attention.layers.MultiHeadAttention(num_heads=4, key_dim=8),
])
keras_attention.names()  # every registered layer name, plugins included
layer = keras_attention.get("additive", units=16)
```

The applications and the training schedules are imported with the package
(~0.3 s), so that a `.keras` file of an application (or of an optimizer
with one of the schedules) loads after `import keras_attention`, as keras-hub's
files do after `import keras_hub`; with them come `keras_attention.datasets`
(GAT's neighbour sampling, the pretraining's files) and
`keras_attention.matching` (DETR's loss). `keras_attention.visualization` is
imported on first use.
"""

import importlib

from keras_attention import _startup

# Before keras (so TensorFlow) loads: see `_startup`.
_startup.before_tensorflow()

from keras_attention.version import __version__
from keras_attention.registry import (
    discover_plugins, get, get_class, names, register, unregister,
)
from keras_attention import ops
from keras_attention import layers
from keras_attention.layers import *  # noqa: F401,F403  (the layer classes)
# Their classes register with keras's serialization.
from keras_attention import applications
from keras_attention import training

_LAZY_MODULES = ("datasets", "visualization", "matching")


def __getattr__(name):
    if name in _LAZY_MODULES:
        return importlib.import_module(f"keras_attention.{name}")
    raise AttributeError(f"module 'keras_attention' has no attribute {name!r}")
