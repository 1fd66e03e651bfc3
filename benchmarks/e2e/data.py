"""The benchmark's data: prepared once into an npz that every process of the run reads.

``prepare(dataset, path, criteo_rows=...)`` writes::

    train_cat_ids uint64 (n, slots)   test_cat_ids uint64 (m, slots)
    train_dense float32 (n, d)        test_dense float32 (m, d)
    train_label float32 (n, 1)        test_label float32 (m, 1)
    cardinalities int64 (slots,)      slot_names str (slots,)

- ``census``: the real Census-Income (KDD) set (``benchmarks.datasets.load_census_income``;
  199,523 train / 99,762 test rows, ids are train-vocabulary indices).
- ``criteo``: the Criteo-shaped synthetic set (26 Zipf slots, 13 dense), ``criteo_rows``
  train rows plus a quarter as many test rows from the same hidden model; ids are
  remapped per slot to dense indices 1.. so the baseline can hold one exact
  ``EmbeddingBag`` row per id (the servers key on any uint64 and do not care).

``persia_batches`` cuts a split into ``PersiaBatch``es (Pyrsia's data loader and test
set); ``benchmarks.baseline.array_batches`` cuts the same arrays for the baseline, so
both sides see identical batches in identical order.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO, REPO / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from baseline import roc_auc  # noqa: E402  (re-exported for train.py)

__all__ = ["load", "persia_batches", "prepare", "roc_auc", "write_configs"]

DATASETS = ("census", "criteo")


def _criteo(rows: int, seed: int) -> dict[str, np.ndarray]:
    from datasets import criteo_synthetic

    n_test = max(rows // 4, 1)
    data = criteo_synthetic(rows + n_test, seed)
    cat = np.empty_like(data.cat_ids)
    cards = np.empty(cat.shape[1], dtype=np.int64)
    for j in range(cat.shape[1]):  # one vectorized remap per slot (26), not per id
        uniq, inverse = np.unique(data.cat_ids[:, j], return_inverse=True)
        cat[:, j] = inverse.astype(np.uint64) + np.uint64(1)
        cards[j] = len(uniq) + 1
    return {
        "train_cat_ids": cat[:rows],
        "test_cat_ids": cat[rows:],
        "train_dense": data.dense[:rows],
        "test_dense": data.dense[rows:],
        "train_label": data.label[:rows],
        "test_label": data.label[rows:],
        "cardinalities": cards,
        "slot_names": np.array(data.cat_columns),
    }


def _census() -> dict[str, np.ndarray]:
    from datasets import load_census_income

    out: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        d = load_census_income(split)
        out[f"{split}_cat_ids"] = d.cat_ids
        out[f"{split}_dense"] = d.dense
        out[f"{split}_label"] = d.label
    out["cardinalities"] = np.array(d.cardinalities, dtype=np.int64)
    out["slot_names"] = np.array(d.cat_columns)
    return out


def prepare(
    dataset: str,
    path: str | os.PathLike[str],
    *,
    criteo_rows: int = 1_000_000,
    seed: int = 0,
    max_train_rows: int | None = None,
    max_test_rows: int | None = None,
) -> Path:
    """Write the arrays of ``dataset`` (optionally truncated, for smoke runs) to ``path``."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset: expected one of {DATASETS}, got {dataset!r}")
    if dataset == "criteo" and criteo_rows < 1:
        raise ValueError(f"criteo_rows: expected a positive integer, got {criteo_rows}")
    arrays = _census() if dataset == "census" else _criteo(criteo_rows, seed)
    for split, cap in (("train", max_train_rows), ("test", max_test_rows)):
        if cap is not None:
            for key in ("cat_ids", "dense", "label"):
                arrays[f"{split}_{key}"] = arrays[f"{split}_{key}"][:cap]
    path = Path(path)
    np.savez(path, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    return path


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The arrays ``prepare`` wrote (all in memory; slot names as a tuple of str)."""
    with np.load(path) as z:
        out: dict[str, Any] = {k: z[k] for k in z.files}
    out["slot_names"] = tuple(str(s) for s in out["slot_names"])
    return out


def persia_batches(
    data: dict[str, Any], split: str, batch_size: int, *, requires_grad: bool = True
) -> Iterator[Any]:
    """``PersiaBatch``es of ``batch_size`` rows of ``split``, in order (the last may be short)."""
    from persia.embedding.data import (
        IDTypeFeatureWithSingleID,
        Label,
        NonIDTypeFeature,
        PersiaBatch,
    )

    columns = np.ascontiguousarray(data[f"{split}_cat_ids"].T)  # one contiguous row per slot
    dense, label = data[f"{split}_dense"], data[f"{split}_label"]
    names = data["slot_names"]
    for start in range(0, len(label), batch_size):
        end = min(start + batch_size, len(label))
        yield PersiaBatch(
            [
                IDTypeFeatureWithSingleID(name, columns[j, start:end])
                for j, name in enumerate(names)
            ],
            non_id_type_features=[NonIDTypeFeature(dense[start:end])],
            labels=[Label(label[start:end])],
            requires_grad=requires_grad,
        )


def write_configs(data: dict[str, Any], directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``embedding_config.yml`` (one dim-16 summed slot per column) and ``global_config.yml``."""
    from model import EMBEDDING_DIM

    directory = Path(directory)
    names = data["slot_names"]
    emb = directory / "embedding_config.yml"
    emb.write_text(
        "feature_index_prefix_bit: 8\nslots_config:\n"
        + "".join(f"  {name}: {{dim: {EMBEDDING_DIM}}}\n" for name in names)
    )
    capacity = int(data["cardinalities"].sum()) * 2 + 1024
    glob = directory / "global_config.yml"
    glob.write_text(
        "common_config:\n  job_type: Train\n"
        f"embedding_parameter_server_config:\n  capacity: {capacity}\n"
        "  num_hashmap_internal_shards: 1\n"
        "embedding_worker_config:\n  forward_buffer_size: 1000\n"
    )
    return emb, glob
