"""What `keras-attention run --data` reads, checked before any training.

Each check names `--data` and what the run needs of it: a translation
folder's evaluated split, a text long enough for a window in each split, a
Planetoid set; `quick_slice` is `--quick`'s "a small slice of the data".
"""

import os


def quick_slice(corpus, train=2000, other=200):
    """`--quick` on a user's corpus, "a small slice of the data": the first
    `train` examples of its train split and `other` of the others, a split
    being `(sources, targets)` (translation) or text, a line an example."""
    def head(split, value):
        n = train if split == "train" else other
        if isinstance(value, str):
            return "\n".join(value.split("\n")[:n])
        return tuple(list(side)[:n] for side in value)

    return {split: head(split, value) for split, value in corpus.items()}


def translation_test_split(corpus, data):
    """The split a translation run is scored on: `test`, else the one split
    whose name starts with "test" (Multi30k's `test_2016_flickr`), else
    `val` (the note names it). Checked before training: a folder without
    any failed after it."""
    if "test" in corpus:
        return "test"
    tests = sorted(split for split in corpus if split.startswith("test"))
    if len(tests) == 1:
        return tests[0]
    if len(tests) > 1:
        raise ValueError(
            f"--data {data}: several test splits ({', '.join(tests)}) and "
            "none named 'test': keep one, or name it test.<src>/test.<tgt>"
        )
    if "val" in corpus:
        return "val"
    raise ValueError(
        f"--data {data}: no split to score the run on: add test.<src>/"
        f"test.<tgt> (or val.*) next to train.*. Found: {', '.join(sorted(corpus))}"
    )


def check_causal_lm_text(corpus, data, sequence_length, quick):
    """The train and validation texts of `--data` hold a window each
    (`sequence_length + 1` characters). Checked before training: the
    validation text is scored after it (the error came after an epoch,
    naming neither `--data` nor the split)."""
    for split, share in (("train", "the first 95 %"), ("val", "the last 5 %")):
        if len(corpus[split]) < sequence_length + 1:
            raise ValueError(
                f"--data {data}: the {split} text ({share} of the text"
                f"{'; with --quick, its first lines' if quick else ''}) has "
                f"{len(corpus[split])} characters, fewer than a window "
                f"of sequence_length + 1 = {sequence_length + 1}: give a "
                "longer text"
            )


def image_data(data, seed, quick, image_size):
    """`((x_train, y_train), (x_test, y_test), name)` for a classification
    run: the embedded digits (resized to `image_size` where it is not 8),
    or the MNIST test set of `--data` split in two; `--quick` trains on the
    first 256 images."""
    from keras_attention import datasets

    if data is None:
        # Digits are 8x8; a preset made for 16x16 inputs gets them resized.
        (x_train, y_train), (x_test, y_test) = datasets.load_digits_images(
            seed=seed, image_size=None if image_size == 8 else image_size
        )
        name = "scikit-learn digits (embedded)"
        if image_size != 8:
            name += f", resized to {image_size}x{image_size}"
    else:
        (x_train, y_train), (x_test, y_test) = datasets.load_mnist_t10k_split(data)
        name = data
    if quick:
        x_train, y_train = x_train[:256], y_train[:256]
    return (x_train, y_train), (x_test, y_test), name


def planetoid_name(data):
    """`(folder, name)` of `--data`: a Planetoid folder (its first set of
    Cora, CiteSeer, PubMed) or one of a set's files, `ind.<name>.graph`."""
    names = ("cora", "citeseer", "pubmed")
    if os.path.isfile(data):
        parts = os.path.basename(data).split(".")
        if len(parts) >= 3 and parts[0] == "ind" and parts[1] in names:
            return os.path.dirname(os.path.abspath(data)), parts[1]
    else:
        found = [n for n in names if os.path.exists(os.path.join(data, f"ind.{n}.graph"))]
        if found:
            if len(found) > 1:
                print(f"--data {data} holds {', '.join(found)}: {found[0]} taken "
                      f"(pass {os.path.join(data, f'ind.{found[1]}.graph')} for "
                      f"{found[1]})", flush=True)
            return data, found[0]
    raise ValueError(
        f"--data {data}: expected a Planetoid folder with "
        "ind.<cora|citeseer|pubmed>.{x,y,tx,ty,allx,ally,graph,test.index}, "
        "or one of those files (ind.citeseer.graph: CiteSeer)"
    )
