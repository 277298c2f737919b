"""Hugging Face BERT checkpoints -> `TextClassifierBackbone` / `TextClassifier`
/ `MaskedLanguageModel`.

The config becomes the backbone's BERT layout (learned positions with
`max_position_embeddings` rows, `type_vocab_size` token types, embedding
LayerNorm, post-norm blocks, exact GELU, the [CLS] pooler, one LayerNorm
epsilon); each `Linear` weight `(out, in)` becomes a kernel `(in, out)`,
reshaped to the attention's `EinsumDense` kernels (query/key/value
`(C, H, D)`, output `(H, D, C)`). Every tensor is checked before any is
assigned (`common.TensorLoader`). The masked-LM head (`cls.predictions.*`)
maps onto keras-hub's `MaskedLMHead`: `transform.dense` -> its
`intermediate_dense`, `transform.LayerNorm` -> `intermediate_layer_norm`,
`bias` -> `output_bias`; the decoder is the word embeddings (tied).
"""

import json
import os
import re
import warnings

import numpy as np

from keras_attention.applications.converters import common

ARCHITECTURES = (
    "BertModel",
    "BertForSequenceClassification",
    "BertForMaskedLM",
    "BertForPreTraining",
)
# Pretraining heads (masked LM, next sentence) of a hub snapshot such as
# bert-base-uncased: known, and not part of the encoder.
# `MaskedLanguageModel.from_transformers` loads the masked-LM one.
_HEAD_PREFIXES = ("cls.",)
_MLM_PREFIX = "cls.predictions."
_NSP_PREFIX = "cls.seq_relationship."
# The masked-LM decoder's copies (tied in Hugging Face; `save_pretrained`
# drops them) and what each must equal.
_TIED = {
    _MLM_PREFIX + "decoder.weight": "embeddings.word_embeddings.weight",
    _MLM_PREFIX + "decoder.bias": _MLM_PREFIX + "bias",
}
# Older checkpoints: TensorFlow's LayerNorm names, and position-id buffers.
_RENAMES = [(r"\.gamma$", ".weight"), (r"\.beta$", ".bias")]
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _unsupported(option, value, hint=""):
    return ValueError(
        f"The BERT config option {option}={value!r} is not covered by "
        f"TextClassifier.from_transformers{hint}."
    )


def backbone_arguments(config, sequence_length=None):
    """`TextClassifierBackbone` arguments of a Hugging Face `BertConfig` dict."""
    model_type = config.get("model_type")
    if model_type != "bert":
        raise ValueError(
            "Expected a Hugging Face BERT (model_type 'bert'; architectures "
            f"{ARCHITECTURES}). Received: model_type={model_type!r}, "
            f"architectures={config.get('architectures')}"
        )
    for option in ("vocab_size", "hidden_size", "num_hidden_layers",
                   "num_attention_heads", "intermediate_size",
                   "max_position_embeddings"):
        if option not in config:
            raise ValueError(f"The BERT config has no {option!r}.")
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise _unsupported("hidden_act", act, " (exact 'gelu' only)")
    position = config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise _unsupported("position_embedding_type", position)
    if config.get("pad_token_id", 0) != 0:
        raise _unsupported(
            "pad_token_id", config["pad_token_id"], " (padding is id 0 here)"
        )
    for option in ("is_decoder", "add_cross_attention"):
        if config.get(option):
            raise _unsupported(option, True)
    max_positions = config["max_position_embeddings"]
    if sequence_length is None:
        sequence_length = max_positions
    if not isinstance(sequence_length, int) or not 0 < sequence_length <= max_positions:
        raise ValueError(
            "Received an invalid value for argument `sequence_length`, "
            f"expected an integer in [1, {max_positions}] (the config's "
            f"max_position_embeddings). Received: sequence_length={sequence_length!r}"
        )
    return dict(
        vocabulary_size=config["vocab_size"],
        sequence_length=sequence_length,
        hidden_dim=config["hidden_size"],
        depth=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        mlp_dim=config["intermediate_size"],
        dropout=config.get("hidden_dropout_prob", 0.1),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        token_types=config.get("type_vocab_size", 2),
        max_positions=max_positions,
        embedding_norm=True,
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        norm_first=False,
        final_norm=False,
        pooling="cls",
    )


def read_source(source):
    """`(config, tensors, name, vocabulary)` of a BERT module or folder."""
    config, tensors, name = common.read_transformers_source(source, ARCHITECTURES)
    vocabulary = None
    if not common.is_torch_module(source):
        vocabulary = os.path.join(source, "vocab.txt")
        vocabulary = vocabulary if os.path.isfile(vocabulary) else None
    return config, tensors, name, vocabulary


def _canonical(tensors):
    """Hub names without the `bert.` prefix, old LayerNorm names renamed."""
    out = {}
    for name, value in tensors.items():
        for pattern, replacement in _RENAMES:
            name = re.sub(pattern, replacement, name)
        out[name[len("bert."):] if name.startswith("bert.") else name] = value
    return out


