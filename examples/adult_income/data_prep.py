"""The data step of the Adult example: UCI Adult CSV files -> arrays -> ``PersiaBatch``es.

Reads the two gzipped UCI files committed beside this script (``data/adult.data.gz``,
``data/adult.test.gz``), turns them into model inputs and caches the result in
``data/adult_prepared.npz`` (git-ignored, rebuilt when missing or older than the sources).

Per sample, as in PERSIA's adult-income example::

    cat_ids  uint64  (n, 8)  workclass, education, marital_status, occupation,
                             relationship, race, gender, native_country
    dense    float32 (n, 5)  age, education_num, capital_gain, capital_loss, hours_per_week
    label    float32 (n, 1)  1.0 when income is ">50K"

Categorical ids come from the TRAIN file's vocabulary of each column: the sorted
distinct values get ids 1, 2, ...; a test value never seen in training gets the
reserved id 0 (:data:`UNKNOWN_ID`). Why a vocabulary and not a string hash: the ids
are then small and dense, so the single-process baseline can hold one exact
``nn.EmbeddingBag`` row per value (no collisions), the ids are the same on every
machine (they depend only on the committed train file), and nothing about the test
split leaks into the ids. The embedding servers do not care: they key on any uint64,
and the slot's index prefix keeps equal ids in two columns apart.

Continuous columns: ``log1p`` for the heavy-tailed capital_gain / capital_loss, then
standardized with the TRAIN mean and standard deviation (the test split uses the same
numbers).

Run ``python data_prep.py`` to prepare the cache ahead of a job.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:  # persia.embedding.data is imported lazily by make_batches
    from persia.embedding.data import PersiaBatch

DATA_DIR = Path(__file__).resolve().parent / "data"
CACHE_NAME = "adult_prepared.npz"
CACHE_VERSION = 1

COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education_num",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
    "native_country",
    "income_bracket",
)
CATEGORICAL_COLUMNS = (
    "workclass",
    "education",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "native_country",
)
CONTINUOUS_COLUMNS = ("age", "education_num", "capital_gain", "capital_loss", "hours_per_week")
LOG1P_COLUMNS = frozenset({"capital_gain", "capital_loss"})
POSITIVE_LABEL = ">50K"
UNKNOWN_ID = 0
SOURCES = {"train": "adult.data.gz", "test": "adult.test.gz"}

Split = Literal["train", "test"]


@dataclass(frozen=True)
class AdultData:
    """One split as model inputs (see the module docstring for the layout).

    Shapes and dtypes are checked on construction, so every consumer can rely on them.
    """

    cat_ids: np.ndarray
    dense: np.ndarray
    label: np.ndarray
    cat_columns: tuple[str, ...]
    dense_columns: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.label)
        _check_array("cat_ids", self.cat_ids, np.uint64, (n, len(self.cat_columns)))
        _check_array("dense", self.dense, np.float32, (n, len(self.dense_columns)))
        _check_array("label", self.label, np.float32, (n, 1))

    def __len__(self) -> int:
        return len(self.label)

    @property
    def positive_rate(self) -> float:
        """Share of samples with label 1."""
        return float(self.label.mean()) if len(self) else 0.0


def _check_array(field: str, value: Any, dtype: Any, shape: tuple[int, int]) -> None:
    from pyrsia.shared.errors import InvalidInputError

    if not isinstance(value, np.ndarray) or value.dtype != dtype or value.shape != shape:
        got = (
            f"{value.dtype} array of shape {value.shape}"
            if isinstance(value, np.ndarray)
            else type(value).__name__
        )
        raise InvalidInputError(field, f"a {np.dtype(dtype)} array of shape {shape}", got)


# --------------------------------------------------------------------------- parsing


def read_uci_rows(path: str | os.PathLike[str]) -> np.ndarray:
    """The raw fields of a gzipped UCI Adult file as a (n, 15) string array.

    Skips blank lines and the junk first line of ``adult.test`` (``|1x3 Cross validator``);
    any other line without 15 fields is an error naming the file and line.
    """
    with gzip.open(path, "rt", encoding="ascii", newline="") as fh:
        text = fh.read()
    rows = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True), 1):
        if not row or (lineno == 1 and row[0].startswith("|")):
            continue
        if len(row) != len(COLUMNS):
            raise ValueError(
                f"{path}: line {lineno}: expected {len(COLUMNS)} comma-separated fields, "
                f"got {len(row)}"
            )
        rows.append(row)
    return np.array(rows, dtype=str)


def _labels(raw: np.ndarray) -> np.ndarray:
    """``>50K`` / ``>50K.`` -> 1.0, ``<=50K`` / ``<=50K.`` -> 0.0, as float32 (n, 1)."""
    text = np.char.rstrip(raw, ".")
    known = np.isin(text, [POSITIVE_LABEL, "<=50K"])
    if not known.all():
        bad = raw[~known][0]
        raise ValueError(f"income_bracket: expected '>50K' or '<=50K', got {bad!r}")
    return (text == POSITIVE_LABEL).astype(np.float32).reshape(-1, 1)


def _continuous(rows: np.ndarray) -> np.ndarray:
    """The continuous columns as float64 (n, 5), log1p applied where skewed."""
    idx = [COLUMNS.index(c) for c in CONTINUOUS_COLUMNS]
    values = rows[:, idx].astype(np.float64)
    for j, name in enumerate(CONTINUOUS_COLUMNS):
        if name in LOG1P_COLUMNS:
            values[:, j] = np.log1p(values[:, j])
    return values


def encode_with_vocab(values: np.ndarray, vocab: np.ndarray) -> np.ndarray:
    """Ids of ``values`` in the sorted ``vocab``: index + 1, or :data:`UNKNOWN_ID` if absent."""
    pos = np.searchsorted(vocab, values)
    pos_clipped = np.minimum(pos, len(vocab) - 1)
    found = vocab[pos_clipped] == values
    return np.where(found, pos_clipped + 1, UNKNOWN_ID).astype(np.uint64)


def prepare(data_dir: str | os.PathLike[str] = DATA_DIR) -> dict[str, np.ndarray]:
    """Parse both splits and encode them with the train vocabulary and statistics.

    Returns the arrays written to the cache: ``{split}_cat_ids``, ``{split}_dense``,
    ``{split}_label`` for both splits, ``vocab_<column>``, ``dense_mean`` and ``dense_std``.
    """
    data_dir = Path(data_dir)
    raw = {split: read_uci_rows(data_dir / name) for split, name in SOURCES.items()}
    out: dict[str, np.ndarray] = {"version": np.array(CACHE_VERSION)}
    cat_idx = [COLUMNS.index(c) for c in CATEGORICAL_COLUMNS]
    vocabs = [np.unique(raw["train"][:, i]) for i in cat_idx]
    train_dense = _continuous(raw["train"])
    mean = train_dense.mean(axis=0)
    std = train_dense.std(axis=0)
    std[std == 0] = 1.0
    for split, rows in raw.items():
        cat = np.stack(
            [
                encode_with_vocab(rows[:, i], vocab)
                for i, vocab in zip(cat_idx, vocabs, strict=True)
            ],
            axis=1,
        )
        dense = train_dense if split == "train" else _continuous(rows)
        out[f"{split}_cat_ids"] = np.ascontiguousarray(cat, dtype=np.uint64)
        out[f"{split}_dense"] = ((dense - mean) / std).astype(np.float32)
        out[f"{split}_label"] = _labels(rows[:, COLUMNS.index("income_bracket")])
    for name, vocab in zip(CATEGORICAL_COLUMNS, vocabs, strict=True):
        out[f"vocab_{name}"] = vocab
    out["dense_mean"] = mean
    out["dense_std"] = std
    return out


# --------------------------------------------------------------------------- cache


def _cache_is_fresh(cache: Path, data_dir: Path) -> bool:
    if not cache.exists():
        return False
    newest_source = max((data_dir / name).stat().st_mtime for name in SOURCES.values())
    if cache.stat().st_mtime < newest_source:
        return False
    with np.load(cache) as z:
        return "version" in z.files and int(z["version"]) == CACHE_VERSION


def prepare_cache(data_dir: str | os.PathLike[str] = DATA_DIR, *, force: bool = False) -> Path:
    """Write (or keep, when fresh) ``data_dir/adult_prepared.npz``; returns its path."""
    data_dir = Path(data_dir)
    cache = data_dir / CACHE_NAME
    if force or not _cache_is_fresh(cache, data_dir):
        arrays = prepare(data_dir)
        tmp = cache.with_name(f".{CACHE_NAME}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, cache)  # atomic: concurrent readers never see half a file
    return cache


def env_int(name: str, default: int) -> int:
    """A non-negative integer from the environment, with an error naming the variable."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name}: expected a non-negative integer, got {raw!r}") from None
    if value < 0:
        raise SystemExit(f"{name}: expected a non-negative integer, got {raw!r}")
    return value


