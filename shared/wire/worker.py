"""Request and answer bodies of the embedding worker's data routes (services/embedding_worker).

::

    /batch         PutBatch      {"loader": int, "batch_id": int, "batch": IDPart}
    /lookup        Lookup        {"batch_id": int, "train": bool}
    /lookup_direct LookupDirect  {"batch": IDPart, "train": bool}
    /gradients     Gradients     {"batch_id": int, "loss_scale": float,
                                  "gradients": [{"name": str, "data": float32|float16 array}]}
    answer of /lookup and /lookup_direct: Embeddings
                   {"batch_id": int | None, "requires_grad": bool,
                    "embeddings": [{"name": str, "data": float32|float16 array}]}
    answer of /gradients: GradientsApplied
                   {"batch_id": int, "skipped_slots": [str], "applied": int,
                    "skipped_unknown": int, "skipped_nonfinite": int, "dropped": int}
    answer of /schema: WorkerSchema  {"schema": EmbeddingSchema.to_dict(), "ps_replicas": int}
    answer of /stats:  WorkerStats   {"pending": int, "awaiting_gradients": int, ...,
                                      "ps": [PSStats {"entries": int, "updates_applied": int, ...}]}

Answers are checked once where the client decodes them; a bad one is a ProtocolError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.config_schema import EmbeddingSchema
from shared.errors import ConfigError, InvalidInputError, ProtocolError
from shared.validate import as_array, as_bool, as_dict, as_float, as_int, as_list, as_str, get
from shared.wire.batch import MAX_FEATURES, IDPart, check_unique
from shared.wire.ps import PSStats, UpdateTotals, peer_answer

MAX_LOADERS = 1 << 16
"""Most data-loader replicas one job may have."""
_FLOAT_DTYPES = ("float32", "float16")


@dataclass(frozen=True, eq=False)
class PutBatch:
    """``/batch``: a data loader buffers a batch's id half under ``batch_id``."""

    loader: int
    batch_id: int
    batch: IDPart

    @classmethod
    def from_wire(cls, body: Any) -> PutBatch:
        body = as_dict(body, "body")
        return cls(
            loader=as_int(get(body, "loader"), "loader", min_value=0, max_value=MAX_LOADERS),
            batch_id=as_int(get(body, "batch_id"), "batch_id", min_value=0),
            batch=IDPart.from_wire(get(body, "batch"), "batch"),
        )

    def to_wire(self) -> dict[str, Any]:
        return {"loader": self.loader, "batch_id": self.batch_id, "batch": self.batch.to_wire()}


@dataclass(frozen=True)
class Lookup:
    """``/lookup``: the embeddings of a buffered batch."""

    batch_id: int
    train: bool

    @classmethod
    def from_wire(cls, body: Any) -> Lookup:
        body = as_dict(body, "body")
        return cls(as_int(get(body, "batch_id"), "batch_id"), as_bool(get(body, "train"), "train"))

    def to_wire(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "train": self.train}


@dataclass(frozen=True, eq=False)
class LookupDirect:
    """``/lookup_direct``: the embeddings of ids sent in the request (no buffering)."""

    batch: IDPart
    train: bool

    @classmethod
    def from_wire(cls, body: Any) -> LookupDirect:
        body = as_dict(body, "body")
        train = as_bool(get(body, "train"), "train")
        return cls(IDPart.from_wire(get(body, "batch"), "batch"), train)

    def to_wire(self) -> dict[str, Any]:
        return {"batch": self.batch.to_wire(), "train": self.train}


def _named_arrays(raw: Any, field: str) -> tuple[tuple[str, np.ndarray], ...]:
    items = as_list(raw, field, max_len=MAX_FEATURES)
    out = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        item = as_dict(item, where)
        name = as_str(get(item, "name", f"{where}.name"), f"{where}.name")
        data = as_array(get(item, "data", f"{where}.data"), f"{where}.data", dtype=_FLOAT_DTYPES)
        out.append((name, data))
    check_unique([name for name, _ in out], field)
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Gradients:
    """``/gradients``: one batch's pooled-embedding gradients, per slot (some may be left out)."""

    batch_id: int
    loss_scale: float
    gradients: tuple[tuple[str, np.ndarray], ...]

    @classmethod
    def from_wire(cls, body: Any) -> Gradients:
        body = as_dict(body, "body")
        return cls(
            batch_id=as_int(get(body, "batch_id"), "batch_id"),
            loss_scale=as_float(body.get("loss_scale", 1.0), "loss_scale", positive=True),
            gradients=_named_arrays(get(body, "gradients"), "gradients"),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "loss_scale": float(self.loss_scale),
            "gradients": [{"name": n, "data": d} for n, d in self.gradients],
        }


