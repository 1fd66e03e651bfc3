"""The feature types of a ``PersiaBatch`` and their checks (re-exported by ``persia.embedding.data``).

An id-type feature is kept in CSR form, built once with numpy (no Python loop over
ids)::

    samples   [10, 11]  []  [12]  [13, 14, 15]
    ids       [10, 11, 12, 13, 14, 15]            uint64, all ids concatenated
    offsets   [0, 2, 2, 3, 6]                     int64, batch_size + 1 entries;
                                                  sample i is ids[offsets[i]:offsets[i+1]]

Every feature owns its arrays from construction on: the caller's arrays are copied once
(read-only copies), so refilling one buffer per batch after ``PersiaBatch(...)`` returns
changes nothing already built or sent. This is PERSIA's contract too: its ``PersiaBatch``
hands each array to the Rust ``_PersiaBatch`` (``persia/embedding/data.py``), which copies
it into buffers of its own at construction. The copies cost about 40 us for a
Census-sized batch (1,024 rows, 33 single-id slots, 13 float32 dense columns, a label).

Ids may come as uint64 (PERSIA's only dtype), as any signed integer dtype (int8 .. int64)
or as an unsigned one narrower than 64 bits; they are checked non-negative with one
vectorized ``min()`` and become uint64 in the same single copy. Pyrsia differs from PERSIA
here on purpose: PERSIA refuses anything but uint64, and int64 is what most readers
(pandas, ``np.array([1, 2])``) hand a newcomer. Negative ids are refused naming the slot,
the sample and the value; float and bool ids are refused (a float id is a bug upstream).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from pyrsia.shared.errors import InvalidInputError, InvalidTypeError
from pyrsia.shared.validate import describe as _describe
from pyrsia.shared.wire.batch import (
    DENSE_DTYPES,
    DENSE_EXPECTED,
    LABEL_DEFAULT_NAME,
    MAX_BATCH_SIZE,
    NON_ID_TYPE_FEATURE_DEFAULT_NAME,
    DenseArray,
    IDFeature,
    single_id_offsets,
)
from pyrsia.shared.wire.batch import bad_array as _bad

__all__ = ["MAX_BATCH_SIZE"]  # the rest is re-exported by persia.embedding.data


def _name_and_data(kind: str, first: Any, second: Any) -> tuple[str, Any]:
    """Accept ``(name, data)`` and the ``(data, name)`` order some PERSIA documents show."""
    if isinstance(first, str):
        return first, second
    if isinstance(second, str):
        return second, first
    raise InvalidTypeError(
        "name",
        "a str name",
        message=f"{kind}(name, data): expected a str name, got "
        f"{_describe(first)} and {_describe(second)}",
    )


IDS_ACCEPTED = (
    "a 1-D numpy array of non-negative integer ids: uint64, a signed integer dtype "
    "(int8 .. int64) or uint8 .. uint32, converted to uint64"
)
_ID_KINDS = frozenset("iu")


def _owned(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array`` that the feature owns (C order; one ``memcpy``)."""
    out = np.array(array, copy=True, order="C")
    out.setflags(write=False)
    return out


def _id_dtype_error(field: str, value: Any) -> InvalidInputError:
    """The error for ids that are not an integer array (floats and bools named as such)."""
    hint = ""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            hint = "; float ids are refused (cast exact integer ids with .astype(np.uint64))"
        elif value.dtype.kind == "b":
            hint = "; bool ids are refused (use integer ids, e.g. .astype(np.uint64))"
    return InvalidInputError(
        field,
        IDS_ACCEPTED,
        message=f"{field}: expected {IDS_ACCEPTED}, got {_describe(value)}{hint}",
    )


def _negative_id_error(name: str, ids: np.ndarray, offsets: np.ndarray | None) -> InvalidInputError:
    """The error naming the first negative id of slot ``name``: its sample and its value."""
    position = int(np.argmax(ids < 0))
    sample = position if offsets is None else int(np.searchsorted(offsets, position, "right")) - 1
    value = int(ids[position])
    count = int(np.count_nonzero(ids < 0))
    return InvalidInputError(
        f"id slot {name!r}",
        "non-negative ids",
        value,
        message=f"id slot {name!r}: ids must be non-negative, got {value} in sample {sample} "
        f"({count} negative id(s) in all); map negative ids to non-negative ones in the "
        "data loader (e.g. a hash or an offset)",
    )