def load_adult(split: Split, data_dir: str | os.PathLike[str] = DATA_DIR) -> AdultData:
    """One split of UCI Adult as :class:`AdultData`, from the cache (built on first use)."""
    if split not in SOURCES:
        from pyrsia.shared.errors import InvalidInputError

        raise InvalidInputError("split", '"train" or "test"', split)
    cache = prepare_cache(data_dir)
    with np.load(cache) as z:
        return AdultData(
            cat_ids=z[f"{split}_cat_ids"],
            dense=z[f"{split}_dense"],
            label=z[f"{split}_label"],
            cat_columns=CATEGORICAL_COLUMNS,
            dense_columns=CONTINUOUS_COLUMNS,
        )


def vocabulary(column: str, data_dir: str | os.PathLike[str] = DATA_DIR) -> np.ndarray:
    """The train vocabulary of a categorical column (value ``v`` has id ``index + 1``)."""
    if column not in CATEGORICAL_COLUMNS:
        from pyrsia.shared.errors import InvalidInputError

        raise InvalidInputError("column", f"one of {list(CATEGORICAL_COLUMNS)}", column)
    with np.load(prepare_cache(data_dir)) as z:
        return z[f"vocab_{column}"]


# --------------------------------------------------------------------------- batches


def make_batches(
    data: AdultData, batch_size: int, *, requires_grad: bool = True, drop_last: bool = False
) -> Iterator[PersiaBatch]:
    """Cut ``data`` into ``PersiaBatch``es of ``batch_size`` samples, in order.

    Each batch has one ``IDTypeFeatureWithSingleID`` per categorical column (named after
    the column, matching ``slots_config``), one ``NonIDTypeFeature`` with the dense
    columns and one ``Label``. Works for any object with AdultData's fields.
    ``requires_grad=False`` marks evaluation batches.
    """
    from persia.embedding.data import (
        IDTypeFeatureWithSingleID,
        Label,
        NonIDTypeFeature,
        PersiaBatch,
    )

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        from pyrsia.shared.errors import InvalidInputError

        raise InvalidInputError("batch_size", "a positive integer", batch_size)
    columns = np.ascontiguousarray(data.cat_ids.T)  # one contiguous row per slot
    n = len(data.label)
    for start in range(0, n, batch_size):
        end = min(start + batch_size, n)
        if drop_last and end - start < batch_size:
            return
        yield PersiaBatch(
            [
                IDTypeFeatureWithSingleID(name, columns[j, start:end])
                for j, name in enumerate(data.cat_columns)
            ],
            non_id_type_features=[NonIDTypeFeature(data.dense[start:end])],
            labels=[Label(data.label[start:end])],
            requires_grad=requires_grad,
        )


def main() -> int:
    cache = prepare_cache(force="--force" in sys.argv[1:])
    for split in SOURCES:
        d = load_adult(split)
        print(f"{split}: {len(d)} rows, {d.positive_rate:.2%} positive -> {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
