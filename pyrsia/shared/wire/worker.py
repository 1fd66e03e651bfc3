"""Request and answer bodies of the embedding worker's data routes (pyrsia/services/embedding_worker).

::

    /batch         PutBatch      {"loader": int, "batch_id": int, "batch": IDPart}
    /lookup        Lookup        {"batch_id": int, "train": bool, "gathered": bool = false,
                                  "gradients": [Gradients] = []}   (carried: applied first)
    /lookup_direct LookupDirect  {"batch": IDPart, "train": bool, "gathered": bool = false}
    /gradients     Gradients     {"batch_id": int, "loss_scale": float,
                                  "gradients": [{"name": str, "data": float32|float16 array}],
                                  "tables": [...], "skipped_slots": [str]}   (gathered.py)
    answer of /lookup and /lookup_direct: Embeddings
                   {"batch_id": int | None, "requires_grad": bool,
                    "embeddings": [{"name": str, "data": float32|float16 array}
                                   | {"name": str, "table": int}],   (gathered.py)
                    "tables": [...], "applied": [GradientsApplied] (one per carried)}
    answer of /gradients: GradientsApplied
                   {"batch_id": int, "skipped_slots": [str], "applied": int,
                    "skipped_unknown": int, "skipped_nonfinite": int, "dropped": int}
    answer of /schema: WorkerSchema  {"schema": EmbeddingSchema.to_dict(), "ps_replicas": int}
    answer of /stats:  WorkerStats   {"pending": int, "awaiting_gradients": int, ...,
                                      "ps": [PSStats {"entries": int, "updates_applied": int, ...}]}

Answers are checked once where the client decodes them; a bad one is a ProtocolError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrsia.shared.config_schema import EmbeddingSchema
from pyrsia.shared.constants import MAX_CARRIED_GRADIENTS, MAX_LOADERS
from pyrsia.shared.errors import ConfigError, InvalidInputError, ProtocolError
from pyrsia.shared.validate import (
    as_array,
    as_bool,
    as_dict,
    as_float,
    as_int,
    as_list,
    as_str,
    get,
)
from pyrsia.shared.wire.batch import MAX_FEATURES, IDPart, check_unique
from pyrsia.shared.wire.gathered import (
    EmbeddingTable,
    SlotEmbeddings,
    parse_gradient_tables,
    parse_names,
    parse_tables,
)
from pyrsia.shared.wire.ps import PSStats, UpdateTotals, peer_answer

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


@dataclass(frozen=True, eq=False)
class Lookup:
    """``/lookup``: the embeddings of a buffered batch, and the gradients of earlier batches
    it carries (``carried``: applied before the lookup, in order, as ``/gradients`` would
    apply them; one request instead of two)."""

    batch_id: int
    train: bool
    gathered: bool = False
    """Answer single-id summed slots as tables (``pyrsia.shared.wire.gathered``)."""
    carried: tuple[Gradients, ...] = ()

    @classmethod
    def from_wire(cls, body: Any) -> Lookup:
        body = as_dict(body, "body")
        raw = as_list(body.get("gradients", []), "gradients", max_len=MAX_CARRIED_GRADIENTS)
        return cls(
            as_int(get(body, "batch_id"), "batch_id"),
            as_bool(get(body, "train"), "train"),
            as_bool(body.get("gathered", False), "gathered"),
            tuple(_carried(item, f"gradients[{i}]") for i, item in enumerate(raw)),
        )

    def to_wire(self) -> dict[str, Any]:
        body = {"batch_id": self.batch_id, "train": self.train, "gathered": self.gathered}
        if self.carried:
            body["gradients"] = [g.to_wire() for g in self.carried]
        return body


def _carried(item: Any, where: str) -> Gradients:
    """One carried ``Gradients`` body; an error names it (``gradients[0].batch_id``)."""
    try:
        return Gradients.from_wire(item)
    except InvalidInputError as exc:
        field = f"{where}.{exc.field}" if exc.field != "body" else where
        raise InvalidInputError(field, exc.expected, exc.got) from exc


@dataclass(frozen=True, eq=False)
class LookupDirect:
    """``/lookup_direct``: the embeddings of ids sent in the request (no buffering)."""

    batch: IDPart
    train: bool
    gathered: bool = False
    """Answer single-id summed slots as tables (``pyrsia.shared.wire.gathered``)."""

    @classmethod
    def from_wire(cls, body: Any) -> LookupDirect:
        body = as_dict(body, "body")
        train = as_bool(get(body, "train"), "train")
        gathered = as_bool(body.get("gathered", False), "gathered")
        return cls(IDPart.from_wire(get(body, "batch"), "batch"), train, gathered)

    def to_wire(self) -> dict[str, Any]:
        return {"batch": self.batch.to_wire(), "train": self.train, "gathered": self.gathered}


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
    tables: tuple[tuple[int, np.ndarray], ...] | None = None
    """Per table of a gathered answer, ``(dim, (rows, dim) gradient)``; None: none sent."""
    skipped_slots: tuple[str, ...] = ()
    """Gathered slots left out of ``tables``."""

    @classmethod
    def from_wire(cls, body: Any) -> Gradients:
        body = as_dict(body, "body")
        tables = body.get("tables")
        return cls(
            batch_id=as_int(get(body, "batch_id"), "batch_id"),
            loss_scale=as_float(body.get("loss_scale", 1.0), "loss_scale", positive=True),
            gradients=_named_arrays(get(body, "gradients"), "gradients"),
            tables=None if tables is None else parse_gradient_tables(tables),
            skipped_slots=parse_names(body.get("skipped_slots", []), "skipped_slots", MAX_FEATURES),
        )

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "batch_id": self.batch_id,
            "loss_scale": float(self.loss_scale),
            "gradients": [{"name": n, "data": d} for n, d in self.gradients],
        }
        if self.tables is not None:
            body["tables"] = [{"dim": dim, "data": d} for dim, d in self.tables]
        if self.skipped_slots:
            body["skipped_slots"] = list(self.skipped_slots)
        return body


@dataclass(frozen=True, eq=False)
class Embeddings:
    """The answer of ``/lookup`` and ``/lookup_direct``: one pooled tensor per slot.

    ``batch_id`` is the reference for the gradients (None when none are awaited);
    summed slots are ``(batch, dim)``, raw slots ``(batch, sample_fixed_size, dim + 1)``.
    A gathered answer's ``embeddings`` is a :class:`SlotEmbeddings` (the same pairs, the
    gathered slots' arrays made on access) and ``tables`` holds the tables.
    """

    embeddings: Sequence[tuple[str, np.ndarray]]
    batch_id: int | None
    requires_grad: bool
    applied: tuple[GradientsApplied, ...] = ()
    """What the gradients a ``Lookup`` carried did, one per carried body, in order."""

    @property
    def tables(self) -> tuple[EmbeddingTable, ...]:
        return self.embeddings.tables if isinstance(self.embeddings, SlotEmbeddings) else ()

    @classmethod
    def from_wire(cls, answer: Any, batch_size: int | None = None) -> Embeddings:
        """Check an embedding worker's answer (a bad one is a ProtocolError: a peer's fault)."""
        try:
            body = as_dict(answer, "answer")
            if "tables" in body:
                embeddings: Sequence[tuple[str, np.ndarray]] = _gathered(body, batch_size)
                pooled = [(n, d) for _, n, d in embeddings.pooled]  # type: ignore[attr-defined]
            else:
                embeddings = pooled = _named_arrays(get(body, "embeddings"), "embeddings")
            batch_id = body.get("batch_id")
            if batch_id is not None:
                batch_id = as_int(batch_id, "batch_id")
            requires_grad = as_bool(body.get("requires_grad", True), "requires_grad")
            raw = as_list(body.get("applied", []), "applied", max_len=MAX_CARRIED_GRADIENTS)
        except InvalidInputError as exc:
            raise ProtocolError(f"embedding worker answered a bad lookup: {exc}") from exc
        applied = tuple(GradientsApplied.from_wire(item) for item in raw)
        for name, data in pooled:
            if data.ndim not in (2, 3) or (batch_size is not None and data.shape[0] != batch_size):
                raise ProtocolError(
                    f"embedding worker sent slot {name!r} with shape {data.shape}: expected "
                    f"(batch={batch_size}, dim) or (batch, sample_fixed_size, dim + 1)"
                )
        return cls(embeddings, batch_id, requires_grad, applied)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"batch_id": self.batch_id, "requires_grad": self.requires_grad}
        if self.applied:
            body["applied"] = [a.to_wire() for a in self.applied]
        if isinstance(self.embeddings, SlotEmbeddings):
            body["embeddings"] = self.embeddings.to_wire()
            body["tables"] = [t.to_wire() for t in self.embeddings.tables]
        else:
            body["embeddings"] = [{"name": n, "data": d} for n, d in self.embeddings]
        return body


def _gathered(body: dict, batch_size: int | None) -> SlotEmbeddings:
    """The entries of a gathered answer: pooled arrays, or (table, row of its index)."""
    items = as_list(get(body, "embeddings"), "embeddings", max_len=MAX_FEATURES)
    names: list[str] = []
    table_of: list[tuple[int, int] | None] = []
    counts: dict[int, int] = {}
    entries: list[tuple[str, Any]] = []
    for i, item in enumerate(items):
        where = f"embeddings[{i}]"
        item = as_dict(item, where)
        names.append(as_str(get(item, "name", f"{where}.name"), f"{where}.name"))
        if "table" in item:
            t = as_int(item["table"], f"{where}.table", min_value=0, max_value=MAX_FEATURES)
            table_of.append((t, counts.get(t, 0)))
            counts[t] = counts.get(t, 0) + 1
            entries.append((names[-1], table_of[-1]))
        else:
            table_of.append(None)
            data = as_array(
                get(item, "data", f"{where}.data"), f"{where}.data", dtype=_FLOAT_DTYPES
            )
            entries.append((names[-1], data))
    check_unique(names, "embeddings")
    return SlotEmbeddings(entries, parse_tables(body["tables"], table_of, names, batch_size))


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
                ),
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
