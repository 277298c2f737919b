"""Training helpers the published recipes use: budgets, schedules, recipes.

Every figure of the README comes from library code here that the
benchmarks call, so a user reproduces a recipe with the library alone:

- `budget`: `cpu_seconds()` and the `TimeBudget` callback (a wall-clock
  and/or CPU-time budget, the fraction spent for budget-aware schedules);
- `schedules`: `BudgetLinearDecay` (warm-up, constant, linear decay as the
  budget ends), `InverseSqrt` (Vaswani et al.), `KeepBest`;
- `image_classification`: the recipes of the shipped digit presets
  (`IMAGE_RECIPES`, `fit_image_classifier`, `random_shift`,
  `train_image_preset`);
- `detection`: DETR's optimizer (`detr_optimizer`);
- `causal_lm`: the language model's recipe (`CAUSAL_LM_RECIPES`,
  `fit_causal_lm`, `date_completion_accuracy`, `train_causal_lm_preset`);
- `translation`: `fit_translator` (a budgeted `fit`), `bucketed_batches`,
  and the date-task presets' recipe (`TRANSLATION_RECIPES`,
  `train_translator_preset`);
- `pretraining`: BERT's masked-LM pretraining on a text folder
  (`pretrain_masked_lm`, `read_text_folder`, `masked_lm_metrics`).
"""

from keras_attention.training.budget import TimeBudget
from keras_attention.training.budget import cpu_seconds
from keras_attention.training.causal_lm import CAUSAL_LM_RECIPES
from keras_attention.training.causal_lm import date_completion_accuracy
from keras_attention.training.causal_lm import fit_causal_lm
from keras_attention.training.causal_lm import train_causal_lm_preset
from keras_attention.training.detection import detr_optimizer
from keras_attention.training.image_classification import IMAGE_RECIPES
from keras_attention.training.image_classification import accuracy
from keras_attention.training.image_classification import digits_for_preset
from keras_attention.training.image_classification import fit_image_classifier
from keras_attention.training.image_classification import random_shift
from keras_attention.training.image_classification import train_image_preset
from keras_attention.training.schedules import BudgetLinearDecay
from keras_attention.training.schedules import InverseSqrt
from keras_attention.training.schedules import KeepBest
from keras_attention.training.translation import bucketed_batches
from keras_attention.training.translation import TRANSLATION_RECIPES
from keras_attention.training.translation import fit_translator
from keras_attention.training.translation import train_translator_preset
from keras_attention.training.pretraining import masked_lm_metrics
from keras_attention.training.pretraining import pretrain_masked_lm
from keras_attention.training.pretraining import read_text_folder
