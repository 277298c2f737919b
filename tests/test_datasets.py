"""Tests of keras_attention.datasets: generators, loaders and their errors.

Everything here is small and written by the tests themselves; the real data
in the shared folder is only read by `test_shared_data_counts`, which runs
when `KERAS_ATTENTION_DATA` points to that folder.
"""

import collections
import datetime
import gzip
import os
import pickle
import re
import struct

import numpy as np
import pytest
import scipy.ndimage
import scipy.sparse

from keras_attention import datasets
from keras_attention.datasets import dates as dates_module

# ---------------------------------------------------------------- dates ----

# Reference readers: the standard library's strptime (case-insensitive for
# names and literals), after dropping ordinal suffixes.
STRPTIME_FORMATS = {
    "day_month_year": "%d %B %Y",
    "month_day_comma_year": "%B %d, %Y",
    "month_ordinal_comma_year": "%B %d, %Y",
    "weekday_month_ordinal_year": "%A, %B %d %Y",
    "weekday_day_month_year": "%A %d %B %Y",
    "short_weekday_day_mon_year": "%a %d %b %Y",
    "mon_day_year": "%b %d %Y",
    "mon_dot_day_comma_short_year": "%b. %d, '%y",
    "day_mon_short_year": "%d %b %y",
    "ordinal_of_month_comma_year": "%d of %B, %Y",
    "the_ordinal_of_month_year": "the %d of %B %Y",
    "dd_dash_mon_dash_year": "%d-%b-%Y",
    "us_slash_short": "%m/%d/%y",
    "us_slash_long": "%m/%d/%Y",
    "iso_slash": "%Y/%m/%d",
    "european_dot": "%d.%m.%Y",
    "european_dot_padded": "%d.%m.%Y",
    "iso_unpadded": "%Y-%m-%d",
    "compact": "%Y%m%d",
}
# January 1st, 2024 was a Monday, weekday() == 0.
WEEKDAY_NAMES = [
    datetime.date(2024, 1, day).strftime("%A").lower() for day in range(1, 8)
]


def reference_parse(source, format_name, start_year=1950):
    text = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", source, flags=re.IGNORECASE)
    fmt = STRPTIME_FORMATS[format_name]
    date = datetime.datetime.strptime(text, fmt).date()
    if "%y" in fmt:
        # strptime's pivot is 1969; the task's window is [start_year, +99].
        year = start_year + (date.year - start_year) % 100
        date = date.replace(year=year)
    return date


def test_every_format_has_a_reference():
    assert set(STRPTIME_FORMATS) == set(datasets.DATE_FORMATS)
    assert len(datasets.DATE_FORMATS) >= 15


@pytest.mark.parametrize("format_name", sorted(STRPTIME_FORMATS))
def test_date_sources_match_targets(format_name):
    sources, targets = datasets.make_date_task(
        300, seed=5, formats=[format_name]
    )
    for source, target in zip(sources, targets):
        date = reference_parse(source, format_name)
        assert date.isoformat() == target, (source, target)
        assert 1950 <= date.year <= 2049
        # Weekdays, where written, are the true ones.
        for word in re.findall(r"[a-z]+", source.lower()):
            for weekday, name in enumerate(WEEKDAY_NAMES):
                if word in (name, name[:3]):
                    assert date.weekday() == weekday, source


def test_date_task_is_deterministic_and_varied():
    first = datasets.make_date_task(2000, seed=3)
    assert first == datasets.make_date_task(2000, seed=3)
    assert first != datasets.make_date_task(2000, seed=4)
    sources, targets = first
    # Many spellings, in every casing.
    assert any(s.isupper() for s in sources)
    assert any(s.islower() and re.search("[a-z]", s) for s in sources)
    assert any(s[0].isupper() and not s.isupper() for s in sources)
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", t) for t in targets)
    # Every source alone determines its date (format-free parser).
    assert [datasets.parse_date(s) for s in sources] == targets


def test_two_digit_years_only_in_a_100_year_window():
    sources, _ = datasets.make_date_task(
        500, start_year=1900, end_year=2099, seed=1
    )
    assert all("'" not in s for s in sources)
    assert all(not re.fullmatch(r"\d\d/\d\d/\d\d", s) for s in sources)
    with pytest.raises(ValueError, match="two-digit year"):
        datasets.make_date_task(
            5, start_year=1900, end_year=2099, formats=["us_slash_short"]
        )
    with pytest.raises(ValueError, match="formats"):
        datasets.make_date_task(5, formats=["no_such_format"])
    with pytest.raises(ValueError, match="num_samples"):
        datasets.make_date_task(-1)


