"""BERT's recipe on your own text: masked-LM pretraining, then fine-tuning.

`pretrain_masked_lm(texts_or_folder)` learns a WordPiece vocabulary from
unlabelled text (or takes a preprocessor, e.g. a converted BERT's), masks
15 % of the word pieces (80 % `[MASK]`, 10 % random, 10 % kept, as BERT's
reference code, drawn from the seed) and trains a `MaskedLanguageModel` on them; its
`with_head(num_classes)` is the classifier to fine-tune on the labelled few.
"""

import os

import keras
import numpy as np

from keras_attention import _validation as base
from keras_attention._writing import write_atomically
from keras_attention.datasets._files import DataFileNotFoundError

MASK = "[MASK]"


def read_text_folder(path, suffixes=(".txt",)):
    """Every non-empty line of every text file under `path`, in path order.

    Args:
        path: a folder (searched recursively) or one text file.
        suffixes: the file endings read.

    Returns:
        A list of strings, one per line.

    Raises:
        ValueError: no such path (a `FileNotFoundError` too), or no line
            of text in it.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(path)
            for name in names
            if name.endswith(tuple(suffixes))
        )
    else:
        raise DataFileNotFoundError(
            2,
            "Received an invalid value for argument `texts`: no such file or "
            "folder (texts themselves are passed as a list of strings)",
            path,
        )
    texts = []
    for name in files:
        # "utf-8-sig": a byte-order mark (Notepad's UTF-8) is not text.
        try:
            with open(name, encoding="utf-8-sig") as f:
                texts.extend(line.strip() for line in f if line.strip())
        except UnicodeDecodeError as error:
            raise ValueError(
                f"Received an invalid value for argument `texts`, expected "
                f"UTF-8 text files. The file {name} is not UTF-8: {error}"
            ) from None
    if not texts:
        raise ValueError(
            f"Received an invalid value for argument `texts`, expected text "
            f"files ({', '.join(suffixes)}) with lines of text. Received: "
            f"texts={path!r}"
        )
    return texts


def _ids(preprocessor, texts):
    """`(token_ids, token_type_ids or None, unselectable ids, mask id)`."""
    ids = preprocessor(texts)
    if isinstance(ids, dict):  # a BertPreprocessor: never mask [CLS]/[SEP]
        unselectable = (0, preprocessor.cls_id, preprocessor.sep_id)
        return ids["token_ids"], ids["token_type_ids"], unselectable, preprocessor.mask_id
    vocabulary = list(preprocessor.vocabulary)
    mask_id = vocabulary.index(MASK) if MASK in vocabulary else None
    return ids, None, (0,), mask_id


def _check_maskable(argument, token_ids, unselectable):
    """A `ValueError` naming `argument` when no word piece of its texts can
    be masked (empty texts): there would be nothing to predict, and Keras
    reports a loss of 0 for a batch without weights."""
    if not np.isin(token_ids, unselectable, invert=True).any():
        raise ValueError(
            f"Received an invalid value for argument `{argument}`, expected "
            "texts with word pieces to mask (every text is empty). Received: "
            f"{len(token_ids)} texts"
        )


def pretrain_masked_lm(
    texts,
    preprocessor=None,
    backbone=None,
    vocabulary_size=1000,
    sequence_length=32,
    epochs=10,
    batch_size=32,
    learning_rate=1e-3,
    mask_rate=0.15,
    validation_texts=None,
    seed=0,
    callbacks=None,
    verbose="auto",
    jit_compile="auto",
    **backbone_kwargs,
):
    """Masked-LM pretraining of a text encoder on unlabelled text.

    Args:
        texts: a list of strings, or a folder (every line of its `.txt`
            files is a text; see `read_text_folder`).
        preprocessor: a `TextClassifierPreprocessor` whose vocabulary holds
            `"[MASK]"`, or a `BertPreprocessor`; `None` learns one from
            `texts` (`vocabulary_size`, `sequence_length`).
        backbone: a `TextClassifierBackbone` to (continue to) pretrain,
            with the `preprocessor` of its vocabulary; `None` builds one
            from `backbone_kwargs`.
        epochs, batch_size, learning_rate: of AdamW.
        mask_rate: the share of word pieces predicted (BERT: 0.15).
        validation_texts: texts whose masked-LM loss and accuracy are
            reported each epoch (`val_loss`, `val_accuracy`).
        seed: seeds the weights, the shuffles and the masks, through
            `keras.utils.set_random_seed(seed)`: the Python, NumPy and
            TensorFlow global seeds are left set to it.
        callbacks, verbose: as `fit`'s.
        jit_compile: as `compile`'s.
        **backbone_kwargs: `TextClassifierBackbone` arguments.

    Returns:
        `(model, history)`: the `MaskedLanguageModel` (holding the
        preprocessor; `model.with_head(num_classes)` is the classifier to
        fine-tune) and `fit`'s history.

    Example:

    ```python
    model, history = pretrain_masked_lm("my_texts/", epochs=5, hidden_dim=64)
    classifier = model.with_head(num_classes=2)
    classifier.compile(optimizer="adam")
    classifier.fit(classifier.preprocessor(labelled_texts), labels)
    ```
    """
    from keras_attention.applications.masked_lm import MaskedLanguageModel
    from keras_attention.applications.masked_lm import masked_lm_dataset
    from keras_attention.applications.text_classifier import TextClassifierBackbone
    from keras_attention.applications.text_classifier import TextClassifierPreprocessor

    if isinstance(texts, (str, os.PathLike)):
        texts = read_text_folder(texts)
    texts = base.check_texts(texts)
    if preprocessor is None and backbone is not None:
        # A vocabulary learned here would give the backbone's embedding rows
        # other pieces than those it was trained on.
        raise ValueError(
            "Received an invalid value for argument `preprocessor`, expected "
            "the preprocessor whose vocabulary the given `backbone` was "
            "built for (e.g. `preprocessor=bert.preprocessor` with "
            "`backbone=bert.backbone`); without a backbone, one is learned "
            "from `texts`. Received: preprocessor=None"
        )
    if preprocessor is None:
        preprocessor = TextClassifierPreprocessor.from_texts(
            texts, vocabulary_size, sequence_length, special_tokens=(MASK,)
        )
    token_ids, token_types, unselectable, mask_id = _ids(preprocessor, texts)
    _check_maskable("texts", token_ids, unselectable)
    if mask_id is None:
        raise base.invalid(
            "preprocessor", f"a vocabulary with {MASK!r}",
            list(preprocessor.vocabulary)[:5],
        )
    keras.utils.set_random_seed(seed)
    if backbone is None:
        backbone = TextClassifierBackbone(
            vocabulary_size=preprocessor.vocabulary_size,
            sequence_length=preprocessor.sequence_length,
            **backbone_kwargs,
        )
    model = MaskedLanguageModel(backbone, preprocessor=preprocessor)

    def dataset(ids, types, training):
        return masked_lm_dataset(
            ids, mask_id, vocabulary_size=backbone.vocabulary_size,
            batch_size=batch_size, mask_rate=mask_rate,
            mask_length=model.mask_length, unselectable_ids=unselectable,
            token_type_ids=types, shuffle=training, seed=seed,
            remask_each_epoch=training,  # validation: the same masks
        )

    validation = None
    if validation_texts is not None:
        ids, types, _, _ = _ids(preprocessor, base.check_texts(validation_texts))
        _check_maskable("validation_texts", ids, unselectable)
        validation = dataset(ids, types, training=False)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.01),
        jit_compile=jit_compile,
    )
    history = model.fit(
        dataset(token_ids, token_types, training=True),
        validation_data=validation,
        epochs=epochs,
        callbacks=callbacks,
        verbose=verbose,
        shuffle=False,  # the dataset reshuffles itself every epoch
    )
    return model, history


# The embedded recipe's test sentences come from this generator seed
# whatever `--seed` is, and no training sentence is one of them.
TEST_SEED = 1
# The other splits' generator seeds are `seed` plus these.
_SPLIT_OFFSETS = {"labelled": 0, "pretraining": 10}


def sentiment_split(split, num_samples, seed):
    """`(sentences, labels)` of the embedded recipe's `split`: `"test"`
    (fixed), `"labelled"` or `"pretraining"` (from `seed`), the last two
    without any sentence of the test split (the generator repeats some
    sentences across seeds, and `--seed 1` would draw the test stream)."""
    from keras_attention import datasets

    if split == "test":
        return datasets.make_sentiment_task(num_samples, seed=TEST_SEED)
    held_out = set(sentiment_split("test", 1000, seed)[0])
    count = num_samples
    while True:
        texts, labels = datasets.make_sentiment_task(
            count + len(held_out), seed=seed + _SPLIT_OFFSETS[split]
        )
        keep = [i for i, text in enumerate(texts) if text not in held_out]
        if len(keep) >= num_samples:
            keep = keep[:num_samples]
            return [texts[i] for i in keep], labels[np.asarray(keep)]
        count *= 2


def run_recipe(data, epochs, out, seed, quick=False, verbose="auto", name="pretraining"):
    """`keras-attention run pretraining`: pretrain, save, and fine-tune.

    Masked-LM pretraining on `data` (a folder of .txt files, a text per
    line; `None`: the embedded sentiment sentences without their labels);
    on the embedded data, the pretrained encoder is then fine-tuned on 100
    labelled sentences and tested on 1,000 others.

    Returns:
        `(metrics, files, data_name)`.
    """
    if data is None:
        test, test_labels = sentiment_split("test", 1000, seed)
        texts, _ = sentiment_split("pretraining", 300 if quick else 3000, seed)
        data_name = "generated sentiment sentences, labels dropped (embedded)"
    else:
        texts, data_name = read_text_folder(data), data
    masked_lm, history = pretrain_masked_lm(
        texts[:300] if quick else texts,
        vocabulary_size=256 if data is None else 8000,
        sequence_length=32 if data is None else 64,
        epochs=epochs or (1 if quick else 10), seed=seed, verbose=verbose,
    )
    # The last epoch's running means over the pretraining texts: no split
    # is held out of masked-LM pretraining here, and the names say so.
    metrics = {
        "train_masked_accuracy": round(float(history.history["accuracy"][-1]), 4),
        "train_masked_loss": round(float(history.history["loss"][-1]), 4),
    }
    files = [os.path.join(out, f"{name}.keras")]
    write_atomically(files[0], masked_lm.save, suffix=".keras")
    if data is None:
        labelled, labels = sentiment_split("labelled", 100, seed)
        classifier = masked_lm.with_head(num_classes=2)
        classifier.compile()
        classifier.fit(
            classifier.preprocessor(labelled), labels, batch_size=16,
            epochs=2 if quick else 20, verbose=0,
        )
        _, accuracy = classifier.evaluate(
            classifier.preprocessor(test), test_labels, verbose=0
        )
        metrics["fine_tuned_accuracy_100_labels"] = round(float(accuracy), 4)
        files.append(os.path.join(out, f"{name}_classifier.keras"))
        write_atomically(files[-1], classifier.save, suffix=".keras")
    return metrics, files, data_name


def masked_lm_metrics(model, inputs, mask_ids, mask_weights):
    """The masked-LM loss and accuracy computed by hand, NumPy only.

    Counts the positions whose weight is 1 and nothing else: the check of
    what `compile`'s loss reports for one batch, and its weighted accuracy
    for any number. (Over several batches Keras's `loss` is the mean of
    the batches' losses, each over its own masked pieces; this function
    called on all of them at once weighs every piece alike.)

    Returns:
        `(loss, accuracy)`, the means over the weighted positions.
    """
    logits = np.asarray(keras.ops.convert_to_numpy(model(inputs, training=False)), "float64")
    logits -= logits.max(-1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    labels = np.asarray(mask_ids)
    weights = np.asarray(mask_weights, "float64")
    picked = np.take_along_axis(log_probabilities, labels[..., None], -1)[..., 0]
    loss = -(picked * weights).sum() / weights.sum()
    correct = logits.argmax(-1) == labels
    return float(loss), float((correct * weights).sum() / weights.sum())
