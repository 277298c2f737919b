"""Image classification data: scikit-learn's digits and MNIST IDX files.

`load_digits_images` is the embedded default (scikit-learn ships the 1,797
8x8 digits, no download). `load_mnist_idx` reads MNIST-style IDX files from a
path given by the user, for example the MNIST test set in
`shared/data/mnist_t10k/`.
"""

import gzip
import os
import struct
import zlib

import numpy as np

from keras_attention.datasets._files import missing_file_error

# IDX type codes (third byte of the magic number) -> big-endian dtype.
_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def resize_images(images, size, interpolation="bilinear"):
    """Resizes a batch of images `(N, H, W, C)` with NumPy.

    Pixel centres sit at half-integer positions (as in `keras.ops.image.resize`
    and `tf.image.resize` without antialiasing); bilinear interpolation clamps
    at the borders.

    Args:
        images: array `(N, H, W, C)`.
        size: an int or a pair `(height, width)`.
        interpolation: `"nearest"` or `"bilinear"`.

    Returns:
        float32 array `(N, height, width, C)`.

    Example:

    >>> resize_images(np.ones((2, 8, 8, 1)), 16).shape
    (2, 16, 16, 1)
    """
    images = np.asarray(images, dtype="float32")
    if images.ndim != 4:
        raise ValueError(
            "Received an invalid value for argument `images`, expected an "
            f"array of rank 4 (N, H, W, C). Received: shape={images.shape}"
        )
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    height, width = (int(s) for s in size)
    if height < 1 or width < 1:
        raise ValueError(
            "Received an invalid value for argument `size`, expected positive "
            f"integers. Received: size={size}"
        )
    in_height, in_width = images.shape[1:3]
    if interpolation == "nearest":
        rows = np.floor((np.arange(height) + 0.5) * in_height / height)
        cols = np.floor((np.arange(width) + 0.5) * in_width / width)
        rows = np.minimum(rows.astype(int), in_height - 1)
        cols = np.minimum(cols.astype(int), in_width - 1)
        return images[:, rows][:, :, cols]
    if interpolation != "bilinear":
        raise ValueError(
            "Received an invalid value for argument `interpolation`, expected "
            f"'nearest' or 'bilinear'. Received: interpolation={interpolation}"
        )

    def axis_weights(out_len, in_len):
        position = (np.arange(out_len) + 0.5) * in_len / out_len - 0.5
        position = np.clip(position, 0.0, in_len - 1)
        low = np.floor(position).astype(int)
        high = np.minimum(low + 1, in_len - 1)
        return low, high, (position - low).astype("float32")

    row_low, row_high, row_frac = axis_weights(height, in_height)
    col_low, col_high, col_frac = axis_weights(width, in_width)
    row_frac = row_frac[None, :, None, None]
    col_frac = col_frac[None, None, :, None]
    # (N, height, W, C) then (N, height, width, C)
    by_rows = (
        images[:, row_low] * (1 - row_frac) + images[:, row_high] * row_frac
    )
    out = (
        by_rows[:, :, col_low] * (1 - col_frac)
        + by_rows[:, :, col_high] * col_frac
    )
    return out.astype("float32")