def test_split_date_task_disjoint_dates():
    splits = datasets.split_date_task(3000, num_val=300, num_test=300, seed=2)
    assert splits == datasets.split_date_task(
        3000, num_val=300, num_test=300, seed=2
    )
    train, val, test = (set(splits[k][1]) for k in ("train", "val", "test"))
    assert len(splits["train"][0]) == 3000 and len(splits["test"][1]) == 300
    assert train.isdisjoint(test)
    assert train.isdisjoint(val)
    assert val.isdisjoint(test)
    corpus = datasets.make_date_corpus(50, 5, 5, seed=1)
    assert sorted(corpus) == ["test", "train", "val"]
    assert [len(corpus[k][0]) for k in ("train", "val", "test")] == [50, 5, 5]


def test_date_alignment_points_at_the_right_parts():
    sources, targets = datasets.make_date_task(1000, seed=11)
    for source, target in zip(sources, targets):
        ranges = datasets.date_alignment(source, target)
        assert len(ranges) == 10 and ranges[4] is None and ranges[7] is None
        year, month, day = (source[slice(*ranges[i])] for i in (0, 5, 8))
        assert ranges[0] == ranges[3] and ranges[5] == ranges[6]
        assert year in (target[:4], target[2:4])
        assert int(day) == int(target[8:])
        if month.isdigit():
            assert int(month) == int(target[5:7])
        else:
            name = datetime.date(2000, int(target[5:7]), 1).strftime("%B")
            assert name.lower().startswith(month.lower())
        matrix = datasets.date_alignment(source, target, as_matrix=True)
        assert matrix.shape == (10, len(source))
        assert matrix[4].sum() == 0 and matrix[7].sum() == 0
        assert matrix[0].sum() == len(year)
        # The three parts never share a source character.
        assert matrix[[0, 5, 8]].sum(axis=0).max() == 1
    assert datasets.date_alignment("3 March 1998")[0] == (8, 12)
    assert datasets.date_alignment("03/04/98")[5] == (0, 2)  # US: month
    assert datasets.date_alignment("03.04.1998")[5] == (3, 5)  # EU: month
    with pytest.raises(ValueError, match="1998-03-03"):
        datasets.date_alignment("3 March 1998", "1998-03-04")


def test_parse_date_rejects_non_dates():
    for text in ("hello", "31/31/1999", "3 March", "2.30.1999"):
        with pytest.raises(ValueError):
            datasets.parse_date(text)


# ------------------------------------------------------------ sentiment ----


def reference_label(sentence):
    tokens = sentence.split(" ")
    positive = [t for t in tokens if t in datasets.text.POSITIVE_WORDS]
    negative = [t for t in tokens if t in datasets.text.NEGATIVE_WORDS]
    assert len(positive) + len(negative) == 1, sentence
    negations = sum(t in ("not", "never") for t in tokens)
    return int(bool(positive)) ^ (negations % 2)


def test_sentiment_labels_follow_negation():
    sentences, labels, keys = datasets.make_sentiment_task(
        1000, seed=4, double_negation_rate=0.3, return_key_positions=True
    )
    assert labels.dtype == np.int32 and labels.shape == (1000,)
    assert [reference_label(s) for s in sentences] == labels.tolist()
    assert 0.4 < labels.mean() < 0.6
    vocabulary = set(datasets.sentiment_vocabulary())
    lengths = set()
    for sentence, key in zip(sentences, keys):
        tokens = sentence.split(" ")
        assert set(tokens) <= vocabulary
        lengths.add(len(tokens))
        deciding = [tokens[i] for i in key]
        # Keys are exactly the negations and the sentiment word.
        assert deciding[-1] in (
            datasets.text.POSITIVE_WORDS + datasets.text.NEGATIVE_WORDS
        )
        assert all(t in ("not", "never") for t in deciding[:-1])
        assert sum(t in ("not", "never") for t in tokens) == len(key) - 1
    assert len(lengths) > 10
    # Both single and double negations occur.
    assert {len(k) for k in keys} == {1, 2, 3}


