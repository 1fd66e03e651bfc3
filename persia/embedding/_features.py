"""The feature types of a ``PersiaBatch`` and their checks (re-exported by ``persia.embedding.data``).

An id-type feature is kept in CSR form, built once with numpy (no Python loop over
ids)::

    samples   [10, 11]  []  [12]  [13, 14, 15]
    ids       [10, 11, 12, 13, 14, 15]            uint64, all ids concatenated
    offsets   [0, 2, 2, 3, 6]                     int64, batch_size + 1 entries;
                                                  sample i is ids[offsets[i]:offsets[i+1]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shared.errors import InvalidInputError

MAX_BATCH_SIZE = 65535
"""PERSIA's largest batch."""

_DENSE_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.float32, np.float64)
)
_DENSE_EXPECTED = (
    "a numpy array of dtype bool, int8, int16, int32, int64, uint8, float32 or float64"
)
_IDS_EXPECTED = "a 1-D numpy array of dtype uint64"


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__name__


def _bad(field: str, expected: str, value: Any = ...) -> InvalidInputError:
    got = "" if value is ... else f", got {_describe(value)}"
    return InvalidInputError(field, expected, message=f"{field}: expected {expected}{got}")


def _name_and_data(kind: str, first: Any, second: Any) -> tuple[str, Any]:
    """Accept ``(name, data)`` and the ``(data, name)`` order some PERSIA documents show."""
    if isinstance(first, str):
        return first, second
    if isinstance(second, str):
        return second, first
    raise TypeError(
        f"{kind}(name, data): expected a str name, got {_describe(first)} and {_describe(second)}"
    )


def _check_batch_size(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(field, f"an integer from 1 to {MAX_BATCH_SIZE}", value)
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise InvalidInputError(field, f"an integer from 1 to {MAX_BATCH_SIZE}", int(value))
    return int(value)


# --------------------------------------------------------------------------- features


class _IDFeature:
    """Common part of the id-type features: a name and CSR ``ids`` / ``offsets``."""

    name: str
    ids: np.ndarray
    offsets: np.ndarray

    @property
    def batch_size(self) -> int:
        return len(self.offsets) - 1

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "ids": self.ids, "offsets": self.offsets}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, batch_size={self.batch_size}, ids={len(self.ids)})"


class IDTypeFeature(_IDFeature):
    """Categorical ids, any number per sample (empty samples allowed), as a list of uint64 arrays.

    ``IDTypeFeature("user_tags", [np.array([3, 7], np.uint64), np.array([], np.uint64)])``;
    ``IDTypeFeature(data, name)`` is accepted too.
    """

    def __init__(self, name: str, data: Sequence[np.ndarray]):
        name, data = _name_and_data("IDTypeFeature", name, data)
        if not name:
            raise InvalidInputError("IDTypeFeature.name", "a non-empty string", name)
        if not isinstance(data, (list, tuple)):
            raise TypeError(
                f"IDTypeFeature {name!r}: expected a list of uint64 arrays, got {_describe(data)}"
            )
        for i, sample in enumerate(data):  # one check per sample, never per id
            if not isinstance(sample, np.ndarray) or sample.dtype != np.uint64 or sample.ndim != 1:
                raise _bad(f"IDTypeFeature {name!r}: data[{i}]", _IDS_EXPECTED, sample)
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        self.name = name
        self.offsets = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.ids = np.concatenate(data) if data else np.empty(0, dtype=np.uint64)
        self._data = list(data)

    @classmethod
    def from_csr(cls, name: str, ids: np.ndarray, offsets: np.ndarray) -> IDTypeFeature:
        """Build from CSR arrays (checked as wire input, field names ``name``, ``ids``, ``offsets``)."""
        return _id_feature_from_wire(
            {"name": name, "ids": ids, "offsets": offsets}, "IDTypeFeature", None
        )

    @property
    def data(self) -> list[np.ndarray]:
        """One uint64 array per sample (views into :attr:`ids` when built from CSR)."""
        if self._data is None:
            self._data = np.split(self.ids, self.offsets[1:-1])
        return self._data


class IDTypeFeatureWithSingleID(_IDFeature):
    """Exactly one id per sample, as one 1-D uint64 array: the cheap form of :class:`IDTypeFeature`."""

    def __init__(self, name: str, data: np.ndarray):
        name, data = _name_and_data("IDTypeFeatureWithSingleID", name, data)
        if not name:
            raise InvalidInputError("IDTypeFeatureWithSingleID.name", "a non-empty string", name)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint64 or data.ndim != 1:
            raise _bad(f"IDTypeFeatureWithSingleID {name!r}: data", _IDS_EXPECTED, data)
        self.name = name
        self.ids = data
        self.offsets = np.arange(len(data) + 1, dtype=np.int64)

    @property
    def data(self) -> np.ndarray:
        return self.ids


