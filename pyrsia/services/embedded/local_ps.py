"""One in-process PS replica: the embedding worker's PS interface answered by the PS engine.

The embedding worker's ``Worker`` (``pyrsia/services/embedding_worker/replica.py``) calls its
PS through ``PSClient``'s ``replica_count``, ``lookup`` and ``update``; :class:`LocalPS` has
them, answered by one :class:`~pyrsia.services.embedding_ps.engine.EmbeddingStore` in this
process (its kernels release the GIL), with no HTTP and no msgpack.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.ps import UpdateTotals

EMBEDDED_ADDRESS = "embedded"
"""What ``urls`` lists in embedded mode (there is no address: the engines are in process)."""


class LocalPS:
    """One in-process PS replica behind the interface the embedding worker's ``Worker`` calls
    (``PSClient``'s ``replica_count``, ``lookup`` and ``update``); the store's kernels release
    the GIL."""

    def __init__(self, store: EmbeddingStore, offload: Offloader):
        self.store = store
        self.offload = offload
        self.dropped_updates = 0  # nothing is ever unreachable in process
        self.applied_updates = 0
        self.urls = [EMBEDDED_ADDRESS]

    @property
    def replica_count(self) -> int:
        return 1

    async def lookup(
        self, per_replica: list[list[tuple[int, Any]]], *, train: bool
    ) -> list[tuple[np.ndarray, ...]]:
        """The vectors of every dim group of the one replica (``PSClient.lookup``'s answer)."""
        (groups,) = per_replica
        store = self.store

        def work() -> tuple[np.ndarray, ...]:
            return tuple(store.lookup(ids, dim, train=train) for dim, ids in groups)

        n = sum(len(ids) for _, ids in groups)
        return [await self.offload.run(n, work)]

    async def update(
        self, per_replica: list[list[tuple[int, Any, Any]]]
    ) -> tuple[UpdateTotals, int]:
        """Apply per-id gradients with the registered optimizer (``PSClient.update``'s answer)."""
        (groups,) = per_replica
        groups = [(d, ids, g) for d, ids, g in groups if len(ids)]
        store = self.store

        def work() -> UpdateTotals:
            total = UpdateTotals()
            for _, ids, grads in groups:
                r = store.update(ids, grads)
                total += UpdateTotals(r.applied, r.skipped_unknown, r.skipped_nonfinite)
            return total

        total = await self.offload.run(sum(len(ids) for _, ids, _ in groups), work)
        self.applied_updates += total.applied
        return total, 0
