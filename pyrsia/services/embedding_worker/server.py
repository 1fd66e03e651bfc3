"""The embedding worker's HTTP routes (the whole protocol: PROTOCOL.md).

Data loaders POST a batch's id features to ``/batch``; the worker preprocesses them
at once (validation, hash stack, prefix, dedup, routing) and buffers the result.
An NN worker's ``/lookup`` pops it, fetches the unique ids' vectors from every PS
replica concurrently, pools them per slot and answers one tensor per slot; for a
training batch the prepared form moves to the gradient buffer until
``/gradients`` turns the pooled gradients into per-id updates for the PS.
Numeric work runs in a thread pool (the kernels release the GIL).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import prometheus_client as prom
from aiohttp import web

from pyrsia.services.embedding_worker.buffer import ForwardBuffer, GradientBuffer
from pyrsia.services.embedding_worker.gathering import (
    Awaited,
    GatherPlan,
    answer_embeddings,
    check_gradients,
    gather_backward,
)
from pyrsia.services.embedding_worker.pooling import pool_backward
from pyrsia.services.embedding_worker.preprocess import PreparedBatch, prepare_batch
from pyrsia.services.embedding_worker.ps_client import PSClient
from pyrsia.services.embedding_worker.routing import (
    replica_lookups,
    replica_updates,
    scatter_responses,
)
from pyrsia.shared.config import EmbeddingSchema, EmbeddingWorkerConfig
from pyrsia.shared.constants import ADMIN_TIMEOUT_S, EW_INLINE_WORK_MAX_IDS, GRADIENT_BUFFER_FACTOR
from pyrsia.shared.errors import ConflictError, InvalidInputError, RemoteBadRequestError
from pyrsia.shared.http_server import METRICS, STATE, make_app, msgpack_handler, require_ready
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.gathered import SlotEmbeddings
from pyrsia.shared.wire.ps import PSStats
from pyrsia.shared.wire.worker import (
    Embeddings,
    Gradients,
    GradientsApplied,
    Lookup,
    LookupDirect,
    PutBatch,
    WorkerSchema,
    WorkerStats,
)

log = logging.getLogger(__name__)

UNIQUE_RATE_SAMPLING = 8
"""Distinct ids per slot are counted on every 8th batch (the count costs a pass over the ids)."""


@dataclass
class _Pending:
    prepared: PreparedBatch
    requires_grad: bool


@dataclass
class Worker:
    """Everything one embedding worker replica holds."""

    index: int
    schema: EmbeddingSchema
    config: EmbeddingWorkerConfig
    ps: PSClient
    forward: ForwardBuffer
    awaiting: GradientBuffer
    offload: Offloader
    metrics: dict[str, Any]
    direct_ids: itertools.count
    lookups: itertools.count = field(default_factory=itertools.count)
    counters: dict[str | int, Any] = field(default_factory=dict)  # labelled metric children

    def prepare(self, batch: IDPart) -> _Pending:
        """Preprocess a checked id half (hash stack, prefix, dedup, routing)."""
        prepared = prepare_batch(self.schema, batch.id_type_features, self.ps.replica_count)
        return _Pending(prepared, batch.requires_grad)

    def _slot_counters(self, slot: str) -> tuple[Any, Any, Any]:
        """The slot's three labelled counters (``labels()`` costs a lock and a lookup per call;
        slot names are the schema's, checked by ``prepare``, so the cache is bounded)."""
        counters = self.counters.get(slot)
        if counters is None:
            counters = tuple(
                self.metrics[m].labels(slot=slot)
                for m in ("slot_ids", "sampled_slot_ids", "sampled_slot_unique_ids")
            )
            self.counters[slot] = counters
        return counters

    def _dim_counter(self, dim: int) -> Any:
        counter = self.counters.get(dim)
        if counter is None:
            counter = self.counters[dim] = self.metrics["unique_ids"].labels(dim=str(dim))
        return counter

    async def embeddings(
        self, pending: _Pending, train: bool, gathered: bool
    ) -> tuple[tuple[tuple[str, np.ndarray], ...] | SlotEmbeddings, GatherPlan]:
        """The batch's answer: pooled tensors per slot, or with ``gathered`` a
        ``SlotEmbeddings`` whose single-id summed slots come as tables (``gathering.py``)."""
        prepared = pending.prepared
        started = time.perf_counter()
        answers = await self.ps.lookup(
            replica_lookups(prepared), train=train and pending.requires_grad
        )
        sample = next(self.lookups) % UNIQUE_RATE_SAMPLING == 0

        def pool() -> tuple[Any, GatherPlan, list[int] | None]:
            out, gather = answer_embeddings(
                prepared, scatter_responses(prepared, answers), gathered
            )
            return out, gather, [p.unique_count() for p in prepared.slots] if sample else None

        out, gather, uniques = await self.offload.run(_occurrences(prepared), pool)
        self.metrics["lookup_latency"].observe(time.perf_counter() - started)
        for i, plan in enumerate(prepared.slots):
            ids, sampled_ids, sampled_unique = self._slot_counters(plan.name)
            ids.inc(plan.inverse.shape[0])
            if uniques is not None:
                sampled_ids.inc(plan.inverse.shape[0])
                sampled_unique.inc(uniques[i])
        for dim, group in prepared.groups.items():
            self._dim_counter(dim).inc(group.ids.shape[0])
        return out, gather

    async def lookup(self, batch_id: int, train: bool, gathered: bool) -> Embeddings:
        """``/lookup``: the embeddings of a buffered batch; a training batch then awaits its
        gradients (the HTTP route and the embedded mode, pyrsia/services/nn_worker, call it)."""
        pending = self.forward.pop(batch_id)
        embeddings, plan = await self.embeddings(pending, train, gathered)
        if train and pending.requires_grad:
            self.awaiting.put(batch_id, Awaited(pending.prepared, plan))
        return Embeddings(embeddings, batch_id, pending.requires_grad)

    async def lookup_direct(self, batch: IDPart, train: bool, gathered: bool) -> Embeddings:
        """``/lookup_direct``: the embeddings of a checked id half, no buffering; a training
        lookup of a batch that requires grad awaits its gradients under a negative id."""
        pending = await self.offload.run(_batch_ids(batch), self.prepare, batch)
        embeddings, plan = await self.embeddings(pending, train, gathered)
        batch_id = None
        if train and pending.requires_grad:
            batch_id = -next(self.direct_ids)
            self.awaiting.put(batch_id, Awaited(pending.prepared, plan))
        return Embeddings(embeddings, batch_id, pending.requires_grad)

    async def apply_gradients(self, msg: Gradients) -> GradientsApplied:
        """``/gradients``: pooled gradients (and a gathered answer's table gradients) turned
        into per-id gradients and pushed to the PS replicas."""
        batch_id = msg.batch_id
        by_name = dict(msg.gradients)
        # Checked before the batch leaves the awaiting buffer: a refused body changes nothing.
        awaited = self.awaiting.peek(batch_id)
        prepared, plan = awaited.prepared, awaited.gather
        check_gradients(awaited, batch_id, by_name, msg.tables, msg.skipped_slots)
        self.awaiting.pop(batch_id)
        started = time.perf_counter()

        def backward() -> tuple[list, list[str]]:
            grads, skipped = pool_backward(
                prepared, [by_name.get(n) for n in prepared.slot_names], msg.loss_scale,
                plan.positions,
            )  # fmt: skip
            nan_skipped = [n for n in skipped if n in by_name]
            if plan.groups:
                more, nonfinite = gather_backward(
                    prepared, plan, msg.tables, msg.skipped_slots, msg.loss_scale, grads
                )
                skipped, nan_skipped = skipped + more, nan_skipped + nonfinite
            return replica_updates(prepared, grads, skipped), nan_skipped

        per_replica, nan_skipped = await self.offload.run(_occurrences(prepared), backward)
        for name in nan_skipped:
            self.metrics["nan_skipped"].labels(slot=name).inc()
        if nan_skipped:
            log.warning(
                "batch %d: skipped slots with non-finite gradients: %s", batch_id, nan_skipped
            )
        totals, dropped = await self.ps.update(per_replica)
        self.metrics["update_latency"].observe(time.perf_counter() - started)
        return GradientsApplied(batch_id, tuple(nan_skipped), totals, dropped)


