"""The embedding worker's link to its PS replicas: what a ``Worker`` calls, however they are reached.

A :class:`~pyrsia.services.embedding_worker.replica.Worker` and the route handlers
(``handlers.py``) reach the PS only through :class:`PSLink`; two classes implement it::

    Worker ── PSLink ─┬─▶ PSClient (ps_client.py, services mode): one HTTP request per replica,
                      │     retries, re-discovery, the setup replayed to a restarted replica
                      └─▶ LocalPS (pyrsia/services/embedded/local_ps.py, embedded mode): one
                            PS replica's engine in this process, no HTTP, no msgpack

Replicas are numbered from 0; a call that goes to every replica answers in replica order.
``tests/test_ps_link.py`` checks that both classes have every member of the protocol with its
signature, and that they answer alike on a real PS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pyrsia.shared.wire.admin import Configure, Directory, RegisterOptimizer
from pyrsia.shared.wire.ps import PSStats, UpdateTotals


class PSLink(Protocol):
    """What an embedding worker needs of its PS replicas."""

    dropped_updates: int
    """Id rows whose gradients were dropped because their replica stayed unreachable."""
    applied_updates: int
    """Id rows the replicas said they applied."""

    @property
    def replica_count(self) -> int:
        """How many PS replicas the ids are spread over (each id's replica: ``preprocess``)."""
        ...

    async def lookup(
        self, per_replica: list[list[tuple[int, Any]]], *, train: bool
    ) -> list[tuple[np.ndarray, ...]]:
        """Each replica's ``(dim, ids)`` groups -> per replica, one ``(n, dim)`` float32 array
        per group (a training lookup may insert)."""
        ...

    async def lookup_carrying(
        self,
        per_replica: list[list[tuple[int, Any]]],
        updates: Sequence[list[list[tuple[int, Any, Any]]]],
        *,
        train: bool,
    ) -> tuple[list[tuple[np.ndarray, ...]], list[tuple[UpdateTotals, int]]]:
        """``lookup`` whose request to each replica carries that replica's part of each of
        ``updates`` (as ``update`` takes them), applied first, in order: the lookup's answer,
        and per update the summed totals and the id rows dropped (a replica that stays
        unreachable fails the lookup; the updates it was sent count as dropped)."""
        ...

    async def update(
        self, per_replica: list[list[tuple[int, Any, Any]]]
    ) -> tuple[UpdateTotals, int]:
        """Each replica's ``(dim, ids, grads)`` groups applied with the registered optimizer:
        the summed totals, and the id rows dropped because their replica stayed unreachable."""
        ...

    async def configure(self, request: Configure) -> list[Any]:
        """Set every replica's hyperparameters; each replica's answer."""
        ...

    async def register_optimizer(self, request: RegisterOptimizer) -> list[Any]:
        """Register the optimizer on every replica; each replica's answer."""
        ...

    async def dump(self, request: Directory) -> list[Any]:
        """Every replica writes its part of a checkpoint into ``request.dir``; their manifests."""
        ...

    async def load(self, request: Directory) -> list[Any]:
        """Every replica loads its ids from the checkpoint in ``request.dir``; their answers."""
        ...

    async def clear(self) -> list[Any]:
        """Every replica drops its entries (optimizer and hyperparameters stay); their stats."""
        ...

    async def stats(self) -> list[PSStats]:
        """Every replica's counters (none while no replica is known yet)."""
        ...
