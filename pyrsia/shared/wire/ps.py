"""Request bodies of the embedding parameter server's routes (pyrsia/services/embedding_ps).

::

    /lookup  PSLookup  {"train": bool, "groups": [{"dim": int, "ids": uint64[n]}]}
             -> PSLookupAnswer  {"groups": [float32[n, dim]]}   (request's group order)
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

from pyrsia.shared.constants import MAX_DIM, MAX_GROUPS, MAX_MESSAGE_BYTES
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


def _groups(body: dict, *, with_grads: bool) -> tuple[IdGroup, ...]:
    raw = as_list(get(body, "groups"), "groups", max_len=MAX_GROUPS)
    return tuple(
        IdGroup.from_wire(g, f"groups[{i}]", with_grads=with_grads) for i, g in enumerate(raw)
    )


@dataclass(frozen=True, eq=False)
class PSLookup:
    """``/lookup``: vectors of every id of every group; ``train`` lookups may insert."""

    train: bool
    groups: tuple[IdGroup, ...]

    @classmethod
    def from_wire(cls, body: Any) -> PSLookup:
        body = as_dict(body, "body")
        lookup = cls(as_bool(get(body, "train"), "train"), _groups(body, with_grads=False))
        answer_bytes = sum(4 * g.dim * g.ids.shape[0] for g in lookup.groups)
        if answer_bytes > MAX_MESSAGE_BYTES:  # a few MB of ids may ask for terabytes of floats
            raise InvalidInputError(
                "groups",
                f"lookups whose answer fits in {MAX_MESSAGE_BYTES} bytes (ids x dim x 4)",
                f"{answer_bytes} bytes",
            )
        return lookup

    def to_wire(self) -> dict[str, Any]:
        return {"train": self.train, "groups": [g.to_wire() for g in self.groups]}


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
    the request's j-th group, row k the vector of its k-th id."""

    groups: tuple[np.ndarray, ...]

    @classmethod
    def from_wire(cls, answer: Any, request: PSLookup) -> PSLookupAnswer:
        """Check the answer against the ``request`` it answers (group count, shapes, dtype)."""
        with peer_answer("PS /lookup"):
            raw = as_list(get(as_dict(answer, "answer"), "groups"), "groups", max_len=MAX_GROUPS)
            if len(raw) != len(request.groups):
                raise InvalidInputError(
                    "groups", f"{len(request.groups)} groups (one per requested group)", len(raw)
                )
            return cls(
                tuple(
                    as_array(v, f"groups[{j}]", dtype="float32", shape=(len(g.ids), g.dim))
                    for j, (v, g) in enumerate(zip(raw, request.groups, strict=True))
                )
            )

    def to_wire(self) -> dict[str, Any]:
        return {"groups": list(self.groups)}


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
            body = as_dict(answer, "answer")
            return cls(
                *(
                    as_int(get(body, key), key, min_value=0)
                    for key in ("applied", "skipped_unknown", "skipped_nonfinite")
                )
            )

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
