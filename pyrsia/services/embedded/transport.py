"""The in-process embedding transport: the embedding routes answered by the engines themselves.

:class:`InProcessTransport` implements
:class:`~pyrsia.shared.embedding_transport.EmbeddingTransport` for embedded mode: the NN
worker's embedding client (``pyrsia/services/nn_worker/embedding_client.py``), the same code
services mode runs over HTTP, calls it, and it answers each route with the embedding
worker's own handler (``embedding_worker/handlers.py``, the table the worker's HTTP server
dispatches through too), on the request object itself, with no HTTP and no msgpack::

    EmbeddingClient ─ call ─▶ InProcessTransport ─▶ HANDLERS[route] ─▶ Worker (embedding_worker/
                                                    replica.py: forward and gradient buffers,
                                                    preprocessing, pooling, gathering, gradient
                                                    fan-in)
                                                      └─▶ PSLink: LocalPS ─▶ EmbeddingStore
                                                          (embedding_ps/engine.py: hash table,
                                                          optimizers, checkpoints)

The replies are the same ``pyrsia.shared.wire`` objects the HTTP transport decodes, so the
prefetcher and the gradient sender run unchanged, with the same in-flight bounds (the
embedding staleness among them). A request is checked as the route checks it, on the objects
themselves (no copy). The engines' numeric work runs on the runtime's loop thread by default
(the training thread keeps running: the kernels release the GIL), and in a thread pool above
``inline_max_ids`` ids.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

from pyrsia.services.embedded.local_ps import EMBEDDED_ADDRESS, LocalPS
from pyrsia.services.embedding_ps.capacity import internal_shards
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.parallel import resolve_threads
from pyrsia.services.embedding_worker.buffer import ForwardBuffer, GradientBuffer
from pyrsia.services.embedding_worker.handlers import HANDLERS, check_handlers
from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.shared.config import EmbeddingSchema, GlobalConfig
from pyrsia.shared.constants import GRADIENT_BUFFER_FACTOR
from pyrsia.shared.embedding_transport import Rep, Req, Route
from pyrsia.shared.errors import InvalidInputError, MisuseError
from pyrsia.shared.thread_offload import Offloader

INLINE_MAX_IDS = 1 << 40
"""By default every lookup and update runs inline on the runtime's loop thread: on a
machine with few cores a hand-off to a pool thread costs more than it overlaps."""
ENGINE_THREADS = 2
"""Threads of the pool for work above ``inline_max_ids`` ids, and for dumps and loads."""


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
        store_threads = resolve_threads(None)
        self.store = EmbeddingStore(
            capacity=ps_config.capacity,
            num_shards=internal_shards(
                ps_config.num_hashmap_internal_shards, store_threads, ps_config.capacity
            ),
            threads=store_threads,
        )
        self.offload = Offloader(
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pyrsia-embedded"),
            max_inline_ids=inline_max_ids,
        )
        checkpoint_workers = config.common_config.checkpointing_config.num_workers
        self.ps = LocalPS(self.store, self.offload, checkpoint_workers)
        ttl = float(worker_config.buffered_data_expired_sec)
        self.worker = Worker(
            index=0,
            schema=schema,
            config=worker_config,
            ps=self.ps,
            forward=ForwardBuffer(worker_config.forward_buffer_size, ttl),
            awaiting=GradientBuffer(
                worker_config.forward_buffer_size * GRADIENT_BUFFER_FACTOR, ttl
            ),
            offload=self.offload,
            metrics=None,  # no /metrics in embedded mode: nothing reads them
            direct_ids=itertools.count(1),
        )
        check_handlers()
        self.handlers = dict(HANDLERS)
        """Route path -> its handler: the embedding worker's table (a copy of it)."""
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
        if handler.check is not None:
            request = handler.check(request)
        return await handler.answer(self.worker, request)

    def close(self) -> None:
        """Stop the engine threads and release the store."""
        self.offload.shutdown()
        self.store.close()
