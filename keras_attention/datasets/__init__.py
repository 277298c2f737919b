"""Embedded datasets and loaders for standard formats.

Embedded defaults need no download: generated tasks (dates, sentiment,
detection) and data shipped by dependencies (scikit-learn's digits,
networkx's karate club). Larger real sets are read from a path: Planetoid
citation graphs, graphs saved as NumPy/CSV arrays (OGB layout included),
MNIST IDX files, line-aligned parallel corpora and plain text for
language models (`load_text_corpus`). `make_graph` generates
graphs of any size; `NeighborSampler` samples sub-graphs around seed nodes.
All of this is NumPy and the standard library; nothing here imports
TensorFlow or Keras.
"""

from keras_attention.datasets._files import DataFileNotFoundError
from keras_attention.datasets.dates import DATE_FORMATS
from keras_attention.datasets.dates import date_alignment
from keras_attention.datasets.dates import format_date
from keras_attention.datasets.dates import make_date_task
from keras_attention.datasets.dates import parse_date
from keras_attention.datasets.dates import split_date_task
from keras_attention.datasets.detection import DetectionSet
from keras_attention.datasets.detection import DIGIT_NAMES
from keras_attention.datasets.detection import PAD_LABEL
from keras_attention.datasets.detection import SHAPE_NAMES
from keras_attention.datasets.detection import box_to_mask
from keras_attention.datasets.detection import cxcywh_to_xyxy
from keras_attention.datasets.detection import make_detection_set
from keras_attention.datasets.detection import place_digit_on_canvas
from keras_attention.datasets.graphs import GraphData
from keras_attention.datasets.graphs import RestrictedUnpickler
from keras_attention.datasets.graphs import load_karate_club
from keras_attention.datasets.graphs import load_planetoid
from keras_attention.datasets.graphs import normalize_rows
from keras_attention.datasets.graphs import restricted_load
from keras_attention.datasets.images import load_digits_images
from keras_attention.datasets.images import load_mnist_idx
from keras_attention.datasets.images import load_mnist_t10k_split
from keras_attention.datasets.images import read_idx
from keras_attention.datasets.images import resize_images
from keras_attention.datasets.images import split_first_last
from keras_attention.datasets.images import stratified_split
from keras_attention.datasets.text import make_sentiment_task
from keras_attention.datasets.text import sentiment_vocabulary
from keras_attention.datasets.text_corpus import date_lines
from keras_attention.datasets.text_corpus import load_text_corpus
from keras_attention.datasets.translation import load_parallel_corpus
from keras_attention.datasets.translation import make_date_corpus
from keras_attention.datasets.graph_files import load_graph_files
from keras_attention.datasets.graph_generation import make_graph
from keras_attention.datasets.sampling import NeighborSampler
from keras_attention.datasets.sampling import SampledGraph