@dataclass(frozen=True, eq=False)
class Embeddings:
    """The answer of ``/lookup`` and ``/lookup_direct``: one pooled tensor per slot.

    ``batch_id`` is the reference for the gradients (None when none are awaited);
    summed slots are ``(batch, dim)``, raw slots ``(batch, sample_fixed_size, dim + 1)``.
    """

    embeddings: tuple[tuple[str, np.ndarray], ...]
    batch_id: int | None
    requires_grad: bool

    @classmethod
    def from_wire(cls, answer: Any, batch_size: int | None = None) -> Embeddings:
        """Check an embedding worker's answer (a bad one is a ProtocolError: a peer's fault)."""
        try:
            body = as_dict(answer, "answer")
            embeddings = _named_arrays(get(body, "embeddings"), "embeddings")
            batch_id = body.get("batch_id")
            if batch_id is not None:
                batch_id = as_int(batch_id, "batch_id")
            requires_grad = as_bool(body.get("requires_grad", True), "requires_grad")
        except InvalidInputError as exc:
            raise ProtocolError(f"embedding worker answered a bad lookup: {exc}") from exc
        for name, data in embeddings:
            if data.ndim not in (2, 3) or (batch_size is not None and data.shape[0] != batch_size):
                raise ProtocolError(
                    f"embedding worker sent slot {name!r} with shape {data.shape}: expected "
                    f"(batch={batch_size}, dim) or (batch, sample_fixed_size, dim + 1)"
                )
        return cls(embeddings, batch_id, requires_grad)

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "requires_grad": self.requires_grad,
            "embeddings": [{"name": n, "data": d} for n, d in self.embeddings],
        }


@dataclass(frozen=True)
class GradientsApplied:
    """The answer of ``/gradients``: the PS replicas' summed ``UpdateTotals``, the slots
    skipped for NaN/inf gradients, and the ids dropped because a replica stayed unreachable."""

    batch_id: int
    skipped_slots: tuple[str, ...]
    totals: UpdateTotals
    dropped: int

    @classmethod
    def from_wire(cls, answer: Any) -> GradientsApplied:
        with peer_answer("embedding worker /gradients"):
            body = as_dict(answer, "answer")
            slots = as_list(get(body, "skipped_slots"), "skipped_slots", max_len=MAX_FEATURES)
            return cls(
                batch_id=as_int(get(body, "batch_id"), "batch_id"),
                skipped_slots=tuple(as_str(s, f"skipped_slots[{i}]") for i, s in enumerate(slots)),
                totals=UpdateTotals.from_wire(body),
                dropped=as_int(get(body, "dropped"), "dropped", min_value=0),
            )

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "skipped_slots": list(self.skipped_slots),
            **self.totals.to_wire(),
            "dropped": self.dropped,
        }


@dataclass(frozen=True)
class WorkerSchema:
    """The answer of ``/schema``: the embedding schema a worker serves and its PS replica count."""

    schema: EmbeddingSchema
    ps_replicas: int

    @classmethod
    def from_wire(cls, answer: Any, peer: str = "embedding worker") -> WorkerSchema:
        with peer_answer(f"{peer} /schema"):
            body = as_dict(answer, "answer")
            try:
                schema = EmbeddingSchema.from_dict(get(body, "schema"), source=f"{peer} /schema")
            except ConfigError as exc:
                raise InvalidInputError("schema", "an embedding schema", message=str(exc)) from exc
            return cls(schema, as_int(get(body, "ps_replicas"), "ps_replicas", min_value=0))

    def to_wire(self) -> dict[str, Any]:
        return {"schema": self.schema.to_dict(), "ps_replicas": self.ps_replicas}


@dataclass(frozen=True, eq=False)
class WorkerStats:
    """The answer of an embedding worker's ``/stats``: its buffers and every PS replica's stats."""

    pending: int
    awaiting_gradients: int
    ps: tuple[PSStats, ...]
    details: dict[str, Any]

    @classmethod
    def from_wire(cls, answer: Any) -> WorkerStats:
        with peer_answer("embedding worker /stats"):
            body = as_dict(answer, "answer")
            ps = as_list(get(body, "ps"), "ps", max_len=MAX_LOADERS)
            return cls(
                pending=as_int(get(body, "pending"), "pending", min_value=0),
                awaiting_gradients=as_int(
                    get(body, "awaiting_gradients"), "awaiting_gradients", min_value=0
                ),  # fmt: skip
                ps=tuple(PSStats.from_wire(s, f"ps[{i}]") for i, s in enumerate(ps)),
                details=body,
            )

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.details,
            "pending": self.pending,
            "awaiting_gradients": self.awaiting_gradients,
            "ps": [s.to_wire() for s in self.ps],
        }
