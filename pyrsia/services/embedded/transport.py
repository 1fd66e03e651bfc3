"""The in-process embedding transport: the embedding routes answered by the engines themselves.

:class:`InProcessTransport` implements
:class:`~pyrsia.shared.embedding_transport.EmbeddingTransport` for embedded mode: the NN
worker's embedding client (``pyrsia/services/nn_worker/embedding_client.py``), the same code
services mode runs over HTTP, calls it, and each route's handler passes the request object to
the services' own engines, with no HTTP and no msgpack::

    EmbeddingClient ─ call ─▶ InProcessTransport ─▶ Worker (embedding_worker/replica.py: forward
                                                    │       and gradient buffers, preprocessing,
                                                    │       pooling, gathering, gradient fan-in)
                                                    └─▶ LocalPS ─▶ EmbeddingStore (embedding_ps/
                                                                   engine.py: hash table,
                                                                   optimizers, checkpoints)

The replies are the same ``pyrsia.shared.wire`` objects the HTTP transport decodes, so the
prefetcher and the gradient sender run unchanged, with the same in-flight bounds (the
embedding staleness among them). A request is checked as the route checks it, on the objects
themselves (no copy). The engines' numeric work runs on the runtime's loop thread by default
(the training thread keeps running: the kernels release the GIL), and in a thread pool above
``inline_max_ids`` ids.

One PS replica holds every id, so a checkpoint is written as replica 0 of 1: the files a
services-mode job with one PS replica writes, and loadable by any number of replicas.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyrsia.services.embedded.local_ps import EMBEDDED_ADDRESS, LocalPS
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.warm import warm_ps
from pyrsia.services.embedding_worker.buffer import ForwardBuffer, GradientBuffer
from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.services.embedding_worker.warm import warm_worker
from pyrsia.shared import embedding_transport as routes
from pyrsia.shared.config import EmbeddingSchema, GlobalConfig
from pyrsia.shared.constants import GRADIENT_BUFFER_FACTOR
from pyrsia.shared.embedding_spec import OptimizerSpec, optimizer_to_dict
from pyrsia.shared.embedding_transport import Rep, Req, Route
from pyrsia.shared.errors import InvalidInputError, MisuseError, PersiaError
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire import worker as wire
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.ps import PSStats

INLINE_MAX_IDS = 1 << 40
"""By default every lookup and update runs inline on the runtime's loop thread: on a
machine with few cores a hand-off to a pool thread costs more than it overlaps."""
ENGINE_THREADS = 2
"""Threads of the pool for work above ``inline_max_ids`` ids, and for dumps and loads."""

Handler = Callable[[Any], Awaitable[Any]]


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


class InProcessTransport:
    """Embedded mode's one embedding worker and one PS replica, built from the job's
    configuration, answering every embedding route in this process."""

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
            index=0,
            schema=schema,
            config=worker_config,
            ps=self.ps,  # type: ignore[arg-type]
            forward=ForwardBuffer(worker_config.forward_buffer_size, ttl),
            awaiting=GradientBuffer(
                worker_config.forward_buffer_size * GRADIENT_BUFFER_FACTOR, ttl
            ),
            offload=self.offload,
            metrics=None,  # no /metrics in embedded mode: nothing reads them
            direct_ids=itertools.count(1),
        )
        self._warmed: set[OptimizerSpec] = set()
        self.handlers: dict[str, Handler] = {
            routes.LOOKUP.path: self.lookup,
            routes.LOOKUP_DIRECT.path: self.lookup_direct,
            routes.GRADIENTS.path: self.gradients,
            routes.CONFIGURE.path: self.configure,
            routes.REGISTER_OPTIMIZER.path: self.register_optimizer,
            routes.DUMP.path: self.dump,
            routes.LOAD.path: self.load,
            routes.CLEAR.path: self.clear,
            routes.SCHEMA.path: self.worker_schema,
            routes.STATS.path: self.stats,
        }
        """Route path -> the handler answering it (the worker side of a route in embedded mode)."""
        self.routes = frozenset(self.handlers)

    # --- discovery (nothing to discover) ----------------------------------------------
    @property
    def addresses(self) -> list[str]:
        return [EMBEDDED_ADDRESS]

    async def connect(self) -> list[str]:
        return self.addresses

    async def refresh(self) -> None:
        return None

    async def address(self, worker: int) -> str:
        if worker != 0:
            raise InvalidInputError("worker", "embedding worker 0 (embedded mode has one)", worker)
        return EMBEDDED_ADDRESS

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """The engines are ready once built."""
        return None

    async def call(
        self, worker: int, route: Route[Req, Rep], request: Req, batch_size: int | None = None
    ) -> Rep:
        """The route's handler, on the request object itself (``batch_size`` is the batch's
        own: the engines answer it)."""
        if worker != 0:
            await self.address(worker)
        handler = self.handlers.get(route.path)
        if handler is None:
            raise MisuseError(f"the in-process embedding transport has no route {route.path}")
        return await handler(request)

    # --- the worker's data routes ------------------------------------------------------
    async def lookup(self, request: wire.Lookup) -> wire.Embeddings:
        """Embeddings of a batch the data loader buffered under ``batch_id``."""
        return await self.worker.lookup(request.batch_id, request.train, request.gathered)

    async def lookup_direct(self, request: wire.LookupDirect) -> wire.Embeddings:
        """Embeddings of ids given in the call (evaluation, direct datasets)."""
        checked = IDPart.from_wire(request.batch.to_wire(), "batch")  # what the route checks
        return await self.worker.lookup_direct(checked, request.train, request.gathered)

    async def gradients(self, request: wire.Gradients) -> wire.GradientsApplied:
        """Apply one batch's embedding gradients, checked as the route checks them (on the
        arrays themselves, no copy)."""
        return await self.worker.apply_gradients(wire.Gradients.from_wire(request.to_wire()))

    async def worker_schema(self, request: Empty) -> wire.WorkerSchema:
        return wire.WorkerSchema(self.schema, 1)

    async def stats(self, request: Empty) -> wire.WorkerStats:
        """The buffers and the one PS replica's counters (what ``/stats`` answers)."""
        store, worker = self.store, self.worker
        out = dict(store.stats())
        out["optimizer"] = optimizer_to_dict(store.optimizer) if store.optimizer else None
        out["hyperparams"] = store.hyperparams.to_dict()
        details = {
            "pending_by_loader": worker.forward.pending_by_loader(),
            "expired": worker.forward.expired + worker.awaiting.expired,
            "evicted_awaiting": worker.awaiting.evicted,
            "dropped_update_ids": 0,
            "applied_update_ids": self.ps.applied_updates,
        }
        ps = (PSStats(out["entries"], out["updates_applied"], out),)
        return wire.WorkerStats(len(worker.forward), len(worker.awaiting), ps, details)

    # --- the PS's administration routes (worker 0 forwards them in services mode) ------
    async def configure(self, request: Configure) -> Any:
        self.store.configure(request.hyperparams)
        return {"replicas": [{"hyperparams": request.hyperparams.to_dict()}]}

    async def register_optimizer(self, request: RegisterOptimizer) -> Any:
        spec = request.optimizer
        self.store.register_optimizer(spec)
        if spec not in self._warmed:  # before the first batch: its kernels, not the window's
            await self.offload.run(None, _warm_kernels, spec)
            self._warmed.add(spec)
        return {"replicas": [{"optimizer": optimizer_to_dict(spec)}]}

    async def dump(self, request: Directory) -> Any:
        manifest = await self.offload.run(
            None, _checkpoint_io, self.store.dump, request.dir, 0, 1, self.checkpoint_workers
        )
        return {"replicas": [{"manifest": manifest}]}

    async def load(self, request: Directory) -> Any:
        entries = await self.offload.run(
            None, _checkpoint_io, self.store.load, request.dir, 0, 1, self.checkpoint_workers
        )
        return {"replicas": [{"entries": entries}]}

    async def clear(self, request: Empty) -> Any:
        await self.offload.run(None, self.store.clear)
        return {"replicas": [self.store.stats()]}

    def close(self) -> None:
        """Stop the engine threads and release the store."""
        self.offload.shutdown()
        self.store.close()
