"""The two halves of a batch on the wire: :class:`IDPart` and :class:`DensePart`.

A data loader sends ``IDPart`` (id-type features in CSR form) to an embedding worker and
``DensePart`` (dense features, labels, meta) to an NN worker; ``persia.embedding.data``
builds both from a ``PersiaBatch``. ``from_wire`` checks every field once, names the
offending one (``batch.id_type_features[1].offsets``) and keeps the decoded arrays as
they are (read-only views of the request body: no copy)::

    IDPart    {"batch_size": int, "requires_grad": bool,
               "id_type_features": [{"name": str, "ids": uint64[n], "offsets": int64[batch_size + 1]}]}
              "offsets" left out: one id per sample (``single_id_offsets``; half the bytes
              of a single-id feature, and the worker knows the slot needs no pooling)
    DensePart {"batch_size": int, "meta": bytes | None,
               "non_id_type_features": [{"name": str | None, "data": ndarray (batch_size, ...)}],
               "labels": [{"name": str | None, "data": ndarray (batch_size, ...)}]}

Float dense features and labels must be finite (:func:`check_finite`): a NaN or an
infinity is refused with the field, the feature's name and the first bad row.

Keys other than these are ignored (a whole ``PersiaBatch.to_wire()`` carries both halves).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrsia.shared.constants import MAX_BATCH_SIZE, MAX_FEATURES
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import as_dict, describe, join

DENSE_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.float32, np.float64)
)
DENSE_EXPECTED = "a numpy array of dtype bool, int8, int16, int32, int64, uint8, float32 or float64"
IDS_EXPECTED = "a 1-D numpy array of dtype uint64"
NON_ID_TYPE_FEATURE_DEFAULT_NAME = "non_id_type_feature_anonymous"
"""The name of a dense feature sent without one (PERSIA's ``NonIDTypeFeature`` default)."""
LABEL_DEFAULT_NAME = "label_anonymous"
"""The name of a label sent without one (PERSIA's ``Label`` default)."""


def check_batch_size(value: Any, field: str) -> int:
    """An integer in ``1..MAX_BATCH_SIZE``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(field, f"an integer from 1 to {MAX_BATCH_SIZE}", value)
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise InvalidInputError(field, f"an integer from 1 to {MAX_BATCH_SIZE}", int(value))
    return int(value)


def check_unique(names: list[str | None], field: str) -> None:
    """Names (None aside) are unique; the error names the first repeat's position."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in seen:
            raise InvalidInputError(f"{field}[{i}].name", "names unique within the batch", name)
        seen.add(name)


def bad_array(field: str, expected: str, value: Any) -> InvalidInputError:
    """The error for a value that is not the array expected (dtype and shape in the message)."""
    return InvalidInputError(
        field, expected, message=f"{field}: expected {expected}, got {describe(value)}"
    )


def check_finite(data: np.ndarray, field: str) -> None:
    """Refuse a float array holding NaN or infinity, naming ``field`` and the first bad row.

    One batch with a NaN label or an infinite dense value turns every dense parameter NaN
    at its first optimizer step, and training then goes on printing NaN losses; so the
    batch is refused where it is built (``PersiaBatch``) and again where an NN worker
    receives it (:meth:`DensePart.from_wire`, a 400). Integer and bool arrays cannot hold
    either. One ``np.isfinite`` pass over the array (about 4 us for a Census-sized batch's
    (1024, 13) float32 features and its labels); the row search runs only on a bad batch.
    """
    if data.dtype.kind != "f":
        return
    finite = np.isfinite(data)
    if finite.all():
        return
    rows_ok = finite.reshape(len(data), -1).all(axis=1)
    row = int(np.argmax(~rows_ok))
    values = data.reshape(len(data), -1)[row]
    value = values[~np.isfinite(values)][0]
    raise InvalidInputError(
        field,
        "finite numbers",
        float(value),
        message=f"{field}: expected finite numbers, got {value} in row {row} "
        f"({int(np.count_nonzero(~rows_ok))} of {len(data)} rows hold NaN or infinity); "
        "one such batch turns every dense parameter NaN: drop or impute those rows "
        "in the data loader",
    )


def _features(d: dict, key: str, field: str) -> list:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInputError(field, "a list", type(value).__name__)
    if len(value) > MAX_FEATURES:
        raise InvalidInputError(field, f"at most {MAX_FEATURES} features", f"{len(value)}")
    return value


@functools.lru_cache(maxsize=64)
def single_id_offsets(batch_size: int) -> np.ndarray:
    """``0, 1, ..., batch_size``: the offsets of a feature with one id per sample (read-only,
    one shared array per batch size, so ``offsets is single_id_offsets(n)`` tells that case)."""
    offsets = np.arange(batch_size + 1, dtype=np.int64)
    offsets.setflags(write=False)
    return offsets


@dataclass(frozen=True, eq=False)
class IDFeature:
    """One id-type feature in CSR form: sample i owns ``ids[offsets[i]:offsets[i + 1]]``."""

    name: str
    ids: np.ndarray  # uint64 (n,)
    offsets: np.ndarray  # int64 (batch_size + 1,)

    @property
    def batch_size(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_wire(cls, item: Any, field: str, batch_size: int | None) -> IDFeature:
        """Check name, dtypes and offsets (``batch_size + 1`` entries, 0 .. len(ids), sorted)."""
        d = as_dict(item, field)
        name, ids, offsets = d.get("name"), d.get("ids"), d.get("offsets")
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"{field}.name", "a non-empty string", name)
        if not isinstance(ids, np.ndarray) or ids.dtype != np.uint64 or ids.ndim != 1:
            raise bad_array(f"{field}.ids", IDS_EXPECTED, ids)
        if offsets is None and "offsets" not in d:  # one id per sample
            if len(ids) < 1 or (batch_size is not None and len(ids) != batch_size):
                want = "at least 1" if batch_size is None else str(batch_size)
                raise InvalidInputError(
                    f"{field}.ids", f"{want} ids (one per sample: no offsets were sent)", len(ids)
                )
            return cls(name, ids, single_id_offsets(len(ids)))
        if not isinstance(offsets, np.ndarray) or offsets.dtype != np.int64 or offsets.ndim != 1:
            raise bad_array(f"{field}.offsets", "a 1-D numpy array of dtype int64", offsets)
        expected_len = None if batch_size is None else batch_size + 1
        if len(offsets) < 2 or (expected_len is not None and len(offsets) != expected_len):
            what = "batch_size + 1" if expected_len is None else str(expected_len)
            raise InvalidInputError(
                f"{field}.offsets", f"{what} entries (at least 2)", len(offsets)
            )
        # the ndarray method, not np.any: a small batch pays numpy's dispatch per feature
        if offsets[0] != 0 or offsets[-1] != len(ids) or (offsets[1:] < offsets[:-1]).any():
            raise InvalidInputError(
                f"{field}.offsets",
                f"non-decreasing offsets from 0 to len(ids) = {len(ids)}",
                message=f"{field}.offsets: expected non-decreasing offsets from 0 to len(ids) = "
                f"{len(ids)}, got first {int(offsets[0])}, last {int(offsets[-1])}",
            )
        return cls(name, ids, offsets)

    def to_wire(self) -> dict[str, Any]:
        if self.offsets is single_id_offsets(len(self.ids)):
            return {"name": self.name, "ids": self.ids}
        return {"name": self.name, "ids": self.ids, "offsets": self.offsets}


@dataclass(frozen=True, eq=False)
class DenseArray:
    """A dense feature or a label: an optional name and an array whose rows are the batch."""

    name: str | None
    data: np.ndarray

    @classmethod
    def from_wire(cls, item: Any, field: str, batch_size: int) -> DenseArray:
        d = as_dict(item, field)
        name, data = d.get("name"), d.get("data")
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidInputError(f"{field}.name", "a non-empty string or null", name)
        if not isinstance(data, np.ndarray) or data.dtype not in DENSE_DTYPES or data.ndim < 1:
            raise bad_array(f"{field}.data", DENSE_EXPECTED + " with ndim >= 1", data)
        if data.shape[0] != batch_size:
            raise InvalidInputError(
                f"{field}.data", f"{batch_size} rows (the batch size)", data.shape[0]
            )
        check_finite(data, f"{field}.data" if name is None else f"{field}.data ({name!r})")
        return cls(name, data)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "data": self.data}