def test_sentiment_is_deterministic():
    first = datasets.make_sentiment_task(50, seed=9)
    second = datasets.make_sentiment_task(50, seed=9)
    assert first[0] == second[0]
    np.testing.assert_array_equal(first[1], second[1])
    assert first[0] != datasets.make_sentiment_task(50, seed=10)[0]
    plain, _ = datasets.make_sentiment_task(200, seed=1, negation_rate=0.0)
    assert all("not" not in s.split(" ") for s in plain)
    with pytest.raises(ValueError, match="negation_rate"):
        datasets.make_sentiment_task(5, negation_rate=1.5)


def test_sentiment_exclude_leaves_out_another_splits_sentences():
    # The generator repeats sentences across seeds: seed 0's 3,000 hold
    # some of seed 1's 1,000 (the benchmarks' training and test streams).
    test, _ = datasets.make_sentiment_task(1000, seed=1)
    plain, plain_labels, plain_keys = datasets.make_sentiment_task(
        3000, seed=0, return_key_positions=True
    )
    assert set(plain) & set(test)
    texts, labels, keys = datasets.make_sentiment_task(
        3000, seed=0, return_key_positions=True, exclude=test
    )
    assert len(texts) == len(labels) == len(keys) == 3000
    assert not set(texts) & set(test)
    # The same stream with the excluded sentences skipped, labels and key
    # positions kept with their sentences.
    kept = [i for i, t in enumerate(plain) if t not in set(test)]
    assert texts[: len(kept)] == [plain[i] for i in kept]
    np.testing.assert_array_equal(labels[: len(kept)], plain_labels[kept])
    assert keys[: len(kept)] == [plain_keys[i] for i in kept]
    assert labels.dtype == np.int32
    # Nothing to exclude: the plain task.
    assert datasets.make_sentiment_task(20, seed=0, exclude=[])[0] == plain[:20]


# --------------------------------------------------------------- images ----


def test_load_digits_images_stratified():
    (x_train, y_train), (x_test, y_test) = datasets.load_digits_images(seed=1)
    assert x_train.shape[1:] == (8, 8, 1) and x_train.dtype == np.float32
    assert len(x_train) + len(x_test) == 1797
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert y_train.dtype == np.int32
    all_counts = np.bincount(np.concatenate([y_train, y_test]), minlength=10)
    test_counts = np.bincount(y_test, minlength=10)
    np.testing.assert_array_equal(test_counts, np.round(0.2 * all_counts))
    # Same seed, same split; another seed, another split.
    (again, _), _ = datasets.load_digits_images(seed=1)
    np.testing.assert_array_equal(x_train, again)
    (other, _), _ = datasets.load_digits_images(seed=2)
    assert not np.array_equal(x_train, other)
    train, test = datasets.stratified_split(np.arange(100) % 10, 0.2, seed=1)
    assert len(test) == 20 and np.bincount(np.arange(100)[test] % 10).max() == 2
    np.testing.assert_array_equal(np.sort(np.r_[train, test]), np.arange(100))

    (big, _), _ = datasets.load_digits_images(image_size=32)
    assert big.shape[1:] == (32, 32, 1)
    assert 0.0 <= big.min() and big.max() <= 1.0


@pytest.mark.parametrize("size", [(16, 16), (32, 32), (12, 20), (5, 3)])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_resize_images_matches_scipy(size, interpolation):
    images = np.random.default_rng(0).random((2, 8, 8, 3)).astype("float32")
    ours = datasets.resize_images(images, size, interpolation)
    order = 0 if interpolation == "nearest" else 1
    zoom = (size[0] / 8, size[1] / 8)
    expected = np.stack(
        [
            np.stack(
                [
                    scipy.ndimage.zoom(
                        image[:, :, c], zoom, order=order, grid_mode=True,
                        mode="nearest",
                    )
                    for c in range(3)
                ],
                axis=-1,
            )
            for image in images
        ]
    )
    np.testing.assert_allclose(ours, expected, atol=1e-6)
    if interpolation == "nearest" and size == (16, 16):
        np.testing.assert_array_equal(
            ours, images.repeat(2, axis=1).repeat(2, axis=2)
        )


