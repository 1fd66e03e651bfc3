"""The embedding client of embedded mode: the embedding worker and PS engines, called in process.

:class:`EmbeddedClient` has the coroutines of
:class:`~pyrsia.services.nn_worker.embedding_client.EmbeddingWorkerClient` that the prefetcher,
the gradient sender and the contexts call (``lookup``, ``lookup_direct``, ``gradients``,
``configure``, ``register_optimizer``, ``dump``, ``load``, ``clear``, ``schema``, ``stats``,
``wait_ready``) and answers them with the services' own engines, no HTTP and no msgpack::

    EmbeddedClient ──▶ Worker (pyrsia/services/embedding_worker/server.py: forward and gradient
                       │       buffers, preprocessing, pooling, gathering, gradient fan-in)
                       └──▶ LocalPS ──▶ EmbeddingStore (pyrsia/services/embedding_ps/engine.py:
                                        hash table, optimizers, checkpoints; numba, GIL released)

The answers are the same ``pyrsia.shared.wire`` objects the HTTP client decodes, so the
prefetcher and the gradient sender run unchanged, with the same in-flight bounds (the
embedding staleness among them). The engines' numeric work runs on the runtime's loop
thread by default (the training thread keeps running: the kernels release the GIL), and
in a thread pool above ``inline_max_ids`` ids.

One PS replica holds every id, so a checkpoint is written as replica 0 of 1: the files a
services-mode job with one PS replica writes, and loadable by any number of replicas.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.warm import warm_ps
from pyrsia.services.embedding_worker.buffer import ForwardBuffer, GradientBuffer
from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.services.embedding_worker.warm import warm_worker
from pyrsia.shared.config import EmbeddingSchema, GlobalConfig
from pyrsia.shared.constants import GRADIENT_BUFFER_FACTOR
from pyrsia.shared.embedding_spec import (
    EmbeddingHyperparams,
    OptimizerSpec,
    optimizer_from_dict,
    optimizer_to_dict,
)
from pyrsia.shared.errors import InvalidInputError, PersiaError
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.ps import PSStats, UpdateTotals
from pyrsia.shared.wire.worker import (
    Embeddings,
    Gradients,
    GradientsApplied,
    WorkerSchema,
    WorkerStats,
)

EMBEDDED_ADDRESS = "embedded"
"""What ``urls`` lists in embedded mode (there is no address: the engines are in process)."""
INLINE_MAX_IDS = 1 << 40
"""By default every lookup and update runs inline on the runtime's loop thread: on a
machine with few cores a hand-off to a pool thread costs more than it overlaps."""
ENGINE_THREADS = 2
"""Threads of the pool for work above ``inline_max_ids`` ids, and for dumps and loads."""


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


class EmbeddedClient:
    """The embedding client of an embedded job: the same coroutines as
    ``EmbeddingWorkerClient``, answered by the in-process engines (run on the runtime's loop)."""

    def __init__(
        self,
        schema: EmbeddingSchema,
        config: GlobalConfig,
        *,
        inline_max_ids: int = INLINE_MAX_IDS,
        threads: int = ENGINE_THREADS,
    ):
        ps_config = config.embedding_parameter_server_config
        worker_config = config.embedding_worker_config
        self.schema = schema
        self.checkpoint_workers = config.common_config.checkpointing_config.num_workers
        self.store = EmbeddingStore(
            capacity=ps_config.capacity,
            num_shards=min(ps_config.num_hashmap_internal_shards, 64),
        )
        self.offload = Offloader(
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pyrsia-embedded"),
            max_inline_ids=inline_max_ids,
        )
        self.ps = LocalPS(self.store, self.offload)
        ttl = float(worker_config.buffered_data_expired_sec)
        self.worker = Worker(
            index=0, schema=schema, config=worker_config, ps=self.ps,  # type: ignore[arg-type]
            forward=ForwardBuffer(worker_config.forward_buffer_size, ttl),
            awaiting=GradientBuffer(worker_config.forward_buffer_size * GRADIENT_BUFFER_FACTOR, ttl),
            offload=self.offload, metrics=None,  # no /metrics in embedded mode: nothing reads them
            direct_ids=itertools.count(1),
        )  # fmt: skip
        self.registry = None
        self.http = None
        self._warmed: set[OptimizerSpec] = set()

    # --- discovery (nothing to discover) ----------------------------------------------
    async def connect(self) -> list[str]:
        return self.urls

    async def refresh(self) -> None:
        return None

    @property
    def urls(self) -> list[str]:
        return [EMBEDDED_ADDRESS]

    async def url(self, index: int) -> str:
        if index != 0:
            raise InvalidInputError("worker", "embedding worker 0 (embedded mode has one)", index)
        return EMBEDDED_ADDRESS

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """The engines are ready once built."""
        return None

    # --- data path --------------------------------------------------------------------
    async def lookup(
        self, worker: int, batch_id: int, train: bool, batch_size: int, *, gathered: bool = False
    ) -> tuple[Embeddings, bool]:
        """Embeddings of a batch the data loader buffered under ``batch_id`` (see
        ``EmbeddingWorkerClient.lookup``)."""
        await self.url(worker)
        embeddings = await self.worker.lookup(batch_id, train, gathered)
        return embeddings, bool(train and embeddings.requires_grad)

    async def lookup_direct(
        self, id_part: IDPart, train: bool, worker: int | None = None, *, gathered: bool = False
    ) -> tuple[Embeddings, int]:
        """Embeddings of ids given in the call (evaluation, direct datasets)."""
        await self.url(worker or 0)
        checked = IDPart.from_wire(id_part.to_wire(), "batch")  # what the route checks
        return await self.worker.lookup_direct(checked, train, gathered), 0

    async def gradients(
        self,
        worker: int,
        batch_id: int,
        loss_scale: float,
        grads: list[tuple[str, np.ndarray]],
        *,
        tables: list[tuple[int, np.ndarray]] | None = None,
        skipped_slots: tuple[str, ...] = (),
    ) -> GradientsApplied:
        """Apply one batch's embedding gradients (see ``EmbeddingWorkerClient.gradients``)."""
        await self.url(worker)
        # the checks of the wire form, on the arrays themselves (no copy)
        message = Gradients.from_wire(
            Gradients(
                batch_id, float(loss_scale), tuple(grads),
                None if tables is None else tuple(tables), tuple(skipped_slots),
            ).to_wire()
        )  # fmt: skip
        return await self.worker.apply_gradients(message)

    # --- administration ---------------------------------------------------------------
    async def configure(self, hyperparams: dict) -> Any:
        params = EmbeddingHyperparams.from_dict(hyperparams, field="hyperparams")
        self.store.configure(params)
        return {"replicas": [{"hyperparams": params.to_dict()}]}

    async def register_optimizer(self, optimizer: dict) -> Any:
        spec = optimizer_from_dict(optimizer, field="optimizer")
        self.store.register_optimizer(spec)
        if spec not in self._warmed:  # before the first batch: its kernels, not the window's
            await self.offload.run(None, _warm_kernels, spec)
            self._warmed.add(spec)
        return {"replicas": [{"optimizer": optimizer_to_dict(spec)}]}

    async def dump(self, directory: str) -> Any:
        manifest = await self.offload.run(
            None, _checkpoint_io, self.store.dump, directory, 0, 1, self.checkpoint_workers
        )
        return {"replicas": [{"manifest": manifest}]}

    async def load(self, directory: str) -> Any:
        entries = await self.offload.run(
            None, _checkpoint_io, self.store.load, directory, 0, 1, self.checkpoint_workers
        )
        return {"replicas": [{"entries": entries}]}

    async def clear(self) -> Any:
        await self.offload.run(None, self.store.clear)
        return {"replicas": [self.store.stats()]}

    async def schema(self) -> WorkerSchema:
        return WorkerSchema(self.schema, 1)

    async def stats(self) -> WorkerStats:
        """The buffers and the one PS replica's counters (``EmbeddingWorkerClient.stats``)."""
        out = dict(self.store.stats())
        out["optimizer"] = optimizer_to_dict(self.store.optimizer) if self.store.optimizer else None
        out["hyperparams"] = self.store.hyperparams.to_dict()
        worker = self.worker
        details = {
            "pending_by_loader": worker.forward.pending_by_loader(),
            "expired": worker.forward.expired + worker.awaiting.expired,
            "evicted_awaiting": worker.awaiting.evicted,
            "dropped_update_ids": 0,
            "applied_update_ids": self.ps.applied_updates,
        }
        ps = (PSStats(out["entries"], out["updates_applied"], out),)
        return WorkerStats(len(worker.forward), len(worker.awaiting), ps, details)

    def close(self) -> None:
        """Stop the engine threads and release the store."""
        self.offload.shutdown()
        self.store.close()
