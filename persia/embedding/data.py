"""The batch types a data loader builds: PERSIA's ``PersiaBatch`` and its features.

An id-type feature holds a variable number of uint64 ids per sample, kept in CSR
form (``ids`` concatenated, ``offsets`` of length batch_size + 1; see
``persia.embedding._features``).

Wire form (``batch.to_wire()``, checked field by field by ``PersiaBatch.from_wire``)::

    {"batch_size": int, "requires_grad": bool, "meta": bytes | None,
     "id_type_features": [{"name": str, "ids": uint64[n], "offsets": int64[batch_size + 1]}],
     "non_id_type_features": [{"name": str | None, "data": ndarray}],
     "labels": [{"name": str | None, "data": ndarray}]}

The data loader sends ``batch.id_part()`` to an embedding worker and
``batch.dense_part()`` to an NN worker; :class:`IDPart` and :class:`DensePart`
validate them on arrival. Every check raises an exception with a message, never an
``assert``; bad values from users and from the wire are
:class:`~shared.errors.InvalidInputError` (a ``ValueError``) naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from persia.embedding._features import (
    MAX_BATCH_SIZE,
    IDFeature,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NdarrayDataBase,
    NonIDTypeFeature,
    _check_batch_size,
    _check_unique,
    _dense_from_wire,
    _id_feature_from_wire,
    _mapping,
)
from shared import codec
from shared.errors import InvalidInputError

__all__ = [
    "MAX_BATCH_SIZE",
    "DensePart",
    "IDPart",
    "IDTypeFeature",
    "IDTypeFeatureWithSingleID",
    "Label",
    "NdarrayDataBase",
    "NonIDTypeFeature",
    "PersiaBatch",
]


# --------------------------------------------------------------------------- the batch


class PersiaBatch:
    """One batch: id-type features, dense features, labels and opaque meta bytes.

    Arguments:
        id_type_features: at least one :class:`IDTypeFeature` / :class:`IDTypeFeatureWithSingleID`.
        non_id_type_features: dense inputs, optional.
        labels: targets; required when ``requires_grad`` (PERSIA raises RuntimeError too).
        batch_size: defaults to the first id feature's; every part must match; 1..65535.
        requires_grad: whether the embeddings of this batch are trained.
        meta: opaque bytes handed to the training loop, or None.
    """

    def __init__(
        self,
        id_type_features: Sequence[IDFeature],
        non_id_type_features: Sequence[NonIDTypeFeature] | None = None,
        labels: Sequence[Label] | None = None,
        batch_size: int | None = None,
        requires_grad: bool = True,
        meta: bytes | None = None,
    ):
        id_features = tuple(id_type_features)
        dense = tuple(non_id_type_features or ())
        label_list = tuple(labels or ())
        if not id_features:
            raise InvalidInputError("id_type_features", "at least one id-type feature", [])
        for field, items, kinds in (
            ("id_type_features", id_features, (IDTypeFeature, IDTypeFeatureWithSingleID)),
            ("non_id_type_features", dense, (NonIDTypeFeature,)),
            ("labels", label_list, (Label,)),
        ):
            for i, item in enumerate(items):
                if not isinstance(item, kinds):
                    names = " or ".join(k.__name__ for k in kinds)
                    raise TypeError(f"{field}[{i}]: expected {names}, got {type(item).__name__}")
        size = _check_batch_size(
            id_features[0].batch_size if batch_size is None else batch_size, "batch_size"
        )
        for field, items in (
            ("id_type_features", id_features),
            ("non_id_type_features", dense),
            ("labels", label_list),
        ):
            for i, item in enumerate(items):
                if item.batch_size != size:
                    raise InvalidInputError(
                        f"{field}[{i}] ({item.name})", f"batch size {size}", item.batch_size
                    )
        _check_unique([f.name for f in id_features], "id_type_features")
        _check_unique([f._name for f in dense], "non_id_type_features")
        _check_unique([f._name for f in label_list], "labels")
        if not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad: expected a bool, got {type(requires_grad).__name__}")
        if meta is not None and not isinstance(meta, bytes):
            raise TypeError(f"meta: expected bytes or None, got {type(meta).__name__}")
        if requires_grad and not label_list:
            raise RuntimeError(
                "PersiaBatch: requires_grad=True needs labels; pass labels=[Label(...)] "
                "or requires_grad=False for evaluation/inference batches"
            )
        self.id_type_features = id_features
        self.non_id_type_features = dense
        self.labels = label_list
        self.batch_size = size
        self.requires_grad = requires_grad
        self.meta = meta

    def id_part(self) -> dict[str, Any]:
        """What an embedding worker needs: id features, batch size and requires_grad."""
        return {
            "batch_size": self.batch_size,
            "requires_grad": self.requires_grad,
            "id_type_features": [f.to_wire() for f in self.id_type_features],
        }

    def dense_part(self) -> dict[str, Any]:
        """What an NN worker needs besides embeddings: dense features, labels, meta, batch size."""
        return {
            "batch_size": self.batch_size,
            "meta": self.meta,
            "non_id_type_features": [f.to_wire() for f in self.non_id_type_features],
            "labels": [f.to_wire() for f in self.labels],
        }

    def to_wire(self) -> dict[str, Any]:
        """The whole batch as plain dicts and numpy arrays (see the module docstring)."""
        return {**self.id_part(), **self.dense_part()}

    @classmethod
    def from_wire(cls, data: object) -> PersiaBatch:
        """Rebuild a batch from :meth:`to_wire`'s form, checking every field."""
        ids, dense = IDPart.from_wire(data), DensePart.from_wire(data)
        if ids.requires_grad and not dense.labels:
            raise InvalidInputError("labels", "at least one label when requires_grad is true", [])
        batch = cls.__new__(cls)
        batch.id_type_features = ids.id_type_features
        batch.non_id_type_features = dense.non_id_type_features
        batch.labels = dense.labels
        batch.batch_size = ids.batch_size
        batch.requires_grad = ids.requires_grad
        batch.meta = dense.meta
        return batch

    def to_bytes(self) -> bytes:
        """The wire form packed with the project's msgpack codec (no pickle)."""
        return codec.packb(self.to_wire())

    @classmethod
    def from_bytes(cls, data: bytes) -> PersiaBatch:
        """Inverse of :meth:`to_bytes`; arrays are read-only views of ``data``."""
        return cls.from_wire(codec.unpackb(data))

    def __repr__(self) -> str:
        return (
            f"PersiaBatch(batch_size={self.batch_size}, id_type_features="
            f"{[f.name for f in self.id_type_features]}, non_id_type_features="
            f"{len(self.non_id_type_features)}, labels={len(self.labels)}, "
            f"requires_grad={self.requires_grad})"
        )