def write_idx(path, array, magic=None, extra=b"", cut=0):
    array = np.asarray(array, dtype=np.uint8)
    if magic is None:
        magic = 0x0800 | array.ndim
    header = struct.pack(f">I{array.ndim}I", magic, *array.shape)
    data = header + array.tobytes() + extra
    if cut:
        data = data[:-cut]
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(data)


@pytest.fixture
def idx_folder(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels)
    return tmp_path, images, labels


def test_mnist_idx_reader(idx_folder, tmp_path_factory):
    folder, images, labels = idx_folder
    x, y = datasets.load_mnist_idx(folder)
    assert x.shape == (5, 28, 28, 1) and x.dtype == np.float32
    np.testing.assert_allclose(x[..., 0] * 255.0, images, atol=1e-4)
    assert y.tolist() == labels.tolist() and y.dtype == np.int32
    # gzip'd train-* files.
    other = tmp_path_factory.mktemp("gz")
    write_idx(other / "train-images-idx3-ubyte.gz", images)
    write_idx(other / "train-labels-idx1-ubyte.gz", labels)
    x_gz, y_gz = datasets.load_mnist_idx(other, split="train")
    np.testing.assert_array_equal(x_gz, x)
    np.testing.assert_array_equal(y_gz, y)
    (x_train, y_train), (x_test, y_test) = datasets.split_first_last(x, y, 3)
    assert len(x_train) == 3 and y_test.tolist() == [1, 5]


@pytest.mark.parametrize(
    "corruption, message",
    [
        (dict(magic=2049), "magic"),
        (dict(magic=0x12340803), "magic"),
        (dict(cut=10), "truncated"),
        (dict(extra=b"\x00"), "too long"),
    ],
)
def test_mnist_idx_rejects_corrupt_images(idx_folder, corruption, message):
    folder, images, _ = idx_folder
    path = folder / "t10k-images-idx3-ubyte"
    write_idx(path, images, **corruption)
    with pytest.raises(ValueError, match=message) as info:
        datasets.load_mnist_idx(folder)
    assert str(path) in str(info.value)


def test_mnist_idx_rejects_mismatched_counts_and_missing(idx_folder):
    folder, _, labels = idx_folder
    write_idx(folder / "t10k-labels-idx1-ubyte", labels[:4])
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte") as info:
        datasets.load_mnist_idx(folder)
    assert "5 images" in str(info.value) and "4 labels" in str(info.value)
    with open(folder / "t10k-labels-idx1-ubyte", "wb") as f:
        f.write(b"\x00\x00")
    with pytest.raises(ValueError, match="truncated"):
        datasets.load_mnist_idx(folder)
    os.remove(folder / "t10k-labels-idx1-ubyte")
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        datasets.load_mnist_idx(folder)
    (folder / "notes.txt").write_bytes(b"hello world, not an IDX file")
    with pytest.raises(ValueError, match="not an IDX file"):
        datasets.read_idx(folder / "notes.txt")


# ------------------------------------------------------------ detection ----


def pixel_box(box, size):
    x0, y0, x1, y1 = datasets.cxcywh_to_xyxy(box) * size
    pixels = np.array([y0, y1, x0, x1])
    np.testing.assert_allclose(pixels, np.round(pixels), atol=1e-4)
    return np.round(pixels).astype(int)


@pytest.mark.parametrize("kind, channels", [("digits", 1), ("shapes", 3)])
def test_detection_boxes_are_tight_on_the_ink(kind, channels):
    data = datasets.make_detection_set(
        12, image_size=64, max_objects=4, seed=3, kind=kind, channels=channels
    )
    assert data.images.shape == (12, 64, 64, channels)
    assert data.boxes.shape == (12, 4, 4) and data.labels.shape == (12, 4)
    assert data.images.dtype == np.float32
    assert 0.0 <= data.images.min() and data.images.max() <= 1.0
    num_classes = 10 if kind == "digits" else 3
    for image, boxes, labels, count in zip(*data):
        assert 1 <= count <= 4
        assert (labels[count:] == datasets.PAD_LABEL).all()
        assert (boxes[count:] == 0).all()
        assert ((0 <= labels[:count]) & (labels[:count] < num_classes)).all()
        ink = image.max(axis=-1) > 0
        covered = np.zeros_like(ink, dtype=int)
        for box in boxes[:count]:
            y0, y1, x0, x1 = pixel_box(box, 64)
            covered[y0:y1, x0:x1] += 1
            inside = ink[y0:y1, x0:x1]
            # Tight: ink on each of the four edges of the box.
            assert inside[0].any() and inside[-1].any()
            assert inside[:, 0].any() and inside[:, -1].any()
        # Every ink pixel lies in exactly one box; boxes never overlap.
        assert covered.max() == 1
        assert not (ink & (covered == 0)).any()


