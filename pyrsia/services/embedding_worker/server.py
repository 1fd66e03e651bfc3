"""The embedding worker's HTTP routes (the whole protocol: PROTOCOL.md).

Data loaders POST a batch's id features to ``/batch``; the worker preprocesses them
at once (validation, hash stack, prefix, dedup, routing) and buffers the result.
An NN worker's ``/lookup`` pops it, fetches the unique ids' vectors from every PS
replica concurrently, pools them per slot and answers one tensor per slot; for a
training batch the prepared form moves to the gradient buffer until
``/gradients`` turns the pooled gradients into per-id updates for the PS.
Numeric work runs in a thread pool (the kernels release the GIL). The work itself is
:class:`~pyrsia.services.embedding_worker.replica.Worker`'s (``replica.py``, no HTTP).
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
from pyrsia.services.embedding_worker.ps_client import PSClient
from pyrsia.services.embedding_worker.replica import Worker, batch_id_count, worker_metrics
from pyrsia.shared.config import EmbeddingSchema, EmbeddingWorkerConfig
from pyrsia.shared.constants import ADMIN_TIMEOUT_S, EW_INLINE_WORK_MAX_IDS, GRADIENT_BUFFER_FACTOR
from pyrsia.shared.errors import ConflictError, InvalidInputError, RemoteBadRequestError
from pyrsia.shared.http_server import METRICS, STATE, make_app, msgpack_handler, require_ready
from pyrsia.shared.persia_compat import persia_labels
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.ps import PSStats
from pyrsia.shared.wire.worker import (
    Gradients,
    Lookup,
    LookupDirect,
    PutBatch,
    WorkerSchema,
    WorkerStats,
)

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


@msgpack_handler
async def lookup(request: web.Request, body: Any) -> dict:
    """Pooled embeddings of a buffered batch; a training batch then awaits its gradients."""
    worker = _worker(request)
    msg = Lookup.from_wire(body)
    return (await worker.lookup(msg.batch_id, msg.train, msg.gathered)).to_wire()


@msgpack_handler
async def lookup_direct(request: web.Request, body: Any) -> dict:
    """Evaluation / inference path: ids in the request, no buffering; eval never inserts."""
    worker = _worker(request)
    msg = LookupDirect.from_wire(body)
    return (await worker.lookup_direct(msg.batch, msg.train, msg.gathered)).to_wire()


@msgpack_handler
async def gradients(request: web.Request, body: Any) -> dict:
    """Turn pooled gradients (and a gathered answer's table gradients) into per-id gradients
    and push them to the PS replicas."""
    worker = _worker(request)
    return (await worker.apply_gradients(Gradients.from_wire(body))).to_wire()


def _fan_out(path: str, message: type[Configure | RegisterOptimizer | Directory | Empty]):
    """A route that checks its body once and forwards it to every PS replica."""

    @msgpack_handler
    async def handler(request: web.Request, body: Any) -> dict:
        worker = request.app[WORKER]
        if not worker.ps.urls:
            require_ready(request)
        payload = message.from_wire(body).to_wire()
        if path in ("/configure", "/register_optimizer"):
            worker.ps.remember_setup(path, payload)
        try:
            answers = await worker.ps.fan_out(path, payload, timeout_s=ADMIN_TIMEOUT_S)
        except RemoteBadRequestError as exc:  # the PS refused the body our caller wrote: a 400
            field, expected = exc.field or "body", exc.expected or "a body the PS accepts"
            raise InvalidInputError(field, expected, message=str(exc)) from exc
        return {"replicas": answers}

    handler.__name__ = path.strip("/")
    return handler


@msgpack_handler
async def get_schema(request: web.Request, body: Any) -> dict:
    """The embedding schema and PS replica count this worker serves (``persia-launcher serve``
    checks it is the exported model's before it takes requests)."""
    Empty.from_wire(body)
    worker = request.app[WORKER]
    return WorkerSchema(worker.schema, worker.ps.replica_count).to_wire()


@msgpack_handler
async def stats(request: web.Request, body: Any) -> dict:
    """Buffer sizes, drops, and every PS replica's stats."""
    Empty.from_wire(body)
    worker = request.app[WORKER]
    ps_stats = await worker.ps.fan_out("/stats") if worker.ps.urls else []
    details = {
        "pending_by_loader": worker.forward.pending_by_loader(),
        "expired": worker.forward.expired + worker.awaiting.expired,
        "evicted_awaiting": worker.awaiting.evicted,
        "dropped_update_ids": worker.ps.dropped_updates,
        "applied_update_ids": worker.ps.applied_updates,
    }
    ps = tuple(PSStats.from_wire(a, f"ps[{i}]") for i, a in enumerate(ps_stats))
    return WorkerStats(len(worker.forward), len(worker.awaiting), ps, details).to_wire()


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
    worker: Worker, ps_wait_timeout_s: float
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The app's cleanup context: wait for every PS replica in the background (the app
    turns ready then, or reports why not on /health while it stays up); on exit stop that
    wait, close the PS client's session and the thread pool."""
    ps = worker.ps

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
    """Every POST route of the worker, by path (the PS admin routes fan out to every replica)."""
    return {
        "/batch": put_batch,
        "/lookup": lookup,
        "/lookup_direct": lookup_direct,
        "/gradients": gradients,
        "/schema": get_schema,
        "/stats": stats,
        "/configure": _fan_out("/configure", Configure),
        "/register_optimizer": _fan_out("/register_optimizer", RegisterOptimizer),
        "/dump": _fan_out("/dump", Directory),
        "/load": _fan_out("/load", Directory),
        "/clear": _fan_out("/clear", Empty),
    }


def create_app(
    *,
    index: int,
    schema: EmbeddingSchema,
    config: EmbeddingWorkerConfig,
    ps: PSClient,
    ps_wait_timeout_s: float,
    threads: int = 2,
    max_request_bytes: int | None = None,
) -> web.Application:
    """The embedding worker app, ready once every PS replica is registered (413 over
    ``max_request_bytes``)."""
    app = make_app(f"embedding_worker/{index}", client_max_size=max_request_bytes)
    worker_ref: list[Worker] = []
    metrics = worker_metrics(app[METRICS], worker_ref, lambda: persia_labels(app[STATE]))
    worker = _build_worker(index, schema, config, ps, threads, metrics)
    worker_ref.append(worker)
    app[WORKER] = worker
    app[STATE].set_not_ready("waiting for every embedding PS replica to register")
    app.cleanup_ctx.append(_lifecycle(worker, ps_wait_timeout_s))
    for path, handler in _routes().items():
        app.router.add_post(path, handler)
    app.router.add_get("/stats", stats)
    return app