@dataclass(frozen=True, eq=False)
class IDPart:
    """The id half of a batch, as an embedding worker receives it."""

    batch_size: int
    requires_grad: bool
    id_type_features: tuple[IDFeature, ...]

    @classmethod
    def from_wire(cls, data: Any, field: str = "") -> IDPart:
        """Check every field; ``field`` prefixes the names in errors (``"batch"``)."""
        d = as_dict(data, field or "batch")
        size = check_batch_size(d.get("batch_size"), join(field, "batch_size"))
        requires_grad = d.get("requires_grad")
        if not isinstance(requires_grad, bool):
            raise InvalidInputError(join(field, "requires_grad"), "true or false", requires_grad)
        where = join(field, "id_type_features")
        raw = _features(d, "id_type_features", where)
        if not raw:
            raise InvalidInputError(where, "at least one id-type feature", [])
        features = tuple(IDFeature.from_wire(x, f"{where}[{i}]", size) for i, x in enumerate(raw))
        check_unique([f.name for f in features], where)
        return cls(size, requires_grad, features)

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "requires_grad": self.requires_grad,
            "id_type_features": [f.to_wire() for f in self.id_type_features],
        }


@dataclass(frozen=True, eq=False)
class DensePart:
    """The dense half of a batch, as an NN worker receives it."""

    batch_size: int
    non_id_type_features: tuple[DenseArray, ...]
    labels: tuple[DenseArray, ...]
    meta: bytes | None

    @classmethod
    def from_wire(cls, data: Any, field: str = "") -> DensePart:
        """Check every field; ``field`` prefixes the names in errors (``"dense"``)."""
        d = as_dict(data, field or "batch")
        size = check_batch_size(d.get("batch_size"), join(field, "batch_size"))
        meta = d.get("meta")
        if meta is not None and not isinstance(meta, bytes):
            raise InvalidInputError(join(field, "meta"), "bytes or null", type(meta).__name__)
        parts = []
        for key in ("non_id_type_features", "labels"):
            where = join(field, key)
            items = tuple(
                DenseArray.from_wire(x, f"{where}[{i}]", size)
                for i, x in enumerate(_features(d, key, where))
            )
            check_unique([f.name for f in items], where)
            parts.append(items)
        return cls(size, parts[0], parts[1], meta)

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "meta": self.meta,
            "non_id_type_features": [f.to_wire() for f in self.non_id_type_features],
            "labels": [f.to_wire() for f in self.labels],
        }