def test_detection_single_object_box_equals_nonzero_bbox():
    data = datasets.make_detection_set(
        10, image_size=40, max_objects=1, seed=1, object_scale=(10, 30)
    )
    for image, box in zip(data.images, data.boxes[:, 0]):
        rows, cols = np.nonzero(image[..., 0])
        expected = [rows.min(), rows.max() + 1, cols.min(), cols.max() + 1]
        assert pixel_box(box, 40).tolist() == expected


def test_detection_is_deterministic_and_validates():
    first = datasets.make_detection_set(4, seed=7, kind="shapes")
    second = datasets.make_detection_set(4, seed=7, kind="shapes")
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    other = datasets.make_detection_set(4, seed=8, kind="shapes")
    assert not np.array_equal(first.images, other.images)
    test_digits = datasets.make_detection_set(3, seed=0, digit_split="test")
    assert test_digits.images.shape == (3, 64, 64, 1)
    with pytest.raises(ValueError, match="object_scale"):
        datasets.make_detection_set(2, image_size=16, object_scale=(8, 20))
    with pytest.raises(ValueError, match="min_objects"):
        datasets.make_detection_set(2, max_objects=2, min_objects=3)
    with pytest.raises(ValueError, match="kind"):
        datasets.make_detection_set(2, kind="cars")


def test_place_digit_on_canvas():
    (x_train, _), _ = datasets.load_digits_images()
    canvas, box = datasets.place_digit_on_canvas(
        x_train[0], canvas_size=48, scale=24, seed=3
    )
    assert canvas.shape == (48, 48, 1)
    rows, cols = np.nonzero(canvas[..., 0])
    y0, y1, x0, x1 = pixel_box(box, 48)
    assert [y0, y1, x0, x1] == [
        rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    ]
    mask = datasets.box_to_mask(box, 48)
    assert mask[rows, cols].all() and mask.sum() == (y1 - y0) * (x1 - x0)
    fixed, fixed_box = datasets.place_digit_on_canvas(
        np.eye(8), 32, top_left=(4, 8)
    )
    assert fixed_box.tolist() == [0.375, 0.25, 0.25, 0.25]
    with pytest.raises(ValueError, match="top_left"):
        datasets.place_digit_on_canvas(np.eye(8), 32, top_left=(30, 0))


# --------------------------------------------------------------- graphs ----


def test_karate_club():
    import networkx

    graph = datasets.load_karate_club(seed=0)
    assert graph.features.shape == (34, 34)
    np.testing.assert_array_equal(graph.features, np.eye(34))
    assert graph.edges.dtype == np.int32 and graph.edges.shape == (2, 156)
    pairs = set(map(tuple, graph.edges.T.tolist()))
    expected = set()
    for u, v in networkx.karate_club_graph().edges():
        expected |= {(u, v), (v, u)}
    assert pairs == expected and len(pairs) == 156
    clubs = networkx.get_node_attributes(networkx.karate_club_graph(), "club")
    assert graph.labels.tolist() == [
        int(clubs[n] != "Mr. Hi") for n in range(34)
    ]
    masks = np.stack([graph.train_mask, graph.val_mask, graph.test_mask])
    assert (masks.sum(axis=0) == 1).all()
    assert np.bincount(graph.labels[graph.train_mask]).tolist() == [2, 2]
    again = datasets.load_karate_club(seed=0)
    np.testing.assert_array_equal(graph.train_mask, again.train_mask)
    assert graph.num_classes == 2


def gcn_reference(parts, test_index):
    """The GCN assembly, written from the data README's description."""
    allx = parts["allx"].toarray()
    tx = parts["tx"].toarray()
    ally, ty = parts["ally"], parts["ty"]
    sorted_ids = np.sort(test_index)
    full = np.arange(sorted_ids[0], sorted_ids[-1] + 1)
    tx_ext = np.zeros((len(full), tx.shape[1]))
    tx_ext[sorted_ids - sorted_ids[0]] = tx
    ty_ext = np.zeros((len(full), ty.shape[1]))
    ty_ext[sorted_ids - sorted_ids[0]] = ty
    features = np.vstack([allx, tx_ext])
    labels = np.vstack([ally, ty_ext])
    features[test_index] = features[sorted_ids]
    labels[test_index] = labels[sorted_ids]
    return features, labels


