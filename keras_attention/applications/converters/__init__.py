"""Converters of public checkpoints (timm, Hugging Face) to the applications.

Each family has a module (`vit`, `swin`, `bert`, `detr`); `common` reads tensors (`.safetensors`
into NumPy without torch, `.pth`/`.bin` with torch, or a torch module's
`state_dict`) and loads them all-or-nothing: every tensor is looked up,
transformed and shape-checked against its Keras variable first, and only
when nothing is missing, extra or misshapen are the variables assigned.
The applications expose them as class methods
(`VisionTransformer.from_timm`, `VisionTransformer.from_transformers`,
`TextClassifier.from_transformers`, `TextClassifierBackbone.from_transformers`,
`MaskedLanguageModel.from_transformers`, `DETR.from_transformers`).
"""

from keras_attention.applications.converters.common import TensorLoader
from keras_attention.applications.converters.common import read_checkpoint
from keras_attention.applications.converters.common import state_dict_arrays
