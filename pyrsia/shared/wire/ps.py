"""Request bodies of the embedding parameter server's routes (pyrsia/services/embedding_ps).

::

    /lookup  PSLookup  {"train": bool, "groups": [{"dim": int, "ids": uint64[n]}],
                        "updates": [PSUpdate] = []}   (carried: applied first, in order)
             -> PSLookupAnswer  {"groups": [float32[n, dim]]   (request's group order),
                                 "applied": [UpdateTotals]}   (one per carried update)
    /update  PSUpdate  {"groups": [{"dim": int, "ids": uint64[n], "grads": float32[n, dim]}]}
             -> UpdateTotals  {"applied": int, "skipped_unknown": int, "skipped_nonfinite": int}
    /stats   -> PSStats  {"entries": int, "updates_applied": int, ... every other counter}

An answer is checked once where the embedding worker decodes it (``from_wire``); a bad
one is a :class:`ProtocolError` naming the field (the PS broke the protocol, not the caller).

``/configure``, ``/register_optimizer``, ``/dump``, ``/load`` take the admin bodies of
``pyrsia.shared.wire.admin`` (the embedding worker forwards them unchanged).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrsia.shared.constants import MAX_CARRIED_GRADIENTS, MAX_DIM, MAX_GROUPS, MAX_MESSAGE_BYTES
from pyrsia.shared.errors import InvalidInputError, ProtocolError
from pyrsia.shared.validate import as_array, as_bool, as_dict, as_int, as_list, get


@dataclass(frozen=True, eq=False)
class IdGroup:
    """The ids of one dim group (and, in an update, their gradients)."""

    dim: int
    ids: np.ndarray  # uint64 (n,)
    grads: np.ndarray | None = None  # float32 (n, dim), updates only

    @classmethod
    def from_wire(cls, raw: Any, field: str, *, with_grads: bool) -> IdGroup:
        group = as_dict(raw, field)
        dim = as_int(
            get(group, "dim", f"{field}.dim"), f"{field}.dim", min_value=1, max_value=MAX_DIM
        )
        ids = as_array(get(group, "ids", f"{field}.ids"), f"{field}.ids", dtype="uint64", ndim=1)
        grads = None
        if with_grads:
            grads = as_array(
                get(group, "grads", f"{field}.grads"),
                f"{field}.grads",
                dtype="float32",
                shape=(len(ids), dim),
            )
        return cls(dim, ids, grads)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dim": self.dim, "ids": self.ids}
        if self.grads is not None:
            out["grads"] = self.grads
        return out


def _groups(body: dict, *, with_grads: bool, where: str = "") -> tuple[IdGroup, ...]:
    """The ``groups`` of a body; ``where`` prefixes the fields an error names."""
    raw = as_list(get(body, "groups", f"{where}groups"), f"{where}groups", max_len=MAX_GROUPS)
    return tuple(
        IdGroup.from_wire(g, f"{where}groups[{i}]", with_grads=with_grads)
        for i, g in enumerate(raw)
    )


@dataclass(frozen=True, eq=False)
class PSLookup:
    """``/lookup``: vectors of every id of every group; ``train`` lookups may insert.

    ``updates``: gradients carried with the lookup (the embedding worker's, of the batches
    whose gradients came with the NN worker's ``/lookup``), applied first, in order, exactly
    as ``/update`` applies them: one request instead of an ``/update`` and a ``/lookup``."""

    train: bool
    groups: tuple[IdGroup, ...]
    updates: tuple[PSUpdate, ...] = ()

    @classmethod
    def from_wire(cls, body: Any) -> PSLookup:
        body = as_dict(body, "body")
        raw = as_list(body.get("updates", []), "updates", max_len=MAX_CARRIED_GRADIENTS)
        lookup = cls(
            as_bool(get(body, "train"), "train"),
            _groups(body, with_grads=False),
            tuple(
                PSUpdate(
                    _groups(as_dict(u, f"updates[{k}]"), with_grads=True, where=f"updates[{k}].")
                )
                for k, u in enumerate(raw)
            ),
        )
        answer_bytes = sum(4 * g.dim * g.ids.shape[0] for g in lookup.groups)
        if answer_bytes > MAX_MESSAGE_BYTES:  # a few MB of ids may ask for terabytes of floats
            raise InvalidInputError(
                "groups",
                f"lookups whose answer fits in {MAX_MESSAGE_BYTES} bytes (ids x dim x 4)",
                f"{answer_bytes} bytes",
            )
        return lookup

    def to_wire(self) -> dict[str, Any]:
        body = {"train": self.train, "groups": [g.to_wire() for g in self.groups]}
        if self.updates:
            body["updates"] = [u.to_wire() for u in self.updates]
        return body


@dataclass(frozen=True, eq=False)
class PSUpdate:
    """``/update``: per-id gradients of every group, applied with the registered optimizer."""

    groups: tuple[IdGroup, ...]

    @classmethod
    def from_wire(cls, body: Any) -> PSUpdate:
        return cls(_groups(as_dict(body, "body"), with_grads=True))

    def to_wire(self) -> dict[str, Any]:
        return {"groups": [g.to_wire() for g in self.groups]}


@contextmanager
def peer_answer(peer: str) -> Iterator[None]:
    """Turn an ``InvalidInputError`` raised while checking ``peer``'s answer into a
    ``ProtocolError`` (the peer broke the protocol; our caller's input was fine)."""
    try:
        yield
    except InvalidInputError as exc:
        raise ProtocolError(f"{peer} sent a bad answer: {exc}") from exc


@dataclass(frozen=True, eq=False)
class PSLookupAnswer:
    """The answer of ``/lookup``: ``groups[j]`` holds the float32 vectors ``(n_j, dim_j)`` of
    the request's j-th group, row k the vector of its k-th id; ``applied[k]`` what the
    request's k-th carried update did."""

    groups: tuple[np.ndarray, ...]
    applied: tuple[UpdateTotals, ...] = ()

    @classmethod
    def from_wire(cls, answer: Any, request: PSLookup) -> PSLookupAnswer:
        """Check the answer against the ``request`` it answers (group count, shapes, dtype,
        one ``applied`` per carried update: a PS that ignored them is a ProtocolError)."""
        with peer_answer("PS /lookup"):
            body = as_dict(answer, "answer")
            raw = as_list(get(body, "groups"), "groups", max_len=MAX_GROUPS)
            if len(raw) != len(request.groups):
                raise InvalidInputError(
                    "groups", f"{len(request.groups)} groups (one per requested group)", len(raw)
                )
            applied: tuple[UpdateTotals, ...] = ()
            if request.updates:
                done = as_list(get(body, "applied"), "applied", max_len=MAX_CARRIED_GRADIENTS)
                if len(done) != len(request.updates):
                    raise InvalidInputError(
                        "applied", f"{len(request.updates)} (one per carried update)", len(done)
                    )
                applied = tuple(
                    UpdateTotals.checked(a, f"applied[{k}]") for k, a in enumerate(done)
                )
            return cls(
                tuple(
                    as_array(v, f"groups[{j}]", dtype="float32", shape=(len(g.ids), g.dim))
                    for j, (v, g) in enumerate(zip(raw, request.groups, strict=True))
                ),
                applied,
            )

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"groups": list(self.groups)}
        if self.applied:
            body["applied"] = [a.to_wire() for a in self.applied]
        return body


@dataclass(frozen=True)
class UpdateTotals:
    """The answer of ``/update`` (and its sum over replicas): ids whose gradient was applied,
    ids the PS does not hold (evicted or never admitted), ids skipped for NaN/inf gradients."""

    applied: int = 0
    skipped_unknown: int = 0
    skipped_nonfinite: int = 0

    @classmethod
    def from_wire(cls, answer: Any) -> UpdateTotals:
        with peer_answer("PS /update"):
            return cls.checked(answer, "answer")

    @classmethod
    def checked(cls, raw: Any, field: str) -> UpdateTotals:
        """``raw`` checked (three counts >= 0); an InvalidInputError names the key, after
        ``field`` unless ``field`` is the whole answer."""
        body = as_dict(raw, field)
        where = "" if field == "answer" else f"{field}."
        keys = ("applied", "skipped_unknown", "skipped_nonfinite")
        return cls(*(as_int(get(body, k, f"{where}{k}"), f"{where}{k}", min_value=0) for k in keys))

    def __add__(self, other: UpdateTotals) -> UpdateTotals:
        return UpdateTotals(
            self.applied + other.applied,
            self.skipped_unknown + other.skipped_unknown,
            self.skipped_nonfinite + other.skipped_nonfinite,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "skipped_unknown": self.skipped_unknown,
            "skipped_nonfinite": self.skipped_nonfinite,
        }


@dataclass(frozen=True, eq=False)
class PSStats:
    """One PS replica's ``/stats``: the counters clients read, checked, plus every other
    counter as the PS sent it (``details``: capacity, evictions, memory, optimizer, ...)."""

    entries: int
    updates_applied: int
    details: dict[str, Any]

    @classmethod
    def from_wire(cls, answer: Any, field: str = "answer") -> PSStats:
        with peer_answer("PS /stats"):
            body = as_dict(answer, field)
            entries = as_int(
                get(body, "entries", f"{field}.entries"), f"{field}.entries", min_value=0
            )
            key = f"{field}.updates_applied"
            return cls(entries, as_int(get(body, "updates_applied", key), key, min_value=0), body)

    def to_wire(self) -> dict[str, Any]:
        return {**self.details, "entries": self.entries, "updates_applied": self.updates_applied}
