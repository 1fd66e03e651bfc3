"""The Adult example's data step, configs and model quality, checked without any service.

The quality test trains the example's DNN for one epoch with the single-process
baseline (same embedding Adagrad and dense Adam settings as ``train.py``) and
requires test AUC >= 0.90, the issue's target for the full Pyrsia job.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.baseline import array_batches, roc_auc, train_single_process
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.errors import InvalidInputError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "adult_income"
sys.path.insert(0, str(EXAMPLE))  # the example's modules import each other as scripts do

import data_prep  # noqa: E402
from model import DNN  # noqa: E402


@pytest.fixture(scope="module")
def train() -> data_prep.AdultData:
    return data_prep.load_adult("train")


@pytest.fixture(scope="module")
def test() -> data_prep.AdultData:
    return data_prep.load_adult("test")


def test_split_sizes_and_positive_rates_match_uci(train, test):
    assert len(train) == 32_561
    assert len(test) == 16_281
    assert train.positive_rate == pytest.approx(0.2408, abs=1e-4)
    assert test.positive_rate == pytest.approx(0.2362, abs=1e-4)


def test_arrays_have_the_documented_layout_and_no_nan(train, test):
    for d in (train, test):
        assert d.cat_ids.dtype == np.uint64 and d.cat_ids.shape == (len(d), 8)
        assert d.dense.dtype == np.float32 and d.dense.shape == (len(d), 5)
        assert d.label.dtype == np.float32 and d.label.shape == (len(d), 1)
        assert np.isfinite(d.dense).all()
        assert set(np.unique(d.label)) == {0.0, 1.0}
        assert d.cat_columns == data_prep.CATEGORICAL_COLUMNS
    # standardized with the train statistics
    np.testing.assert_allclose(train.dense.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(train.dense.std(axis=0), 1, atol=1e-4)


def test_ids_come_from_the_train_vocabulary_and_agree_between_splits(train, test):
    raw_train = data_prep.read_uci_rows(data_prep.DATA_DIR / "adult.data.gz")
    raw_test = data_prep.read_uci_rows(data_prep.DATA_DIR / "adult.test.gz")
    for j, column in enumerate(data_prep.CATEGORICAL_COLUMNS):
        vocab = data_prep.vocabulary(column)
        assert list(vocab) == sorted(set(raw_train[:, data_prep.COLUMNS.index(column)]))
        mapping = {value: i + 1 for i, value in enumerate(vocab)}
        for raw, d in ((raw_train, train), (raw_test, test)):
            values = raw[:, data_prep.COLUMNS.index(column)]
            expected = np.array([mapping.get(v, data_prep.UNKNOWN_ID) for v in values])
            np.testing.assert_array_equal(d.cat_ids[:, j], expected)
    # the first train row is "State-gov", "Bachelors", ...; the first test row "Private", "11th"
    workclass = list(data_prep.vocabulary("workclass"))
    assert train.cat_ids[0, 0] == workclass.index("State-gov") + 1
    assert test.cat_ids[0, 0] == workclass.index("Private") + 1


def test_unseen_values_get_the_reserved_id():
    vocab = np.array(["a", "c", "e"])
    ids = data_prep.encode_with_vocab(np.array(["a", "b", "e", "z", "c"]), vocab)
    np.testing.assert_array_equal(ids, np.array([1, 0, 3, 0, 2], dtype=np.uint64))


def test_test_file_junk_line_and_dotted_labels_are_handled():
    raw = data_prep.read_uci_rows(data_prep.DATA_DIR / "adult.test.gz")
    assert raw.shape == (16_281, 15)
    assert raw[0, 0] == "25" and raw[0, -1] == "<=50K."  # the junk line is gone
    labels = data_prep.load_adult("test").label
    assert labels.sum() == np.char.endswith(raw[:, -1], ">50K.").sum()  # dots stripped


def test_preparing_again_from_the_sources_gives_identical_arrays(tmp_path, train, test):
    for name in data_prep.SOURCES.values():
        shutil.copy(data_prep.DATA_DIR / name, tmp_path / name)
    for split, ref in (("train", train), ("test", test)):
        again = data_prep.load_adult(split, data_dir=tmp_path)
        np.testing.assert_array_equal(again.cat_ids, ref.cat_ids)
        np.testing.assert_array_equal(again.dense, ref.dense)
        np.testing.assert_array_equal(again.label, ref.label)
    assert (tmp_path / data_prep.CACHE_NAME).exists()


def test_a_malformed_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(
            "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K\n"
        )
        fh.write("50, Self-emp-not-inc, 83311\n")
    with pytest.raises(ValueError, match="line 2: expected 15"):
        data_prep.read_uci_rows(path)


def test_bad_split_and_batch_size_are_rejected(train):
    with pytest.raises(InvalidInputError, match="split"):
        data_prep.load_adult("valid")
    with pytest.raises(InvalidInputError, match="batch_size"):
        next(data_prep.make_batches(train, 0))


def test_make_batches_builds_one_single_id_feature_per_slot(train):
    pytest.importorskip("persia.embedding.data")
    batches = list(data_prep.make_batches(train, 128))
    assert len(batches) == 255
    first, last = batches[0], batches[-1]
    assert first.batch_size == 128 and last.batch_size == 32_561 - 254 * 128
    names = [f.name for f in first.id_type_features]
    assert names == list(data_prep.CATEGORICAL_COLUMNS)
    for j, feature in enumerate(first.id_type_features):
        np.testing.assert_array_equal(feature.data, train.cat_ids[:128, j])
    np.testing.assert_array_equal(first.non_id_type_features[0].data, train.dense[:128])
    np.testing.assert_array_equal(last.labels[0].data, train.label[-last.batch_size :])
    evaluation = next(data_prep.make_batches(train, 64, requires_grad=False))
    assert evaluation.requires_grad is False


def test_configs_parse_strictly_and_name_the_data_columns():
    schema = load_embedding_config(EXAMPLE / "config" / "embedding_config.yml", strict=True)
    assert schema.slot_names == data_prep.CATEGORICAL_COLUMNS
    assert {schema.slot(n).dim for n in schema.slot_names} == {8}
    cfg = load_global_config(EXAMPLE / "config" / "global_config.yml", strict=True)
    assert cfg.embedding_parameter_server_config.capacity >= 1000


def test_roc_auc_matches_pairwise_counting_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500).astype(np.float32)
    scores = np.round(rng.normal(size=500) + labels, 1)  # rounding makes many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    expected = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
    assert roc_auc(labels, scores) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(np.array([1, 1, 0]), np.array([0.2, 0.9, 0.1])) == 1.0
    assert np.isnan(roc_auc(np.ones(3), np.arange(3)))


def _train_module_constants() -> dict[str, float]:
    """EMBEDDING_LR / DENSE_LR as written in the example's train.py (read from the source by
    path, not imported: importing train.py needs the whole persia package, and another
    test's folder on sys.path may hold a train.py of its own)."""
    values = {}
    for line in (EXAMPLE / "train.py").read_text().splitlines():
        for name in ("EMBEDDING_LR", "DENSE_LR"):
            if line.startswith(f"{name} = "):
                values[name] = float(line.split("=", 1)[1])
    return values


@pytest.fixture
def one_torch_thread():
    """Tiny batches run fastest on one thread (and do not thrash when the CPU is shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_one_epoch_of_the_example_model_reaches_auc_090(train, test, one_torch_thread):
    lrs = _train_module_constants()
    sizes = [int(train.cat_ids[:, j].max()) + 1 for j in range(8)]
    start = time.perf_counter()
    result = train_single_process(
        array_batches(train.cat_ids, train.dense, train.label, 128),
        array_batches(test.cat_ids, test.dense, test.label, 1024),
        sizes,
        8,
        DNN,
        embedding_lr=lrs["EMBEDDING_LR"],
        dense_lr=lrs["DENSE_LR"],
    )
    elapsed = time.perf_counter() - start
    assert result["steps"] == 255 and result["samples"] == 32_561
    assert np.mean(result["losses"][-20:]) < np.mean(result["losses"][:20])
    assert result["auc"] >= 0.90, result["auc"]
    assert elapsed < 30