def stratified_split(labels, test_fraction=0.2, seed=0):
    """Indices of a stratified train/test split.

    Each class sends `round(test_fraction * class_size)` of its samples,
    drawn from `seed`, to the test side.

    Returns:
        `(train_indices, test_indices)`, both sorted int64 arrays.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(
            "Received an invalid value for argument `test_fraction`, expected "
            f"a float in [0, 1). Received: test_fraction={test_fraction}"
        )
    labels = np.asarray(labels)
    if not labels.size:
        raise ValueError(
            "Received an invalid value for argument `labels`, expected a "
            "non-empty array of class labels. Received: "
            f"labels.shape={labels.shape}"
        )
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        num_test = int(round(test_fraction * len(members)))
        test.append(members[:num_test])
        train.append(members[num_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def load_digits_images(
    seed=0, test_fraction=0.2, image_size=None, interpolation="bilinear"
):
    """Loads scikit-learn's 8x8 digits as a stratified train/test split.

    Args:
        seed: seed of the split.
        test_fraction: share of each class kept for testing.
        image_size: optional int or `(height, width)` to resize to, for
            models that need 16x16 or 32x32 inputs.
        interpolation: `"nearest"` or `"bilinear"`, used with `image_size`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`: float32 images
        `(N, H, W, 1)` in [0, 1] (8x8 unless resized) and int32 labels 0-9.

    Example:

    >>> (x_train, y_train), (x_test, y_test) = load_digits_images()
    >>> x_train.shape, x_test.shape
    ((1438, 8, 8, 1), (359, 8, 8, 1))
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Pixel values are integer counts 0..16.
    images = (digits.images / 16.0).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    if image_size is not None:
        images = np.clip(resize_images(images, image_size, interpolation), 0, 1)
    train, test = stratified_split(labels, test_fraction, seed)
    return (images[train], labels[train]), (images[test], labels[test])


def _read_bytes(path):
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise missing_file_error(path, "IDX file")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"Cannot read the IDX file {path}: {error}") from error


def read_idx(path, expected_magic=None):
    """Reads one IDX file (raw or `.gz`) into a NumPy array.

    The header is validated: two zero bytes, a known type code, a rank, the
    dimensions, then exactly as many values as the dimensions announce.

    Args:
        path: the file.
        expected_magic: optional magic number the file must start with
            (2051 for MNIST images, 2049 for MNIST labels).

    Returns:
        The array with the file's shape and dtype (native byte order).
    """
    path = os.fspath(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(
            f"The IDX file {path} is truncated: {len(data)} bytes, shorter "
            "than the 4-byte magic number."
        )
    magic = struct.unpack(">I", data[:4])[0]
    if expected_magic is not None and magic != expected_magic:
        raise ValueError(
            f"The file {path} has the wrong magic number: expected "
            f"{expected_magic}, found {magic}."
        )
    zero, type_code, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or type_code not in _IDX_DTYPES or rank == 0:
        raise ValueError(
            f"The file {path} is not an IDX file: wrong magic number "
            f"0x{data[:4].hex()} (expected 0x0000, a type code in "
            f"{sorted(_IDX_DTYPES)} and a rank >= 1)."
        )
    header_size = 4 + 4 * rank
    if len(data) < header_size:
        raise ValueError(
            f"The IDX file {path} is truncated: its header needs "
            f"{header_size} bytes, the file has {len(data)}."
        )
    shape = struct.unpack(f">{rank}I", data[4:header_size])
    dtype = _IDX_DTYPES[type_code]
    num_values = 1
    for dim in shape:  # Python ints: a product past int64 cannot wrap to 0
        num_values *= dim
    expected = header_size + num_values * dtype.itemsize
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "too long"
        raise ValueError(
            f"The IDX file {path} is {state}: the header announces shape "
            f"{shape} ({expected} bytes in all), the file has {len(data)} "
            "bytes."
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def _find_idx_file(folder, stem):
    for name in (stem, stem + ".gz"):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate):
            return candidate
    raise missing_file_error(os.path.join(folder, stem), "IDX file (or .gz)")


def load_mnist_idx(path, split="t10k"):
    """Reads MNIST-style IDX image and label files from a folder.

    Reads `<split>-images-idx3-ubyte` and `<split>-labels-idx1-ubyte`, or the
    same names ending in `.gz`. Image files must have the magic number 2051
    (unsigned bytes, rank 3) and label files 2049 (unsigned bytes, rank 1),
    with the same number of items.

    Args:
        path: the folder holding the files.
        split: file name prefix, `"t10k"` or `"train"`.

    Returns:
        `(images, labels)`: float32 `(N, H, W, 1)` in [0, 1] (28x28 for
        MNIST) and int32 `(N,)`.

    Example:

    >>> images, labels = load_mnist_idx("shared/data/mnist_t10k")  # doctest: +SKIP
    >>> images.shape  # doctest: +SKIP
    (10000, 28, 28, 1)
    """
    folder = os.fspath(path)
    if os.path.isfile(folder):
        raise ValueError(
            f"Expected the MNIST folder holding {split}-images-idx3-ubyte and "
            f"{split}-labels-idx1-ubyte (or .gz), not a file: {folder!r}"
        )
    if not os.path.isdir(folder):
        raise missing_file_error(folder, "MNIST folder")
    image_file = _find_idx_file(folder, f"{split}-images-idx3-ubyte")
    label_file = _find_idx_file(folder, f"{split}-labels-idx1-ubyte")
    images = read_idx(image_file, expected_magic=2051)
    labels = read_idx(label_file, expected_magic=2049)
    if len(images) != len(labels):
        raise ValueError(
            f"The image file {image_file} holds {len(images)} images but the "
            f"label file {label_file} holds {len(labels)} labels."
        )
    if len(labels) and labels.max() > 9:
        row = int(np.argmax(labels > 9))
        raise ValueError(
            f"The label file {label_file} holds label {int(labels[row])} at "
            f"item {row}; MNIST's labels are the digits 0-9."
        )
    images = (images.astype("float32") / 255.0)[..., None]
    return images, labels.astype("int32")


def split_first_last(images, labels, num_train=8000):
    """Splits arrays into the first `num_train` and the remaining items.

    The documented MNIST split of the 10,000 test images: the first 8,000
    for training, the last 2,000 for testing.

    Returns:
        `(x_train, y_train), (x_test, y_test)`.
    """
    if not 0 < num_train < len(images) or len(images) != len(labels):
        raise ValueError(
            "Received an invalid value for argument `num_train`, expected an "
            f"integer in (0, {len(images)}) with as many labels as images. "
            f"Received: num_train={num_train}, len(images)={len(images)}, "
            f"len(labels)={len(labels)}"
        )
    return (images[:num_train], labels[:num_train]), (
        images[num_train:],
        labels[num_train:],
    )


def load_mnist_t10k_split(path, num_train=8000):
    """Loads the MNIST test set from `path`, split first 8,000 / last 2,000."""
    images, labels = load_mnist_idx(path, split="t10k")
    return split_first_last(images, labels, num_train)
