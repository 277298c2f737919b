"""Attention pictures: attention maps of any model, rollout, Grad-CAM, plots.

- `attention_maps(model, inputs)`: every registry attention layer's weights
  for one forward pass, keyed by the layer's path, from any Keras model
  (`Sequential`, functional, nested, subclassed) without changing it;
  `window_attention_on_grid` lays a Swin layer's per-window maps out over
  its input's grid.
- `attention_rollout(model, images)`: Abnar & Zuidema's rollout of a
  Vision Transformer, on the patch grid.
- `grad_cam(model, images, method=...)`: Grad-CAM, Grad-CAM++ and Score-CAM
  (tf-keras-vis on TensorFlow, or the same formulas on the backend's own
  gradients where tf-keras-vis cannot reach the feature map or on JAX and
  torch), for CNNs and ViTs.
- `explore(model, inputs, path)`: one self-contained HTML page to explore
  the attention interactively (tokens, images, DETR boxes, graphs).
- `plot_attention_heatmap`, `plot_image_overlay`, `plot_detections`,
  `plot_graph_attention`: Matplotlib figures (Agg), saved as PNG with `path`.

Everything is written on `keras` and NumPy (and SciPy for the maps'
upsampling) and runs on the TensorFlow, JAX and torch backends (the same
maps for the same weights, tested); only `grad_cam` on TensorFlow goes
through tf-keras-vis where it applies.
"""

from keras_attention.visualization.cam import find_cam_target
from keras_attention.visualization.cam import grad_cam
from keras_attention.visualization.explorer import explore
from keras_attention.visualization.maps import attention_layers
from keras_attention.visualization.maps import attention_maps
from keras_attention.visualization.maps import capture_attention
from keras_attention.visualization.maps import window_attention_on_grid
from keras_attention.visualization.plots import plot_attention_heatmap
from keras_attention.visualization.plots import plot_detections
from keras_attention.visualization.plots import plot_graph_attention
from keras_attention.visualization.plots import plot_image_overlay
from keras_attention.visualization.rollout import attention_rollout
from keras_attention.visualization.rollout import rollout_matrices
