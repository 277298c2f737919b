"""Attention pictures: attention maps of any model, rollout, Grad-CAM, plots."""

from keras_attention.visualization.maps import attention_layers
from keras_attention.visualization.maps import attention_maps
from keras_attention.visualization.maps import capture_attention
from keras_attention.visualization.rollout import attention_rollout
from keras_attention.visualization.rollout import rollout_matrices
from keras_attention.visualization.cam import find_cam_target
from keras_attention.visualization.cam import grad_cam
from keras_attention.visualization.plots import plot_attention_heatmap
from keras_attention.visualization.plots import plot_detections
from keras_attention.visualization.plots import plot_graph_attention
from keras_attention.visualization.plots import plot_image_overlay