def legacy_pickle(obj):
    """A protocol-2 pickle with the 2016 module names of the real files."""
    data = pickle.dumps(obj, protocol=2)
    data = data.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    return data.replace(b"scipy.sparse._csr\n", b"scipy.sparse.csr\n")


@pytest.fixture
def planetoid_folder(tmp_path):
    rng = np.random.default_rng(0)
    num_features, num_classes = 6, 3
    # 6 non-test nodes (2 labelled for training), test slots 6..10 of which
    # node 8 is isolated and absent from the test index (as in CiteSeer).
    allx = (rng.random((6, num_features)) < 0.5).astype("float32")
    allx[:, 0] = 1.0
    ally = np.eye(num_classes, dtype="float64")[rng.integers(0, 3, 6)]
    test_index = np.array([10, 6, 9, 7])
    tx = (rng.random((4, num_features)) < 0.5).astype("float32")
    tx[:, 1] = 1.0
    ty = np.eye(num_classes)[[0, 1, 2, 1]]
    graph = collections.defaultdict(list)
    # Duplicates, a self loop and one direction only (3 -> 9).
    for source, targets in {
        0: [1, 2, 1],
        1: [0],
        2: [0, 2],
        3: [9],
        6: [7],
        7: [6, 10],
        10: [7],
        4: [],
        5: [],
        8: [],
        9: [],
    }.items():
        graph[source] = list(targets)
    parts = {
        "x": scipy.sparse.csr_matrix(allx[:2]),
        "y": ally[:2],
        "allx": scipy.sparse.csr_matrix(allx),
        "ally": ally,
        "tx": scipy.sparse.csr_matrix(tx),
        "ty": ty,
        "graph": graph,
    }
    for suffix, obj in parts.items():
        (tmp_path / f"ind.fake.{suffix}").write_bytes(legacy_pickle(obj))
    (tmp_path / "ind.fake.test.index").write_text(
        "".join(f"{i}\n" for i in test_index)
    )
    return tmp_path, parts, test_index


def test_planetoid_loader_matches_gcn_assembly(planetoid_folder):
    folder, parts, test_index = planetoid_folder
    assert b"numpy.core.multiarray" in (folder / "ind.fake.allx").read_bytes()
    graph = datasets.load_planetoid(folder, "fake", num_val=3)
    features, one_hot = gcn_reference(parts, test_index)
    np.testing.assert_array_equal(graph.features, features)
    expected_labels = np.where(one_hot.any(1), one_hot.argmax(1), -1)
    assert graph.labels.tolist() == expected_labels.tolist()
    assert graph.labels[8] == -1 and not graph.features[8].any()
    assert graph.features.dtype == np.float32 and graph.labels.dtype == np.int32
    assert graph.num_classes == 3
    assert np.flatnonzero(graph.train_mask).tolist() == [0, 1]
    assert np.flatnonzero(graph.val_mask).tolist() == [2, 3, 4]
    assert np.flatnonzero(graph.test_mask).tolist() == [6, 7, 9, 10]
    expected_edges = {
        (0, 1), (1, 0), (0, 2), (2, 0), (3, 9), (9, 3),
        (6, 7), (7, 6), (7, 10), (10, 7),
    }
    assert graph.edges.dtype == np.int32
    assert set(map(tuple, graph.edges.T.tolist())) == expected_edges
    assert graph.edges.shape == (2, len(expected_edges))
    # Sorted by target, then source.
    order = np.lexsort((graph.edges[0], graph.edges[1]))
    np.testing.assert_array_equal(order, np.arange(graph.edges.shape[1]))

    normalized = datasets.load_planetoid(
        folder, "fake", normalize_features=True, num_val=3
    ).features
    sums = normalized.sum(axis=1)
    np.testing.assert_allclose(sums[sums > 0], 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        normalized[0], features[0] / features[0].sum(), rtol=1e-6
    )


