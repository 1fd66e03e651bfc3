"""The embedding worker's HTTP routes (the whole protocol: PROTOCOL.md).

Data loaders POST a batch's id features to ``/batch``; the worker preprocesses them
at once (validation, hash stack, prefix, dedup, routing) and buffers the result.
An NN worker's ``/lookup`` pops it, fetches the unique ids' vectors from every PS
replica concurrently, pools them per slot and answers one tensor per slot; for a
training batch the prepared form moves to the gradient buffer until
``/gradients`` turns the pooled gradients into per-id updates for the PS.
Numeric work runs in a thread pool (the kernels release the GIL). The work itself is
:class:`~pyrsia.services.embedding_worker.replica.Worker`'s (``replica.py``, no HTTP); the
embedding routes are those of ``handlers.HANDLERS`` (the table embedded mode answers them
with too), each decoded from its route's request type here and its reply encoded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from pyrsia.services.embedding_worker.buffer import ForwardBuffer, GradientBuffer
from pyrsia.services.embedding_worker.handlers import HANDLERS, Handler, check_handlers
from pyrsia.services.embedding_worker.ps_client import PSClient
from pyrsia.services.embedding_worker.replica import Worker, batch_id_count, worker_metrics
from pyrsia.shared.config import EmbeddingSchema, EmbeddingWorkerConfig
from pyrsia.shared.constants import EW_INLINE_WORK_MAX_IDS, GRADIENT_BUFFER_FACTOR
from pyrsia.shared.embedding_transport import STATS
from pyrsia.shared.errors import ConflictError
from pyrsia.shared.http_server import METRICS, STATE, make_app, msgpack_handler, require_ready
from pyrsia.shared.persia_compat import persia_labels
from pyrsia.shared.settings import Settings
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.worker import PutBatch

log = logging.getLogger(__name__)

WORKER = web.AppKey("ew_worker", Worker)


def _worker(request: web.Request) -> Worker:
    require_ready(request)
    return request.app[WORKER]


@msgpack_handler
async def put_batch(request: web.Request, body: Any) -> dict:
    """Buffer a data loader's id features under (this worker, batch_id)."""
    worker = _worker(request)
    msg = PutBatch.from_wire(body)
    if msg.batch_id in worker.forward or msg.batch_id in worker.awaiting:
        raise ConflictError(f"batch {msg.batch_id} was already sent to this worker")
    pending = await worker.offload.run(batch_id_count(msg.batch), worker.prepare, msg.batch)
    worker.forward.put(msg.batch_id, msg.loader, pending)
    return {"worker": worker.index, "batch_id": msg.batch_id}


def _route(handler: Handler[Any, Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The HTTP side of one embedding route: the body decoded (and so checked) into the
    route's request, answered by ``handler`` on the app's worker, the reply encoded."""
    decode = handler.route.request.from_wire  # type: ignore[attr-defined]
    answer, encode, before_ready = handler.answer, handler.encode, handler.before_ready

    async def route(request: web.Request, body: Any) -> Any:
        worker = request.app[WORKER] if before_ready else _worker(request)
        return encode(await answer(worker, decode(body)))

    route.__name__ = handler.route.path.strip("/")
    route.__doc__ = handler.answer.__doc__
    return msgpack_handler(route)


def _build_worker(
    index: int,
    schema: EmbeddingSchema,
    config: EmbeddingWorkerConfig,
    ps: PSClient,
    threads: int,
    metrics: dict[str, Any],
) -> Worker:
    """The replica's :class:`Worker`: buffers sized and timed by ``config``, numeric work on
    a pool of ``threads`` (small batches inline), direct lookups numbered from 1."""
    ttl = float(config.buffered_data_expired_sec)
    return Worker(
        index=index,
        schema=schema,
        config=config,
        ps=ps,
        forward=ForwardBuffer(config.forward_buffer_size, ttl),
        awaiting=GradientBuffer(config.forward_buffer_size * GRADIENT_BUFFER_FACTOR, ttl),
        offload=Offloader(
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ew"),
            max_inline_ids=EW_INLINE_WORK_MAX_IDS,
        ),
        metrics=metrics,
        direct_ids=itertools.count(1),
    )


def _lifecycle(
    worker: Worker, ps: PSClient, ps_wait_timeout_s: float
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The app's cleanup context: wait for every PS replica in the background (the app
    turns ready then, or reports why not on /health while it stays up); on exit stop that
    wait, close the PS client's session and the thread pool."""

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async def connect() -> None:
            try:
                await ps.connect(ps_wait_timeout_s)
            except Exception as exc:  # reported on /health; the service stays up
                app[STATE].set_not_ready(str(exc))
                log.error("%s", exc)
                return
            app[STATE].set_ready()
            app[STATE].details["ps_replicas"] = ps.replica_count

        task = asyncio.create_task(connect())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ps.http.close()
        worker.offload.shutdown()

    return lifecycle


def _routes() -> dict[str, Callable[[web.Request], Awaitable[web.Response]]]:
    """Every POST route of the worker, by path: the data loaders' ``/batch``, and every
    embedding route of ``handlers.HANDLERS`` (the administration routes fan out to every PS
    replica)."""
    check_handlers()
    return {"/batch": put_batch, **{path: _route(h) for path, h in HANDLERS.items()}}


def create_app(
    *,
    index: int,
    schema: EmbeddingSchema,
    config: EmbeddingWorkerConfig,
    ps: PSClient,
    ps_wait_timeout_s: float,
    threads: int = 2,
    max_request_bytes: int | None = None,
    settings: Settings,
) -> web.Application:
    """The embedding worker app, ready once every PS replica is registered (413 over
    ``max_request_bytes``; ``settings``: the process's, with its flags over them)."""
    app = make_app(
        f"embedding_worker/{index}", client_max_size=max_request_bytes, settings=settings
    )
    worker_ref: list[Worker] = []
    metrics = worker_metrics(app[METRICS], worker_ref, lambda: persia_labels(app[STATE]))
    worker = _build_worker(index, schema, config, ps, threads, metrics)
    worker_ref.append(worker)
    app[WORKER] = worker
    app[STATE].set_not_ready("waiting for every embedding PS replica to register")
    app.cleanup_ctx.append(_lifecycle(worker, ps, ps_wait_timeout_s))
    routes = _routes()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    app.router.add_get(STATS.path, routes[STATS.path])
    return app
