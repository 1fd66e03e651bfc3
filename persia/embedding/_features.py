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
from shared.validate import describe as _describe
from shared.wire.batch import (
    DENSE_DTYPES,
    DENSE_EXPECTED,
    IDS_EXPECTED,
    MAX_BATCH_SIZE,
    DenseArray,
    IDFeature,
    single_id_offsets,
)
from shared.wire.batch import bad_array as _bad

__all__ = ["MAX_BATCH_SIZE"]  # the rest is re-exported by persia.embedding.data


def _name_and_data(kind: str, first: Any, second: Any) -> tuple[str, Any]:
    """Accept ``(name, data)`` and the ``(data, name)`` order some PERSIA documents show."""
    if isinstance(first, str):
        return first, second
    if isinstance(second, str):
        return second, first
    raise TypeError(
        f"{kind}(name, data): expected a str name, got {_describe(first)} and {_describe(second)}"
    )


# --------------------------------------------------------------------------- features


class _IDFeature:
    """Common part of the id-type features: a name and CSR ``ids`` / ``offsets``."""

    name: str
    ids: np.ndarray
    offsets: np.ndarray

    @property
    def batch_size(self) -> int:
        return len(self.offsets) - 1

    def to_wire(self) -> IDFeature:
        """This feature as the wire type (shares the arrays)."""
        return IDFeature(self.name, self.ids, self.offsets)

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
                raise _bad(f"IDTypeFeature {name!r}: data[{i}]", IDS_EXPECTED, sample)
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        self.name = name
        self.offsets = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.ids = np.concatenate(data) if data else np.empty(0, dtype=np.uint64)
        self._data = list(data)

    @classmethod
    def from_csr(cls, name: str, ids: np.ndarray, offsets: np.ndarray) -> IDTypeFeature:
        """Build from CSR arrays (checked as wire input, field names ``name``, ``ids``, ``offsets``)."""
        wire = IDFeature.from_wire(
            {"name": name, "ids": ids, "offsets": offsets}, "IDTypeFeature", None
        )
        return _id_feature(wire)

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
            raise _bad(f"IDTypeFeatureWithSingleID {name!r}: data", IDS_EXPECTED, data)
        self.name = name
        self.ids = data
        self.offsets = single_id_offsets(len(data))  # shared, read-only; not sent on the wire

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
        if not isinstance(data, np.ndarray) or data.dtype not in DENSE_DTYPES or data.ndim < 1:
            raise _bad(
                f"{kind} {name or self.DEFAULT_NAME!r}: data",
                DENSE_EXPECTED + " with ndim >= 1",
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

    def to_wire(self) -> DenseArray:
        """This feature as the wire type (shares the array)."""
        return DenseArray(self._name, self.data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_describe(self.data)}, name={self._name!r})"


class NonIDTypeFeature(NdarrayDataBase):
    """Dense input features (e.g. float32 ``(batch, n)`` or uint8 images)."""

    DEFAULT_NAME = "non_id_type_feature_anonymous"


class Label(NdarrayDataBase):
    """Training targets, any supported dtype and shape ``(batch, ...)``."""

    DEFAULT_NAME = "label_anonymous"


AnyIDFeature = IDTypeFeature | IDTypeFeatureWithSingleID


def _id_feature(wire: IDFeature) -> IDTypeFeature:
    """The user-facing feature over a checked wire feature (no copy, no second check)."""
    feature = IDTypeFeature.__new__(IDTypeFeature)
    feature.name, feature.ids, feature.offsets, feature._data = (
        wire.name,
        wire.ids,
        wire.offsets,
        None,
    )
    return feature


def _dense(wire: DenseArray, cls: type[NdarrayDataBase]) -> NdarrayDataBase:
    """A :class:`NonIDTypeFeature` or :class:`Label` over a checked wire array (no copy)."""
    obj = cls.__new__(cls)
    obj.data, obj._name = wire.data, wire.name
    return obj