def test_planetoid_missing_file_and_unsafe_pickle(planetoid_folder, tmp_path):
    folder, _, _ = planetoid_folder
    marker = tmp_path / "marker"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (folder / "ind.fake.ty").write_bytes(pickle.dumps(Evil(), protocol=2))
    with pytest.raises(ValueError, match="system") as info:
        datasets.load_planetoid(folder, "fake", num_val=3)
    assert "ind.fake.ty" in str(info.value)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match="system"):
        import io

        datasets.RestrictedUnpickler(
            io.BytesIO(pickle.dumps(Evil(), protocol=4))
        ).load()
    assert not marker.exists()

    os.remove(folder / "ind.fake.allx")
    with pytest.raises(FileNotFoundError, match="ind.fake.allx") as info:
        datasets.load_planetoid(folder, "fake", num_val=3)
    assert isinstance(info.value, ValueError)



@pytest.mark.parametrize("num_val", [-8, -3, 1.5, True])
def test_planetoid_rejects_a_bad_num_val(planetoid_folder, num_val):
    # -8 marked node 2 as validation (a slice [2:-6]), -3 blamed the test ids.
    folder, _, _ = planetoid_folder
    with pytest.raises(ValueError, match="argument `num_val`.*non-negative integer"):
        datasets.load_planetoid(folder, "fake", num_val=num_val)

# ---------------------------------------------------------- translation ----


@pytest.fixture
def corpus_folder(tmp_path):
    files = {
        "train.en": "A dog runs.\nTwo men talk.\nA red car.\n",
        "train.de": (
            "Ein Hund rennt.\r\nZwei Männer reden.\r\nEin rotes Auto.\r\n"
        ),
        "val.en": "A cat.\n",
        "val.de": "Eine Katze.\n",
        "test2016.en": "The sun.\nThe sea.",
        "test2016.de": "Die Sonne.\nDas Meer.\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8", newline="")
    return tmp_path


def test_parallel_corpus_loader(corpus_folder):
    corpus = datasets.load_parallel_corpus(corpus_folder)
    assert sorted(corpus) == ["test2016", "train", "val"]
    assert corpus["train"] == (
        ["A dog runs.", "Two men talk.", "A red car."],
        ["Ein Hund rennt.", "Zwei Männer reden.", "Ein rotes Auto."],
    )
    assert corpus["test2016"][0] == ["The sun.", "The sea."]
    reverse = datasets.load_parallel_corpus(
        corpus_folder, src="de", tgt="en", splits=["val"], max_lines=1
    )
    assert reverse == {"val": (["Eine Katze."], ["A cat."])}


def test_parallel_corpus_errors_name_file_and_line(corpus_folder):
    (corpus_folder / "val.de").write_text("Eine Katze.\nZu viel.\n")
    with pytest.raises(ValueError, match=r"line 2 of .*val\.de"):
        datasets.load_parallel_corpus(corpus_folder)
    (corpus_folder / "val.de").write_text("Eine Katze.\n")
    (corpus_folder / "train.en").write_text("A dog.\n\nA car.\n")
    with pytest.raises(ValueError, match=r"Line 2 of .*train\.en is empty"):
        datasets.load_parallel_corpus(corpus_folder)
    (corpus_folder / "train.en").write_bytes(b"A dog.\nTwo \xff men.\nA car.\n")
    with pytest.raises(ValueError, match=r"Line 2 of .*train\.en .*UTF-8"):
        datasets.load_parallel_corpus(corpus_folder)
    os.remove(corpus_folder / "train.de")
    with pytest.raises(ValueError, match=r"train\.de") as info:
        datasets.load_parallel_corpus(corpus_folder)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match=r"train\.fr"):
        datasets.load_parallel_corpus(corpus_folder, src="fr", tgt="en")
    with pytest.raises(ValueError, match="expected a corpus folder.*not a file"):
        datasets.load_parallel_corpus(corpus_folder / "val.de")


# ---------------------------------------------------- shared real data ----

SHARED = os.environ.get("KERAS_ATTENTION_DATA")