# --------------------------------------------------------------------------- wire parts


def _list(d: dict, key: str, field: str) -> list:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInputError(field, "a list", type(value).__name__)
    return value


def _header(d: dict) -> int:
    return _check_batch_size(d.get("batch_size"), "batch_size")


@dataclass(frozen=True)
class IDPart:
    """The id half of a batch, as an embedding worker receives it (``batch.id_part()``)."""

    batch_size: int
    requires_grad: bool
    id_type_features: tuple[IDTypeFeature, ...]

    @classmethod
    def from_wire(cls, data: object) -> IDPart:
        """Check every field; keys other than the three are ignored (they belong to the envelope)."""
        d = _mapping(data, "batch")
        size = _header(d)
        requires_grad = d.get("requires_grad")
        if not isinstance(requires_grad, bool):
            raise InvalidInputError("requires_grad", "true or false", requires_grad)
        raw = _list(d, "id_type_features", "id_type_features")
        if not raw:
            raise InvalidInputError("id_type_features", "at least one id-type feature", [])
        features = tuple(
            _id_feature_from_wire(x, f"id_type_features[{i}]", size) for i, x in enumerate(raw)
        )
        _check_unique([f.name for f in features], "id_type_features")
        return cls(size, requires_grad, features)

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "requires_grad": self.requires_grad,
            "id_type_features": [f.to_wire() for f in self.id_type_features],
        }


@dataclass(frozen=True)
class DensePart:
    """The dense half of a batch, as an NN worker receives it (``batch.dense_part()``)."""

    batch_size: int
    non_id_type_features: tuple[NonIDTypeFeature, ...]
    labels: tuple[Label, ...]
    meta: bytes | None

    @classmethod
    def from_wire(cls, data: object) -> DensePart:
        """Check every field; keys other than the four are ignored (they belong to the envelope)."""
        d = _mapping(data, "batch")
        size = _header(d)
        meta = d.get("meta")
        if meta is not None and not isinstance(meta, bytes):
            raise InvalidInputError("meta", "bytes or null", type(meta).__name__)
        dense = tuple(
            _dense_from_wire(x, f"non_id_type_features[{i}]", size, NonIDTypeFeature)
            for i, x in enumerate(_list(d, "non_id_type_features", "non_id_type_features"))
        )
        labels = tuple(
            _dense_from_wire(x, f"labels[{i}]", size, Label)
            for i, x in enumerate(_list(d, "labels", "labels"))
        )
        _check_unique([f._name for f in dense], "non_id_type_features")
        _check_unique([f._name for f in labels], "labels")
        return cls(size, dense, labels, meta)

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "meta": self.meta,
            "non_id_type_features": [f.to_wire() for f in self.non_id_type_features],
            "labels": [f.to_wire() for f in self.labels],
        }
