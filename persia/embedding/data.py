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
``batch.dense_part()`` to an NN worker: the wire types ``pyrsia.shared.wire.batch.IDPart`` and
``DensePart``, whose ``from_wire`` validates them once on arrival. Every check raises an exception with a message, never an
``assert``; bad values from users and from the wire are
:class:`~pyrsia.shared.errors.InvalidInputError` (a ``ValueError``) naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from persia.embedding._features import (
    MAX_BATCH_SIZE,
    AnyIDFeature,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NdarrayDataBase,
    NonIDTypeFeature,
    _dense,
    _id_feature,
)
from pyrsia.shared import codec
from pyrsia.shared.errors import InvalidInputError, InvalidTypeError, MisuseError
from pyrsia.shared.wire.batch import (
    DENSE_DTYPES,
    DensePart,
    IDPart,
    check_batch_size,
    check_finite,
    check_unique,
)

__all__ = [
    "MAX_BATCH_SIZE",
    "IDTypeFeature",
    "IDTypeFeatureWithSingleID",
    "Label",
    "NdarrayDataBase",
    "NonIDTypeFeature",
    "PersiaBatch",
]

_ND_ARRAY_SUPPORT_TYPE = {dtype.type for dtype in DENSE_DTYPES}
"""PERSIA's name for the numpy types a non-id feature or a label may have (bool, int8..int64,
uint8, float32, float64); ``persia.prelude.check_pyarray_dtype_valid`` accepts exactly these."""

_NdarrayDataBase = NdarrayDataBase  # the name later PERSIA releases use


# --------------------------------------------------------------------------- the batch