class NdarrayDataBase:
    """Dense data of any shape whose first axis is the batch (PERSIA's base of the two below)."""

    DEFAULT_NAME = "ndarray_base"

    def __init__(self, data: np.ndarray, name: str | None = None):
        if isinstance(data, str) and isinstance(name, np.ndarray):
            data, name = name, data  # the (name, data) order
        kind = type(self).__name__
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{kind}: expected name to be a str or None, got {_describe(name)}")
        if not isinstance(data, np.ndarray) or data.dtype not in _DENSE_DTYPES or data.ndim < 1:
            raise _bad(
                f"{kind} {name or self.DEFAULT_NAME!r}: data",
                _DENSE_EXPECTED + " with ndim >= 1",
                data,
            )
        self.data = data
        self._name = name

    @property
    def name(self) -> str:
        """The given name, or the class's default name when none was given."""
        return self._name or self.DEFAULT_NAME

    @property
    def batch_size(self) -> int:
        return int(self.data.shape[0])

    def __len__(self) -> int:
        return len(self.data)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self._name, "data": self.data}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_describe(self.data)}, name={self._name!r})"


class NonIDTypeFeature(NdarrayDataBase):
    """Dense input features (e.g. float32 ``(batch, n)`` or uint8 images)."""

    DEFAULT_NAME = "non_id_type_feature_anonymous"


class Label(NdarrayDataBase):
    """Training targets, any supported dtype and shape ``(batch, ...)``."""

    DEFAULT_NAME = "label_anonymous"


IDFeature = IDTypeFeature | IDTypeFeatureWithSingleID


def _check_unique(names: list[str | None], field: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in seen:
            raise InvalidInputError(f"{field}[{i}].name", "names unique within the batch", name)
        seen.add(name)


# --------------------------------------------------------------------------- wire input


def _mapping(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidInputError(field, "a mapping", type(value).__name__)
    return value


def _id_feature_from_wire(item: Any, field: str, batch_size: int | None) -> IDTypeFeature:
    d = _mapping(item, field)
    name, ids, offsets = d.get("name"), d.get("ids"), d.get("offsets")
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"{field}.name", "a non-empty string", name)
    if not isinstance(ids, np.ndarray) or ids.dtype != np.uint64 or ids.ndim != 1:
        raise _bad(f"{field}.ids", _IDS_EXPECTED, ids)
    if not isinstance(offsets, np.ndarray) or offsets.dtype != np.int64 or offsets.ndim != 1:
        raise _bad(f"{field}.offsets", "a 1-D numpy array of dtype int64", offsets)
    expected_len = None if batch_size is None else batch_size + 1
    if len(offsets) < 2 or (expected_len is not None and len(offsets) != expected_len):
        what = "batch_size + 1" if expected_len is None else str(expected_len)
        raise InvalidInputError(f"{field}.offsets", f"{what} entries (at least 2)", len(offsets))
    if offsets[0] != 0 or offsets[-1] != len(ids) or np.any(offsets[1:] < offsets[:-1]):
        raise InvalidInputError(
            f"{field}.offsets",
            f"non-decreasing offsets from 0 to len(ids) = {len(ids)}",
            message=f"{field}.offsets: expected non-decreasing offsets from 0 to len(ids) = "
            f"{len(ids)}, got first {int(offsets[0])}, last {int(offsets[-1])}",
        )
    feature = IDTypeFeature.__new__(IDTypeFeature)
    feature.name, feature.ids, feature.offsets, feature._data = name, ids, offsets, None
    return feature


def _dense_from_wire(
    item: Any, field: str, batch_size: int, cls: type[NdarrayDataBase]
) -> NdarrayDataBase:
    d = _mapping(item, field)
    name, data = d.get("name"), d.get("data")
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidInputError(f"{field}.name", "a non-empty string or null", name)
    if not isinstance(data, np.ndarray) or data.dtype not in _DENSE_DTYPES or data.ndim < 1:
        raise _bad(f"{field}.data", _DENSE_EXPECTED + " with ndim >= 1", data)
    if data.shape[0] != batch_size:
        raise InvalidInputError(
            f"{field}.data", f"{batch_size} rows (the batch size)", data.shape[0]
        )
    obj = cls.__new__(cls)
    obj.data, obj._name = data, name
    return obj