WORKER = web.AppKey("ew_worker", Worker)


def _batch_ids(batch: IDPart) -> int:
    """Ids of a batch's id half (the size of its preprocessing)."""
    return sum(f.ids.shape[0] for f in batch.id_type_features)


def _occurrences(prepared: PreparedBatch) -> int:
    """Id occurrences of a prepared batch (the size of its pooling and of its backward)."""
    return sum(p.inverse.shape[0] for p in prepared.slots)


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
    pending = await worker.offload.run(_batch_ids(msg.batch), worker.prepare, msg.batch)
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


def worker_metrics(reg: prom.CollectorRegistry, worker_ref: list[Worker]) -> dict[str, Any]:
    """The metrics a :class:`Worker` updates, on ``reg`` (its app's, or a private one)."""
    pending = prom.Gauge("pyrsia_ew_pending_batches", "batches waiting for lookup", registry=reg)
    pending.set_function(lambda: len(worker_ref[0].forward) if worker_ref else 0)
    stale = prom.Gauge(
        "pyrsia_ew_staleness", "batches with embeddings out, gradients not back", registry=reg
    )
    stale.set_function(lambda: len(worker_ref[0].awaiting) if worker_ref else 0)
    return {
        "slot_ids": prom.Counter(
            "pyrsia_ew_slot_ids", "ids looked up per slot", ["slot"], registry=reg
        ),
        "sampled_slot_ids": prom.Counter(
            "pyrsia_ew_sampled_slot_ids",
            "ids per slot in sampled batches (with the next metric: the unique-id rate per slot)",
            ["slot"],
            registry=reg,
        ),
        "sampled_slot_unique_ids": prom.Counter(
            "pyrsia_ew_sampled_slot_unique_ids",
            "distinct ids per slot in sampled batches",
            ["slot"],
            registry=reg,
        ),
        "unique_ids": prom.Counter(
            "pyrsia_ew_unique_ids", "distinct ids looked up per dim group", ["dim"], registry=reg
        ),
        "nan_skipped": prom.Counter(
            "pyrsia_ew_nan_skipped_slots",
            "slot gradients skipped for NaN/inf",
            ["slot"],
            registry=reg,
        ),
        "lookup_latency": prom.Histogram(
            "pyrsia_ew_lookup_seconds", "batch lookup + pooling time", registry=reg
        ),
        "update_latency": prom.Histogram(
            "pyrsia_ew_update_seconds", "gradient fan-out time", registry=reg
        ),
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
    metrics = worker_metrics(app[METRICS], worker_ref)
    ttl = float(config.buffered_data_expired_sec)
    worker = Worker(
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
    worker_ref.append(worker)
    app[WORKER] = worker
    app[STATE].set_not_ready("waiting for every embedding PS replica to register")

    async def lifecycle(app: web.Application):
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

    app.cleanup_ctx.append(lifecycle)
    routes = {
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
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    app.router.add_get("/stats", stats)
    return app