def _fill_backbone(backbone, loader, warn_no_pooler=True):
    """Queues every variable of a BERT-layout backbone in `loader`.

    A checkpoint without the `[CLS]` pooler (`BertForMaskedLM`, or
    `BertModel(add_pooling_layer=False)`) leaves the backbone's initial
    pooler, with a warning when `warn_no_pooler` (as Hugging Face warns of
    newly initialised weights): a classifier fine-tunes it.
    """
    embedding = backbone.get_layer("embedding")
    loader.take("embeddings.word_embeddings.weight", embedding.token_embedding.embeddings)
    loader.take("embeddings.position_embeddings.weight", embedding.position_embedding)
    loader.take(
        "embeddings.token_type_embeddings.weight",
        embedding.token_type_embedding.embeddings,
    )
    common.take_norm(loader, "embeddings.LayerNorm", embedding.norm)
    for index, block in enumerate(common.encoder_blocks(backbone)):
        prefix = f"encoder.layer.{index}."
        attention = block.attention_layer
        heads_shape = tuple(attention._query_dense.kernel.shape)  # (C, H, D)
        for role, dense in (
            ("query", attention._query_dense),
            ("key", attention._key_dense),
            ("value", attention._value_dense),
        ):
            name = prefix + "attention.self." + role
            loader.take(
                name + ".weight", dense.kernel,
                common.linear_as(heads_shape),
            )
            loader.take(
                name + ".bias", dense.bias,
                common.bias_as(heads_shape[1:]),
            )
        out = attention._output_dense
        loader.take(
            prefix + "attention.output.dense.weight", out.kernel,
            common.linear_as(out.kernel.shape),
        )
        loader.take(prefix + "attention.output.dense.bias", out.bias)
        common.take_norm(loader, prefix + "attention.output.LayerNorm", block.attention_norm)
        common.take_linear(loader, prefix + "intermediate.dense", block.mlp_hidden)
        common.take_linear(loader, prefix + "output.dense", block.mlp_output)
        common.take_norm(loader, prefix + "output.LayerNorm", block.mlp_norm)
    if "pooler.dense.weight" in loader.tensors:
        common.take_linear(loader, "pooler.dense", backbone.get_layer("pooler").dense)
    elif warn_no_pooler:
        warnings.warn(
            f"{loader.source} has no pooler ('pooler.dense.*'; a "
            "BertForMaskedLM?): the backbone's pooler is newly initialised; "
            "fine-tune it before using the pooled output.",
            stacklevel=3,
        )


def _check_config(config, tensors, arguments):
    """A config that disagrees with the tensors' shapes, named."""
    expected = {
        "embeddings.word_embeddings.weight": (
            arguments["vocabulary_size"], arguments["hidden_dim"]
        ),
        "embeddings.position_embeddings.weight": (
            arguments["max_positions"], arguments["hidden_dim"]
        ),
        "embeddings.token_type_embeddings.weight": (
            arguments["token_types"], arguments["hidden_dim"]
        ),
        "encoder.layer.0.intermediate.dense.weight": (
            arguments["mlp_dim"], arguments["hidden_dim"]
        ),
    }
    for name, shape in expected.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"The config disagrees with tensor {name!r}: the config gives "
                f"{shape}, the tensor has {tuple(tensors[name].shape)} "
                "(no weight was assigned)."
            )
    layers = {int(m.group(1)) for n in tensors for m in [re.match(r"encoder\.layer\.(\d+)\.", n)] if m}
    if layers and len(layers) != arguments["depth"]:
        raise ValueError(
            f"The config disagrees with the tensors: num_hidden_layers="
            f"{arguments['depth']}, the checkpoint has {len(layers)} layers "
            "(no weight was assigned)."
        )


def _prepare(source, sequence_length, kwargs, heads=_HEAD_PREFIXES):
    """The checked config and tensors; `ignore` holds the buffers and the
    tensors of the pretraining `heads` (name prefixes) left out."""
    config, tensors, name, vocabulary = read_source(source)
    arguments = common.with_overrides(
        backbone_arguments(config, sequence_length), kwargs
    )
    tensors = _canonical(tensors)
    _check_config(config, tensors, arguments)
    ignore = [n for n in tensors if n.startswith(heads) or n in _BUFFERS]
    return config, tensors, name, vocabulary, arguments, ignore


