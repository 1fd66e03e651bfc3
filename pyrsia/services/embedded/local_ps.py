"""One in-process PS replica: the embedding worker's PS link answered by the PS engine.

The embedding worker's ``Worker`` (``pyrsia/services/embedding_worker/replica.py``) and its
route handlers reach the PS through
:class:`~pyrsia.services.embedding_worker.ps_link.PSLink`; :class:`LocalPS` implements it
with one :class:`~pyrsia.services.embedding_ps.engine.EmbeddingStore` in this process (its
kernels release the GIL), with no HTTP and no msgpack. Its answers are the ones a PS
service gives, less the boot id a process restart would change.

One PS replica holds every id, so a checkpoint is written as replica 0 of 1: the files a
services-mode job with one PS replica writes, and loadable by any number of replicas.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.warm import warm_ps
from pyrsia.services.embedding_worker.warm import warm_worker
from pyrsia.shared.embedding_spec import OptimizerSpec, optimizer_to_dict
from pyrsia.shared.errors import InvalidInputError, PersiaError
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.admin import Configure, Directory, RegisterOptimizer
from pyrsia.shared.wire.ps import PSStats, UpdateTotals

EMBEDDED_ADDRESS = "embedded"
"""The address the in-process transport gives its one worker (there is none: the engines
are in process)."""


def _checkpoint_io(fn, directory: str, *args) -> Any:
    """A dump or load; a path that cannot be used is an InvalidInputError naming ``dir``
    (the PS service answers it with a 400 naming ``dir`` too)."""
    try:
        return fn(directory, *args)
    except PersiaError:
        raise
    except (ValueError, OSError) as exc:
        why = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
        raise InvalidInputError(
            "dir", f"a directory this process can create, read and write ({why})", directory
        ) from exc


def _warm_kernels(spec: OptimizerSpec) -> None:
    """Load the compiled kernels of the PS with ``spec`` and of the worker, as the services
    do when they start: the first updates otherwise loaded them inside the training window
    (~9 ms of CPU on the Census job)."""
    warm_ps((spec,))
    warm_worker()


def _apply(store: EmbeddingStore, groups: list[tuple[int, Any, Any]]) -> UpdateTotals:
    """One update's ``(dim, ids, grads)`` groups applied in order (empty ones skipped)."""
    r = store.update_groups((ids, grads) for _, ids, grads in groups)
    return UpdateTotals(r.applied, r.skipped_unknown, r.skipped_nonfinite)


class LocalPS:
    """One in-process PS replica behind the embedding worker's ``PSLink``; the store's
    kernels release the GIL, and unbounded work (dumps, loads, clears) runs on ``offload``'s
    pool."""

    def __init__(self, store: EmbeddingStore, offload: Offloader, checkpoint_workers: int = 1):
        self.store = store
        self.offload = offload
        self.checkpoint_workers = checkpoint_workers
        self.dropped_updates = 0  # nothing is ever unreachable in process
        self.applied_updates = 0
        self._warmed: set[OptimizerSpec] = set()

    @property
    def replica_count(self) -> int:
        return 1

    async def lookup(
        self, per_replica: list[list[tuple[int, Any]]], *, train: bool
    ) -> list[tuple[np.ndarray, ...]]:
        """The vectors of every dim group of the one replica (``PSClient.lookup``'s answer)."""
        answers, _ = await self.lookup_carrying(per_replica, (), train=train)
        return answers

    async def lookup_carrying(
        self,
        per_replica: list[list[tuple[int, Any]]],
        updates: Sequence[list[list[tuple[int, Any, Any]]]],
        *,
        train: bool,
    ) -> tuple[list[tuple[np.ndarray, ...]], list[tuple[UpdateTotals, int]]]:
        """``updates`` applied in order, then the lookup (``PSClient.lookup_carrying``'s answer)."""
        (groups,) = per_replica
        carried = [u[0] for u in updates]
        store = self.store

        def work() -> tuple[list[UpdateTotals], tuple[np.ndarray, ...]]:
            applied = [_apply(store, c) for c in carried]
            return applied, tuple(store.lookup(ids, dim, train=train) for dim, ids in groups)

        n = sum(len(ids) for _, ids in groups) + sum(len(ids) for c in carried for _, ids, _ in c)
        applied, out = await self.offload.run(n, work)
        self.applied_updates += sum(a.applied for a in applied)
        return [out], [(a, 0) for a in applied]

    async def update(
        self, per_replica: list[list[tuple[int, Any, Any]]]
    ) -> tuple[UpdateTotals, int]:
        """Apply per-id gradients with the registered optimizer (``PSClient.update``'s answer)."""
        (groups,) = per_replica
        n = sum(len(ids) for _, ids, _ in groups)
        total = await self.offload.run(n, _apply, self.store, groups)
        self.applied_updates += total.applied
        return total, 0

    # --- administration: the PS service's answers, for its one replica -------------------
    async def configure(self, request: Configure) -> list[Any]:
        self.store.configure(request.hyperparams)
        return [{"hyperparams": request.hyperparams.to_dict()}]

    async def register_optimizer(self, request: RegisterOptimizer) -> list[Any]:
        spec = request.optimizer
        self.store.register_optimizer(spec)
        if spec not in self._warmed:  # before the first batch: its kernels, not the window's
            await self.offload.run(None, _warm_kernels, spec)
            self._warmed.add(spec)
        return [{"optimizer": optimizer_to_dict(spec)}]

    async def dump(self, request: Directory) -> list[Any]:
        store, workers = self.store, self.checkpoint_workers
        manifest = await self.offload.run(
            None, _checkpoint_io, store.dump, request.dir, 0, 1, workers
        )
        return [{"manifest": manifest}]

    async def load(self, request: Directory) -> list[Any]:
        store, workers = self.store, self.checkpoint_workers
        entries = await self.offload.run(
            None, _checkpoint_io, store.load, request.dir, 0, 1, workers
        )
        return [{"entries": entries}]

    async def clear(self) -> list[Any]:
        await self.offload.run(None, self.store.clear)
        return [self.store.stats()]

    async def stats(self) -> list[PSStats]:
        """The store's counters, with its optimizer and hyperparameters (what ``/stats`` of a
        PS answers)."""
        store = self.store
        out = dict(store.stats())
        out["optimizer"] = optimizer_to_dict(store.optimizer) if store.optimizer else None
        out["hyperparams"] = store.hyperparams.to_dict()
        return [PSStats(out["entries"], out["updates_applied"], out)]