class PersiaBatch:
    """One batch: id-type features, dense features, labels and opaque meta bytes.

    Arguments:
        id_type_features: at least one :class:`IDTypeFeature` / :class:`IDTypeFeatureWithSingleID`.
        non_id_type_features: dense inputs, optional.
        labels: targets; required when ``requires_grad`` (PERSIA raises RuntimeError too).
            Float labels and float dense features must be finite: a NaN or an infinity is
            refused here (:class:`~pyrsia.shared.errors.InvalidInputError` naming the feature, its
            index and name, and the first bad row), since one such batch makes every dense
            parameter NaN. PERSIA does not check this; Pyrsia refuses rather than train on it.
        batch_size: defaults to the first id feature's; every part must match; 1..65535.
        requires_grad: whether the embeddings of this batch are trained.
        meta: opaque bytes handed to the training loop, or None.

    The batch owns its data from construction on (each feature keeps a read-only copy), so
    a data loader may refill the same numpy buffers for the next batch as soon as this
    constructor returns, before or after ``DataCtx.send_data``: what was passed here is
    what trains. PERSIA's Rust ``_PersiaBatch`` copies at construction the same way.
    """

    def __init__(
        self,
        id_type_features: Sequence[AnyIDFeature],
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
        _check_types(id_features, dense, label_list)
        size = check_batch_size(
            id_features[0].batch_size if batch_size is None else batch_size, "batch_size"
        )
        _check_contents(id_features, dense, label_list, size)
        _check_flags(requires_grad, meta, label_list)
        self.id_type_features = id_features
        self.non_id_type_features = dense
        self.labels = label_list
        self.batch_size = size
        self.requires_grad = requires_grad
        self.meta = meta

    @property
    def data(self) -> PersiaBatch:
        """The batch itself: PERSIA's ``persia_batch.data`` was the Rust batch the contexts
        sent; Pyrsia's contexts take the ``PersiaBatch`` (``ctx.get_embedding_from_data``)."""
        return self

    def id_part(self) -> IDPart:
        """What an embedding worker needs: id features, batch size and requires_grad."""
        return IDPart(
            self.batch_size, self.requires_grad, tuple(f.to_wire() for f in self.id_type_features)
        )

    def dense_part(self) -> DensePart:
        """What an NN worker needs besides embeddings: dense features, labels, meta, batch size."""
        return DensePart(
            self.batch_size,
            tuple(f.to_wire() for f in self.non_id_type_features),
            tuple(f.to_wire() for f in self.labels),
            self.meta,
        )

    def to_wire(self) -> dict[str, Any]:
        """The whole batch as plain dicts and numpy arrays (see the module docstring)."""
        return {**self.id_part().to_wire(), **self.dense_part().to_wire()}

    @classmethod
    def from_wire(cls, data: object) -> PersiaBatch:
        """Rebuild a batch from :meth:`to_wire`'s form, checking every field."""
        ids, dense = IDPart.from_wire(data), DensePart.from_wire(data)
        if ids.requires_grad and not dense.labels:
            raise InvalidInputError("labels", "at least one label when requires_grad is true", [])
        batch = cls.__new__(cls)
        batch.id_type_features = tuple(_id_feature(f) for f in ids.id_type_features)
        batch.non_id_type_features = tuple(
            _dense(f, NonIDTypeFeature) for f in dense.non_id_type_features
        )
        batch.labels = tuple(_dense(f, Label) for f in dense.labels)
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


# --------------------------------------------------------------------------- its checks


def _parts(id_features: tuple, dense: tuple, labels: tuple) -> tuple[tuple[str, tuple], ...]:
    """The three parts of a batch under their argument names, in the order they are checked."""
    return (
        ("id_type_features", id_features),
        ("non_id_type_features", dense),
        ("labels", labels),
    )


def _check_types(id_features: tuple, dense: tuple, labels: tuple) -> None:
    """Refuse an item of the wrong feature type, naming the argument and its index."""
    kinds_of = {
        "id_type_features": (IDTypeFeature, IDTypeFeatureWithSingleID),
        "non_id_type_features": (NonIDTypeFeature,),
        "labels": (Label,),
    }
    for field, items in _parts(id_features, dense, labels):
        kinds = kinds_of[field]
        for i, item in enumerate(items):
            if not isinstance(item, kinds):
                names = " or ".join(k.__name__ for k in kinds)
                raise InvalidTypeError(
                    f"{field}[{i}]",
                    names,
                    type(item).__name__,
                    message=f"{field}[{i}]: expected {names}, got {type(item).__name__}",
                )


def _check_contents(id_features: tuple, dense: tuple, labels: tuple, size: int) -> None:
    """Every part has ``size`` rows; dense features and labels are finite (one vectorized
    pass per feature: a NaN would make every dense parameter NaN); names are distinct."""
    for field, items in _parts(id_features, dense, labels):
        for i, item in enumerate(items):
            if item.batch_size != size:
                raise InvalidInputError(
                    f"{field}[{i}] ({item.name})", f"batch size {size}", item.batch_size
                )
    for field, items in (("non_id_type_features", dense), ("labels", labels)):
        for i, item in enumerate(items):
            check_finite(item.data, f"{field}[{i}] ({item.name!r})")
    check_unique([f.name for f in id_features], "id_type_features")
    check_unique([f._name for f in dense], "non_id_type_features")
    check_unique([f._name for f in labels], "labels")


def _check_flags(requires_grad: object, meta: object, labels: tuple) -> None:
    """``requires_grad`` a bool, ``meta`` bytes or None, and labels when gradients are asked."""
    if not isinstance(requires_grad, bool):
        raise InvalidTypeError(
            "requires_grad",
            "a bool",
            message=f"requires_grad: expected a bool, got {type(requires_grad).__name__}",
        )
    if meta is not None and not isinstance(meta, bytes):
        raise InvalidTypeError(
            "meta",
            "bytes or None",
            message=f"meta: expected bytes or None, got {type(meta).__name__}",
        )
    if requires_grad and not labels:
        raise MisuseError(
            "PersiaBatch: requires_grad=True needs labels; pass labels=[Label(...)] "
            "or requires_grad=False for evaluation/inference batches"
        )
