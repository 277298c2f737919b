"""Applications: ready-made models composed from the registry's layers.

`keras_attention.applications.presets()` lists every application's presets
(`{name: Preset}`); `Class.from_preset(name)` builds one.
"""

from keras_attention.applications import presets
from keras_attention.applications.presets import preset_names

from keras_attention.applications.vision_transformer import VisionTransformer
from keras_attention.applications.vision_transformer import VisionTransformerBackbone
from keras_attention.applications.cbam_resnet import CBAMResNet
from keras_attention.applications.cbam_resnet import CBAMResNetBackbone
from keras_attention.applications.text_classifier import TextClassifier
from keras_attention.applications.text_classifier import TextClassifierBackbone
from keras_attention.applications.text_classifier import TextClassifierPreprocessor
from keras_attention.applications.node_classification import GATEarlyStopping
from keras_attention.applications.node_classification import GATNodeClassifier
from keras_attention.applications.node_classification import node_classification_data
from keras_attention.applications.translation import Translator
from keras_attention.applications.translation import load_translation_corpus
from keras_attention.applications.text_preprocessing import TranslationPreprocessor
from keras_attention.applications.text_preprocessing import corpus_bleu
from keras_attention.applications.translation_rnn import Seq2SeqTranslator
from keras_attention.applications.translation_transformer import TransformerTranslator
from keras_attention.applications.detection import DETR
from keras_attention.applications.detection_metrics import evaluate_detections