def _to_uint64(name: str, ids: np.ndarray, offsets: np.ndarray | None, *, copy: bool) -> np.ndarray:
    """``ids`` (an integer array, already checked) as uint64, refusing negatives.

    ``copy``: whether the result must not share memory with ``ids`` (the caller's array);
    a signed or narrower array is converted into a new array anyway (one copy in all).
    """
    if ids.dtype.kind == "i" and len(ids) and ids.min() < 0:
        raise _negative_id_error(name, ids, offsets)
    if ids.dtype == np.uint64:
        return ids.copy() if copy else ids
    if ids.dtype == np.int64 and not copy:
        return ids.view(np.uint64)  # non-negative int64: the same bits
    return ids.astype(np.uint64)


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
    """Categorical ids, any number per sample (empty samples allowed), as a list of 1-D arrays.

    ``IDTypeFeature("user_tags", [np.array([3, 7], np.uint64), np.array([], np.uint64)])``;
    ``IDTypeFeature(data, name)`` is accepted too. Samples may be uint64 or any other
    integer dtype but uint64 mixed with signed ones (see the module docstring); the
    feature keeps its own read-only uint64 copy.
    """

    def __init__(self, name: str, data: Sequence[np.ndarray]):
        name, data = _name_and_data("IDTypeFeature", name, data)
        if not name:
            raise InvalidInputError("IDTypeFeature.name", "a non-empty string", name)
        if not isinstance(data, (list, tuple)):
            raise InvalidTypeError(
                f"IDTypeFeature {name!r}",
                "a list of 1-D integer id arrays (one per sample)",
                message=f"IDTypeFeature {name!r}: expected a list of 1-D integer id arrays (one per "
                f"sample), got {_describe(data)}",
            )
        _check_samples(name, data)
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        offsets = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # concatenate makes a new array: the feature owns it, whatever the caller's are
        ids = np.concatenate(data) if data else np.empty(0, dtype=np.uint64)
        ids = _to_uint64(name, ids, offsets, copy=False)
        ids.setflags(write=False)
        offsets.setflags(write=False)
        self.name = name
        self.offsets = offsets
        self.ids = ids
        self._data = None

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


_UINT64 = np.dtype(np.uint64)


def _single_ids(name: Any, data: Any) -> tuple[str, np.ndarray]:
    """The name and an owned uint64 copy of the ids of an :class:`IDTypeFeatureWithSingleID`
    (either argument order), or the error naming what is wrong."""
    name, data = _name_and_data("IDTypeFeatureWithSingleID", name, data)
    if not name:
        raise InvalidInputError("IDTypeFeatureWithSingleID.name", "a non-empty string", name)
    field = f"IDTypeFeatureWithSingleID {name!r}: data"
    if not isinstance(data, np.ndarray) or data.dtype.kind not in _ID_KINDS:
        raise _id_dtype_error(field, data)
    if data.ndim != 1:
        raise _bad(field, IDS_ACCEPTED, data)
    return name, _to_uint64(name, data, None, copy=True)


class IDTypeFeatureWithSingleID(_IDFeature):
    """Exactly one id per sample, as one 1-D array: the cheap form of :class:`IDTypeFeature`.

    uint64, or any integer dtype the module docstring lists (non-negative); the feature
    keeps its own read-only uint64 copy, so the caller may refill ``data`` right away.
    """

    def __init__(self, name: str, data: np.ndarray):
        if (
            type(name) is str
            and name
            and type(data) is np.ndarray
            and data.ndim == 1
            and data.dtype == _UINT64
        ):
            ids = data.copy()  # the usual case (uint64 ids, in this order): nothing to convert
        else:
            name, ids = _single_ids(name, data)
        ids.setflags(write=False)  # one copy, owned by the feature
        self.name = name
        self.ids = ids
        self.offsets = single_id_offsets(len(ids))  # shared, read-only; not sent on the wire

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
            raise InvalidTypeError(
                f"{kind}.name",
                "a str or None",
                message=f"{kind}: expected name to be a str or None, got {_describe(name)}",
            )
        if not isinstance(data, np.ndarray) or data.dtype not in DENSE_DTYPES or data.ndim < 1:
            raise _bad(
                f"{kind} {name or self.DEFAULT_NAME!r}: data",
                DENSE_EXPECTED + " with ndim >= 1",
                data,
            )
        self.data = _owned(data)  # the batch keeps what it was given, not the caller's buffer
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

    DEFAULT_NAME = NON_ID_TYPE_FEATURE_DEFAULT_NAME


class Label(NdarrayDataBase):
    """Training targets, any supported dtype and shape ``(batch, ...)``."""

    DEFAULT_NAME = LABEL_DEFAULT_NAME


AnyIDFeature = IDTypeFeature | IDTypeFeatureWithSingleID


def _check_samples(name: str, data: Sequence[Any]) -> None:
    """Every sample is a 1-D integer ndarray, and uint64 samples are not mixed with signed ones.

    The common case costs a few C-level passes (``map`` over types, dtypes and ndims, no
    Python frame per sample); only a bad batch pays a loop, to name the first bad sample.
    """
    if not data:
        return
    where = f"IDTypeFeature {name!r}: data"
    if set(map(type, data)) != {np.ndarray}:
        i = next(i for i, a in enumerate(data) if type(a) is not np.ndarray)
        raise _id_dtype_error(f"{where}[{i}]", data[i])
    dtypes = set(map(attrgetter("dtype"), data))
    if any(dt.kind not in _ID_KINDS for dt in dtypes):
        i = next(i for i, a in enumerate(data) if a.dtype.kind not in _ID_KINDS)
        raise _id_dtype_error(f"{where}[{i}]", data[i])
    if set(map(attrgetter("ndim"), data)) != {1}:
        i = next(i for i, a in enumerate(data) if a.ndim != 1)
        raise _bad(f"{where}[{i}]", IDS_ACCEPTED, data[i])
    if np.dtype(np.uint64) in dtypes and any(dt.kind == "i" for dt in dtypes):
        # numpy would promote uint64 + int64 to float64 and lose ids above 2**53
        i = next(i for i, a in enumerate(data) if a.dtype.kind == "i")
        raise InvalidInputError(
            f"{where}[{i}]",
            "one id dtype",
            message=f"{where}[{i}]: uint64 and signed ({data[i].dtype}) samples are mixed in "
            "one feature; give every sample the same dtype (e.g. .astype(np.uint64))",
        )


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