@pytest.mark.skipif(
    not SHARED, reason="set KERAS_ATTENTION_DATA to the shared data folder"
)
def test_shared_data_counts():
    """The counts of the data README of the shared folder."""
    folder = os.path.join(SHARED, "planetoid")
    expected = {
        "cora": (2708, 1433, 7, 140, 10556, 0),
        "citeseer": (3327, 3703, 6, 120, 9104, 15),
    }
    for name, (nodes, width, classes, train, edges, unlabelled) in (
        expected.items()
    ):
        graph = datasets.load_planetoid(folder, name)
        assert graph.features.shape == (nodes, width)
        assert graph.num_classes == classes
        assert (graph.train_mask.sum(), graph.val_mask.sum()) == (train, 500)
        assert graph.test_mask.sum() == 1000
        assert graph.edges.shape == (2, edges)
        assert (graph.labels == -1).sum() == unlabelled
    with pytest.raises(FileNotFoundError, match="ind.pubmed.allx"):
        datasets.load_planetoid(folder, "pubmed")

    images, labels = datasets.load_mnist_idx(os.path.join(SHARED, "mnist_t10k"))
    assert images.shape == (10000, 28, 28, 1)
    assert np.bincount(labels).tolist() == [
        980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009
    ]
    assert abs(images.mean() - 0.1325) < 5e-4

    corpus = datasets.load_parallel_corpus(os.path.join(SHARED, "multi30k"))
    assert {k: len(v[0]) for k, v in corpus.items()} == {
        "train": 29000, "val": 1014, "test2016": 1000
    }
    assert all(len(v[0]) == len(v[1]) for v in corpus.values())


def _rewrite(folder, suffix, obj):
    (folder / f"ind.fake.{suffix}").write_bytes(legacy_pickle(obj))


@pytest.mark.parametrize("fault", [
    "csr_index", "nan", "duplicate_test_id", "far_test_id", "graph_id",
    "two_hot", "non_ascii_index",
])
def test_a_corrupt_planetoid_file_is_refused_by_name(planetoid_folder, fault):
    # A column index past the matrix crashed the interpreter in scipy's
    # `toarray` (unpickling skips its checks); the others loaded a
    # different dataset in silence (phantom nodes, overwritten rows).
    folder, parts, test_index = planetoid_folder
    named = {
        "csr_index": "allx", "nan": "tx", "duplicate_test_id": "test.index",
        "far_test_id": "test.index", "graph_id": "graph", "two_hot": "ally",
        "non_ascii_index": "test.index",
    }[fault]
    if fault == "csr_index":
        allx = parts["allx"].copy()
        allx.indices[0] = 2_000_000_000
        _rewrite(folder, "allx", allx)
    elif fault == "nan":
        tx = parts["tx"].toarray()
        tx[1, 2] = np.nan
        _rewrite(folder, "tx", scipy.sparse.csr_matrix(tx))
    elif fault == "duplicate_test_id":
        (folder / "ind.fake.test.index").write_text("10\n6\n6\n7\n")
    elif fault == "far_test_id":
        (folder / "ind.fake.test.index").write_text("10\n6\n90\n7\n")
    elif fault == "graph_id":
        graph = dict(parts["graph"])
        graph[0] = [1, 99_999]
        _rewrite(folder, "graph", graph)
    elif fault == "two_hot":
        ally = parts["ally"].copy()
        ally[1] = [1, 1, 0]
        _rewrite(folder, "ally", ally)
    else:
        (folder / "ind.fake.test.index").write_bytes(b"\xef\xbb\xbf10\n6\n9\n7\n")
    with pytest.raises(ValueError, match=f"ind.fake.{named}"):
        datasets.load_planetoid(folder, "fake", num_val=3)


def test_corrupt_gzip_and_bad_labels_name_the_idx_file(idx_folder, tmp_path):
    folder, images, labels = idx_folder
    gz = tmp_path / "gz"
    gz.mkdir()
    write_idx(gz / "t10k-images-idx3-ubyte.gz", images)
    write_idx(gz / "t10k-labels-idx1-ubyte.gz", labels)
    data = bytearray((gz / "t10k-images-idx3-ubyte.gz").read_bytes())
    data[40] ^= 0xFF  # inside the deflate stream
    (gz / "t10k-images-idx3-ubyte.gz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz"):
        datasets.load_mnist_idx(gz)
    write_idx(folder / "t10k-labels-idx1-ubyte", np.array([3, 1, 200, 1, 5], np.uint8))
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.*200"):
        datasets.load_mnist_idx(folder)
    with pytest.raises(ValueError, match="not a file"):
        datasets.load_mnist_idx(folder / "t10k-images-idx3-ubyte")
