"""Benchmark data sets: the real Census-Income (KDD) files and the Criteo-shaped synthetic set."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.baseline import roc_auc
from benchmarks.datasets import (
    CENSUS_CATEGORICAL,
    CENSUS_NUMERIC,
    census_dir,
    criteo_synthetic,
    load_census_income,
)


@pytest.fixture(scope="module")
def census():
    if census_dir() is None:
        pytest.skip("Census-Income files not on this machine (set PYRSIA_CENSUS_DIR)")
    # prepared once into $PYRSIA_DATA_CACHE (~/.cache/pyrsia), then read from the npz
    return load_census_income("train"), load_census_income("test")


def test_census_income_matches_the_uci_facts(census):
    train, test = census
    assert len(train) == 199_523 and len(test) == 99_762
    assert train.positive_rate == pytest.approx(0.062, abs=0.001)
    assert test.positive_rate == pytest.approx(0.062, abs=0.001)
    assert len(CENSUS_CATEGORICAL) == 33 and len(CENSUS_NUMERIC) == 7
    assert "instance_weight" not in CENSUS_CATEGORICAL + CENSUS_NUMERIC
    for d in (train, test):
        assert d.cat_ids.dtype == np.uint64 and d.cat_ids.shape == (len(d), 33)
        assert d.dense.dtype == np.float32 and d.dense.shape == (len(d), 7)
        assert np.isfinite(d.dense).all()
        assert (d.cat_ids < np.array(d.cardinalities, dtype=np.uint64)).all()
    assert (train.cat_ids > 0).all()  # every train value is in the train vocabulary
    np.testing.assert_allclose(train.dense.mean(axis=0), 0, atol=1e-4)


def test_criteo_synthetic_is_shaped_like_criteo_and_deterministic():
    a = criteo_synthetic(20_000, seed=1)
    b = criteo_synthetic(20_000, seed=1)
    c = criteo_synthetic(20_000, seed=2)
    assert a.cat_ids.shape == (20_000, 26) and a.dense.shape == (20_000, 13)
    assert a.cat_ids.dtype == np.uint64 and a.cat_ids.max() < 10_000_000
    np.testing.assert_array_equal(a.cat_ids, b.cat_ids)
    np.testing.assert_array_equal(a.label, b.label)
    assert not np.array_equal(a.cat_ids, c.cat_ids)
    assert 0.15 < a.positive_rate < 0.40
    # Zipf: a few ids dominate each slot, and a long tail is seen once
    _, counts = np.unique(a.cat_ids[:, 0], return_counts=True)
    assert counts.max() > 0.05 * len(a) and (counts == 1).sum() > 1000


def test_criteo_synthetic_labels_carry_signal_in_ids_and_dense():
    d = criteo_synthetic(50_000, seed=0)
    # the dense part alone ranks positives above negatives
    w, *_ = np.linalg.lstsq(d.dense, d.label.reshape(-1) - d.positive_rate, rcond=None)
    assert roc_auc(d.label, d.dense @ w) > 0.6
    # the most frequent id of a slot has a positive rate far from its neighbours'
    ids = d.cat_ids[:, 0]
    values, counts = np.unique(ids, return_counts=True)
    top = values[np.argsort(counts)[-10:]]
    rates = [d.label[ids == v].mean() for v in top]
    assert max(rates) - min(rates) > 0.05


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="split"):
        load_census_income("validation")
    with pytest.raises(ValueError, match="n: expected"):
        criteo_synthetic(0)