def _preprocessor(vocabulary, config, arguments):
    if vocabulary is None:
        return None
    from keras_attention.applications.bert_preprocessor import BertPreprocessor

    # Hugging Face keeps the tokenizer's casing in tokenizer_config.json
    # beside vocab.txt (a cased BERT: do_lower_case false); the model's
    # config.json does not hold it. BertTokenizer's defaults otherwise.
    tokenizer = {}
    path = os.path.join(os.path.dirname(vocabulary), "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            tokenizer = json.load(file)
    lowercase = tokenizer.get("do_lower_case", config.get("do_lower_case", True))
    return BertPreprocessor(
        vocabulary,
        sequence_length=arguments["sequence_length"],
        lowercase=lowercase,
        strip_accents=tokenizer.get("strip_accents"),
    )


def backbone_from_transformers(cls, source, sequence_length=None, **kwargs):
    """See `TextClassifierBackbone.from_transformers`."""
    _, tensors, name, _, arguments, ignore = _prepare(source, sequence_length, kwargs)
    ignore += ["classifier.weight", "classifier.bias"]
    backbone = cls(**arguments)
    loader = common.TensorLoader(tensors, name, ignore=ignore)
    _fill_backbone(backbone, loader)
    loader.load()
    return backbone


def classifier_from_transformers(
    cls, source, num_classes=None, sequence_length=None, **kwargs
):
    """See `TextClassifier.from_transformers`."""
    config, tensors, name, vocabulary, arguments, ignore = _prepare(
        source, sequence_length, kwargs
    )
    head = tensors.get("classifier.weight")
    source_classes = 0 if head is None else int(head.shape[0])
    if num_classes is None and not source_classes:
        raise ValueError(
            "The checkpoint has no classification head; pass `num_classes` "
            "for a new one. Received: num_classes=None"
        )
    if num_classes is None:  # 0 is not None: the classifier refuses it
        num_classes = source_classes
    regression = config.get("problem_type") == "regression" or (
        source_classes == 1 and config.get("problem_type") is None
    )  # Hugging Face's reading of one label
    if regression and num_classes == source_classes:
        raise ValueError(
            "The checkpoint's head is a regression head (num_labels="
            f"{source_classes}, problem_type={config.get('problem_type')!r}); "
            "TextClassifier classifies: pass `num_classes` for a new "
            f"classification head on its encoder. Received: num_classes={num_classes}"
        )
    load_head = num_classes == source_classes
    if not load_head:
        ignore += ["classifier.weight", "classifier.bias"]
    head_dropout = config.get("classifier_dropout")
    if head_dropout is None:
        head_dropout = arguments["dropout"]
    backbone = cls.backbone_class(**arguments, name="backbone")
    model = cls(
        backbone=backbone,
        num_classes=num_classes,
        head_dropout=head_dropout,
        preprocessor=_preprocessor(vocabulary, config, arguments),
    )
    loader = common.TensorLoader(tensors, name, ignore=ignore)
    _fill_backbone(backbone, loader)
    if load_head:
        common.take_linear(loader, "classifier", model.get_layer("predictions"))
    loader.load()
    return model


def _check_masked_lm_head(tensors, name):
    """The tied decoder copies present (checked equal), or a `ValueError`:
    no masked-LM head, or an untied decoder that differs."""
    if not any(n.startswith(_MLM_PREFIX) for n in tensors):
        raise ValueError(
            f"{name} has no masked-LM head (no '{_MLM_PREFIX}*' tensors; a "
            "BertModel or BertForSequenceClassification?). "
            "MaskedLanguageModel.from_transformers needs a BertForMaskedLM "
            "or BertForPreTraining; TextClassifierBackbone.from_transformers "
            "takes the encoder alone."
        )
    tied = []
    for copy, original in _TIED.items():
        if copy not in tensors or original not in tensors:
            continue  # a missing original is named by the loader
        a, b = tensors[copy], tensors[original]
        if a.shape != b.shape or not np.array_equal(a, b):
            raise ValueError(
                f"{name}: tensor {copy!r} differs from {original!r}. The "
                "MaskedLMHead ties its output projection to the word "
                "embeddings (and its bias to the head's bias); an untied "
                "decoder is not covered (no weight was assigned)."
            )
        tied.append(copy)
    return tied


def masked_lm_from_transformers(
    cls, source, sequence_length=None, mask_length=None, **kwargs
):
    """See `MaskedLanguageModel.from_transformers`."""
    config, tensors, name, vocabulary, arguments, ignore = _prepare(
        source, sequence_length, kwargs, heads=(_NSP_PREFIX,)
    )
    ignore += _check_masked_lm_head(tensors, name)
    backbone = cls.backbone_class(**arguments, name="backbone")
    model = cls(
        backbone,
        mask_length=mask_length,
        preprocessor=_preprocessor(vocabulary, config, arguments),
    )
    loader = common.TensorLoader(tensors, name, ignore=ignore)
    # BertForMaskedLM has no pooler: the backbone keeps its initial one
    # (the masked LM does not use it; `with_head` fine-tunes it).
    _fill_backbone(backbone, loader, warn_no_pooler=False)
    head = model.get_layer("mlm_head")
    common.take_linear(loader, _MLM_PREFIX + "transform.dense", head._intermediate_dense)
    common.take_norm(
        loader, _MLM_PREFIX + "transform.LayerNorm", head._intermediate_layer_norm
    )
    loader.take(_MLM_PREFIX + "bias", head._bias)
    loader.load()
    return model
