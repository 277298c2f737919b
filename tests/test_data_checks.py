"""Bringing your own data and training: awkward files and bad arguments.

Each test writes its own small files (`tmp_path`); nothing here reads the
shared data folder.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_attention import datasets  # noqa: E402
from keras_attention import training  # noqa: E402

# ------------------------------------------------------------ schedules ----


def test_inverse_sqrt_is_vaswanis_schedule_and_rejects_a_zero_warmup():
    d_model, warmup = 512, 4000
    peak = d_model**-0.5 * warmup**-0.5
    schedule = training.InverseSqrt(peak, warmup)
    for iteration in (0, warmup - 1, 10 * warmup):
        step = iteration + 1  # Vaswani et al. count the first update as 1
        expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        np.testing.assert_allclose(float(schedule(iteration)), expected, rtol=1e-5)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert float(restored(123)) == float(schedule(123))
    # warmup=0 gave a learning rate of 0 at every step, without a word.
    with pytest.raises(ValueError, match="`warmup`.*warmup=0"):
        training.InverseSqrt(1e-3, 0)
    with pytest.raises(ValueError, match="`peak`"):
        training.InverseSqrt(-1e-3, 10)


def test_budget_schedule_and_budget_reject_arguments_that_break_fit():
    budget = training.TimeBudget(seconds=10)
    # Both divided by zero at the first step of `fit`.
    with pytest.raises(ValueError, match="`warmup`"):
        training.BudgetLinearDecay(budget, peak=1e-3, warmup=0)
    with pytest.raises(ValueError, match="`decay_fraction`"):
        training.BudgetLinearDecay(budget, 1e-3, 10, decay_fraction=0)
    with pytest.raises(ValueError, match="`budget`.*TimeBudget"):
        training.BudgetLinearDecay(10.0, 1e-3, 10)
    # Without its TimeBudget in `fit`: a TypeError about NoneType at the
    # first step.
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    schedule = training.BudgetLinearDecay(budget, 1e-3, 10, verbose=False)
    with pytest.raises(ValueError, match="TimeBudget that has not started"):
        model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0, callbacks=[schedule])
    history = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0,
                        callbacks=[schedule, budget])
    assert len(history.history["loss"]) == 1
    # A negative budget made `spent()` negative: `fit` never stopped.
    with pytest.raises(ValueError, match="`seconds`"):
        training.TimeBudget(seconds=-60)
    with pytest.raises(ValueError, match="`cpu_seconds`"):
        training.TimeBudget(cpu_seconds=-1)


def test_keep_best_keeps_the_lowest_error():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    keep = training.KeepBest("val_mae")
    keep.set_model(model)
    keep.on_train_begin()
    for value, error in ((1.0, 3.0), (2.0, 0.5), (3.0, 1.0)):
        model.set_weights([np.full((2, 1), value), np.zeros(1)])
        keep.on_epoch_end(0, {"val_mae": error})
    keep.on_train_end()
    # The epoch with val_mae 0.5, not the worst one (3.0).
    np.testing.assert_array_equal(model.get_weights()[0], np.full((2, 1), 2.0))
    assert training.KeepBest("val_accuracy").mode == "max"
    assert training.KeepBest("val_bleu", mode="min").mode == "min"


def test_keep_best_reads_a_metrics_own_direction():
    # "auto" went by words in the name: val_kl_divergence read as higher
    # is better, and the worst epoch's weights came back.
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((32, 4)).astype("float32")
    y = np.full((32, 2), 0.5, "float32")
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(2, activation="softmax")]
    )
    model.compile(keras.optimizers.SGD(0.5), "kl_divergence",
                  metrics=[keras.metrics.KLDivergence(name="kl_divergence")])
    keep = training.KeepBest("val_kl_divergence")
    history = model.fit(x, y, validation_data=(x, y), epochs=4, verbose=0,
                        callbacks=[keep])
    assert keep.mode == "min"
    values = history.history["val_kl_divergence"]
    assert min(values) < max(values)
    final = model.evaluate(x, y, verbose=0, return_dict=True)["kl_divergence"]
    assert final == pytest.approx(min(values), rel=1e-5)


# --------------------------------------------------------------- images ----


def test_stratified_split_of_no_labels_names_the_argument():
    with pytest.raises(ValueError, match="`labels`"):
        datasets.stratified_split([], 0.2)


def test_detection_set_with_tiny_digits_boxes_every_object():
    # A digit shrunk to one pixel can lose all its ink; its box was the
    # first row of an empty array (IndexError).
    data = datasets.make_detection_set(20, image_size=16, object_scale=(1, 2))
    real = data.labels >= 0
    assert (data.boxes[real][:, 2:] > 0).all()
    with pytest.raises(ValueError, match="`ink_threshold`"):
        datasets.make_detection_set(1, ink_threshold=1.5)


# ----------------------------------------------------------------- text ----


def test_text_corpus_of_an_empty_file_names_the_path(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="`path`"):
        datasets.load_text_corpus(str(tmp_path / "empty.txt"))


def test_read_text_folder_names_the_file_that_is_not_utf8(tmp_path):
    (tmp_path / "a.txt").write_text("fine\r\n", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="b.txt is not UTF-8"):
        training.read_text_folder(tmp_path)
    # The language model's corpus replaced the bytes with U+FFFD in silence.
    with pytest.raises(ValueError, match="`path`.*b.txt is not UTF-8"):
        datasets.load_text_corpus(tmp_path)


def test_parallel_corpus_rejects_empty_files_and_max_lines_zero(tmp_path):
    (tmp_path / "train.en").write_bytes(b"\xef\xbb\xbfA dog \r\nTwo\r\n")
    (tmp_path / "train.de").write_bytes(b"Ein Hund\r\nZwei\r\n")
    corpus = datasets.load_parallel_corpus(tmp_path)
    assert corpus["train"] == (["A dog ", "Two"], ["Ein Hund", "Zwei"])
    with pytest.raises(ValueError, match="`max_lines`"):
        datasets.load_parallel_corpus(tmp_path, max_lines=0)
    (tmp_path / "train.en").write_text("")
    (tmp_path / "train.de").write_text("")
    with pytest.raises(ValueError, match="train.en holds no lines"):
        datasets.load_parallel_corpus(tmp_path)


# --------------------------------------------------------------- graphs ----


def write_graph(folder, edges="0,1\n", labels="0\n1\n-1\n1\n", train="0\n1\n"):
    """A 4-node graph in CSV files; node 2 is unlabelled, 3 isolated."""
    # "utf-8-sig": a spreadsheet's "CSV UTF-8" starts with a byte-order mark.
    (folder / "features.csv").write_text(
        "1,0\r\n0,1\r\n1,1\r\n0,0\r\n", encoding="utf-8-sig"
    )
    (folder / "labels.csv").write_text(labels)
    (folder / "edges.csv").write_text(edges)
    (folder / "train.csv").write_text(train)
    (folder / "val.csv").write_text("")
    (folder / "test.csv").write_text("3\n")


def test_graph_files_from_a_spreadsheet_and_without_edges(tmp_path):
    write_graph(tmp_path, edges="")
    graph = datasets.load_graph_files(tmp_path)
    np.testing.assert_array_equal(graph.features[:2], np.eye(2))
    assert graph.edges.shape == (2, 0)
    assert graph.val_mask.sum() == 0 and graph.test_mask.sum() == 1


def test_graph_files_reject_an_unlabelled_training_node(tmp_path):
    write_graph(tmp_path, train="0\n2\n")
    with pytest.raises(ValueError, match="train split.*without a label"):
        datasets.load_graph_files(tmp_path)


# -------------------------------------------------------- translation ----


def test_bucketed_batches_drop_no_pair_silently():
    source = np.array([[1, 2, 0, 0], [1, 2, 3, 4]] * 4, "int32")
    target = np.array([[1, 2, 0], [1, 2, 3]] * 4, "int32")
    x = {"source_ids": source, "target_ids": target}
    # The second half of the pairs fit no bucket, and vanished.
    with pytest.raises(ValueError, match="`buckets`.*longest being \\(4, 3\\)"):
        training.bucketed_batches(x, target, 2, [(2, 2), (3, 3)])
    with pytest.raises(ValueError, match="`batch_size`"):
        training.bucketed_batches(x, target, 16, [(2, 2), (4, 3)])
    batches = list(training.bucketed_batches(x, target, 2, [(2, 2), (4, 3)]))
    assert len(batches) == 4


def test_a_time_budget_reused_for_another_fit_counts_from_its_start():
    # Without a `start`, the budget counts from when training begins: a
    # second `fit` with the same callback stopped after one step, its
    # budget spent by the first.
    import time

    from keras_attention.training import TimeBudget

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")
    budget = TimeBudget(seconds=30.0)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[budget])
    budget.start -= 60.0  # as if the first fit had spent its budget
    history = model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[budget])
    assert budget.steps == 8 and len(history.history["loss"]) == 2
    given = TimeBudget(seconds=30.0, start=time.time() - 60.0)  # shared start
    model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[given])
    assert given.steps == 1
