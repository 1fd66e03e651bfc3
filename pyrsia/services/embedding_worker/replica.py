"""One embedding worker replica's state and work, without HTTP.

:class:`Worker` holds the replica's buffers, PS link, thread pool and metrics, and does
the work of its routes as plain methods: preprocess a batch's ids (``prepare``), answer a
lookup (``lookup``, ``lookup_direct``) and turn pooled gradients into per-id PS updates
(``apply_gradients``). ``handlers.py`` answers every embedding route with it, behind the
HTTP routes (``server.py``) and in process (embedded mode, pyrsia/services/embedded/transport.py).
:func:`worker_metrics` makes the Prometheus metrics it updates.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import prometheus_client as prom

from pyrsia.services.embedding_worker.buffer import ForwardBuffer, GradientBuffer
from pyrsia.services.embedding_worker.gathering import (
    Awaited,
    GatherPlan,
    answer_embeddings,
    check_gradients,
    gather_backward,
)
from pyrsia.services.embedding_worker.persia_metrics import WorkerPersiaMetrics
from pyrsia.services.embedding_worker.plans import PreparedBatch
from pyrsia.services.embedding_worker.pooling import pool_backward
from pyrsia.services.embedding_worker.preprocess import IDColumns, prepare_batch
from pyrsia.services.embedding_worker.ps_link import PSLink
from pyrsia.services.embedding_worker.routing import (
    replica_lookups,
    replica_updates,
    scatter_responses,
)
from pyrsia.services.embedding_worker.slot_counts import SlotIdCounts
from pyrsia.shared.config import EmbeddingSchema, EmbeddingWorkerConfig
from pyrsia.shared.errors import PersiaError
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.gathered import SlotEmbeddings
from pyrsia.shared.wire.ps import UpdateTotals
from pyrsia.shared.wire.worker import Embeddings, Gradients, GradientsApplied

log = logging.getLogger(__name__)

UNIQUE_RATE_SAMPLING = 8
"""Distinct ids per slot are counted on every 8th batch (the count costs a pass over the ids)."""


class IDHalf(Protocol):
    """A batch's id half as :meth:`Worker.prepare` reads it: a checked ``IDPart``, or in
    embedded mode the ``PersiaBatch`` itself (its constructor checked the same)."""

    requires_grad: bool

    @property
    def id_type_features(self) -> Sequence[IDColumns]: ...


@dataclass
class _Pending:
    prepared: PreparedBatch
    requires_grad: bool
    prepare_s: float = 0.0
    """Seconds its preprocessing took (PERSIA's lookup_preprocess_time_cost_sec)."""


@dataclass
class Worker:
    """Everything one embedding worker replica holds."""

    index: int
    schema: EmbeddingSchema
    config: EmbeddingWorkerConfig
    ps: PSLink
    """Its PS replicas: over HTTP (``PSClient``) or in process (embedded mode's ``LocalPS``)."""
    forward: ForwardBuffer
    awaiting: GradientBuffer
    offload: Offloader
    metrics: dict[str, Any] | None
    """The Prometheus metrics it updates (:func:`worker_metrics`); None: it records none
    (embedded mode, where no registry is read)."""
    direct_ids: itertools.count
    lookups: itertools.count = field(default_factory=itertools.count)
    counters: dict[str | int, Any] = field(default_factory=dict)  # labelled metric children

    def prepare(self, batch: IDHalf) -> _Pending:
        """Preprocess a checked id half (hash stack, prefix, dedup, routing)."""
        started = time.perf_counter()
        prepared = prepare_batch(self.schema, batch.id_type_features, self.ps.replica_count)
        return _Pending(prepared, batch.requires_grad, time.perf_counter() - started)

    def _dim_counter(self, dim: int) -> Any:
        counter = self.counters.get(dim)
        if counter is None:
            assert self.metrics is not None
            counter = self.counters[dim] = self.metrics["unique_ids"].labels(dim=str(dim))
        return counter

    async def embeddings(
        self,
        pending: _Pending,
        train: bool,
        gathered: bool,
        carried: Sequence[_Outgoing] = (),
    ) -> tuple[
        tuple[tuple[str, np.ndarray], ...] | SlotEmbeddings, GatherPlan, list[GradientsApplied]
    ]:
        """The batch's answer: pooled tensors per slot, or with ``gathered`` a
        ``SlotEmbeddings`` whose single-id summed slots come as tables (``gathering.py``);
        and what each of ``carried`` did, sent to the PS in the lookup's requests."""
        prepared = pending.prepared
        started = time.perf_counter()
        answers, results = await self.ps.lookup_carrying(
            replica_lookups(prepared),
            [c.per_replica for c in carried],
            train=train and pending.requires_grad,
        )
        applied = [
            c.finish(totals, dropped, self.metrics)
            for c, (totals, dropped) in zip(carried, results, strict=True)
        ]
        metrics = self.metrics
        sample = metrics is not None and next(self.lookups) % UNIQUE_RATE_SAMPLING == 0

        def pool() -> tuple[Any, GatherPlan, list[int] | None]:
            out, gather = answer_embeddings(
                prepared, scatter_responses(prepared, answers), gathered
            )
            return out, gather, [p.unique_count() for p in prepared.slots] if sample else None

        answered = time.perf_counter()
        out, gather, uniques = await self.offload.run(occurrence_count(prepared), pool)
        if metrics is not None:
            done = time.perf_counter()
            metrics["lookup_latency"].observe(done - started)
            metrics["persia"].looked_up(pending.prepare_s, answered - started, done - answered)
            names = prepared.slot_names
            if prepared.single_ids:  # one id per sample and slot
                counts = np.full(len(names), prepared.batch_size, np.float64)
            else:
                counts = np.fromiter((p.inverse.shape[0] for p in prepared.slots), np.float64)
            metrics["slot_ids"].add(
                names, counts, None if uniques is None else np.asarray(uniques, np.float64)
            )
            if uniques is not None:
                metrics["persia"].unique_rates(names, counts.tolist(), uniques)
            for dim, group in prepared.groups.items():
                self._dim_counter(dim).inc(group.ids.shape[0])
        return out, gather, applied

    async def lookup(
        self, batch_id: int, train: bool, gathered: bool, carried: Sequence[Gradients] = ()
    ) -> Embeddings:
        """``/lookup``: the embeddings of a buffered batch; a training batch then awaits its
        gradients (the HTTP route and the embedded mode, pyrsia/services/nn_worker, call it).

        ``carried``: earlier batches' gradients sent with this lookup, applied first, in
        order, exactly as ``/gradients`` applies them (the answer says what each did), in the
        lookup's own PS requests; one that is refused fails the lookup, the ones before it are
        applied, and the looked-up batch stays buffered."""
        self.forward.peek(batch_id)  # an unknown batch's error, before anything changes
        outgoing: list[_Outgoing] = []
        try:
            for msg in carried:
                outgoing.append(await self._outgoing(msg))
        except PersiaError:
            for done in outgoing:  # those checked before the refused one, as /gradients would
                await self._send(done)
            raise
        pending = self.forward.pop(batch_id)
        embeddings, plan, applied = await self.embeddings(pending, train, gathered, outgoing)
        if train and pending.requires_grad:
            self.awaiting.put(batch_id, Awaited(pending.prepared, plan))
        return Embeddings(embeddings, batch_id, pending.requires_grad, tuple(applied))

    async def lookup_direct(self, batch: IDPart, train: bool, gathered: bool) -> Embeddings:
        """``/lookup_direct``: the embeddings of a checked id half, no buffering; a training
        lookup of a batch that requires grad awaits its gradients under a negative id."""
        pending = await self.offload.run(batch_id_count(batch), self.prepare, batch)
        embeddings, plan, _ = await self.embeddings(pending, train, gathered)
        batch_id = None
        if train and pending.requires_grad:
            batch_id = -next(self.direct_ids)
            self.awaiting.put(batch_id, Awaited(pending.prepared, plan))
        return Embeddings(embeddings, batch_id, pending.requires_grad)

    async def apply_gradients(self, msg: Gradients) -> GradientsApplied:
        """``/gradients``: pooled gradients (and a gathered answer's table gradients) turned
        into per-id gradients and pushed to the PS replicas."""
        return await self._send(await self._outgoing(msg))

    async def _send(self, outgoing: _Outgoing) -> GradientsApplied:
        """One batch's per-id gradients sent to the PS replicas on their own requests."""
        totals, dropped = await self.ps.update(outgoing.per_replica)
        return outgoing.finish(totals, dropped, self.metrics)

    async def _outgoing(self, msg: Gradients) -> _Outgoing:
        """A batch's gradients checked, taken out of the awaiting buffer and turned into
        per-id gradients per PS replica (a refused body changes nothing)."""
        batch_id = msg.batch_id
        by_name = dict(msg.gradients)
        # Checked before the batch leaves the awaiting buffer: a refused body changes nothing.
        awaited = self.awaiting.peek(batch_id)
        prepared, plan = awaited.prepared, awaited.gather
        check_gradients(awaited, batch_id, by_name, msg.tables, msg.skipped_slots)
        self.awaiting.pop(batch_id)
        started = time.perf_counter()

        def backward() -> tuple[list, list[str]]:
            names = prepared.slot_names
            slot_grads = [by_name.get(n) for n in names] if by_name else [None] * len(names)
            grads, skipped = pool_backward(prepared, slot_grads, msg.loss_scale, plan.positions)
            nan_skipped = [n for n in skipped if n in by_name]
            if plan.groups:
                more, nonfinite = gather_backward(
                    prepared, plan, msg.tables, msg.skipped_slots, msg.loss_scale, grads
                )
                skipped, nan_skipped = skipped + more, nan_skipped + nonfinite
            return replica_updates(prepared, grads, skipped), nan_skipped

        per_replica, nan_skipped = await self.offload.run(occurrence_count(prepared), backward)
        metrics = self.metrics
        if metrics is not None:
            for name in nan_skipped:
                metrics["nan_skipped"].labels(slot=name).inc()
            metrics["persia"].nan_skipped(nan_skipped)
        if nan_skipped:
            log.warning(
                "batch %d: skipped slots with non-finite gradients: %s", batch_id, nan_skipped
            )
        return _Outgoing(batch_id, per_replica, tuple(nan_skipped), started)


@dataclass(frozen=True)
class _Outgoing:
    """One batch's per-id gradients on their way to the PS replicas."""

    batch_id: int
    per_replica: list[list[tuple[int, Any, Any]]]
    nan_skipped: tuple[str, ...]
    started: float

    def finish(
        self, totals: UpdateTotals, dropped: int, metrics: dict[str, Any] | None
    ) -> GradientsApplied:
        """What the replicas did with them (and the update metrics)."""
        if metrics is not None:
            metrics["update_latency"].observe(time.perf_counter() - self.started)
            metrics["persia"].update_s = time.perf_counter() - self.started
        return GradientsApplied(self.batch_id, self.nan_skipped, totals, dropped)


def batch_id_count(batch: IDPart) -> int:
    """Ids of a batch's id half (the size of its preprocessing)."""
    return sum(f.ids.shape[0] for f in batch.id_type_features)


def occurrence_count(prepared: PreparedBatch) -> int:
    """Id occurrences of a prepared batch (the size of its pooling and of its backward):
    every slot's rows are in its dim group's."""
    return sum(g.inverse.shape[0] for g in prepared.groups.values())


def worker_metrics(
    reg: prom.CollectorRegistry,
    worker_ref: list[Worker],
    labels: Callable[[], list[str]] = lambda: ["rep_0", ""],
) -> dict[str, Any]:
    """The metrics a :class:`Worker` updates, on ``reg`` (its app's, or a private one);
    ``labels`` gives PERSIA's ``instance`` and ``ip_addr`` for its compatibility set."""
    pending = prom.Gauge("pyrsia_ew_pending_batches", "batches waiting for lookup", registry=reg)
    pending.set_function(lambda: len(worker_ref[0].forward) if worker_ref else 0)
    stale = prom.Gauge(
        "pyrsia_ew_staleness", "batches with embeddings out, gradients not back", registry=reg
    )
    stale.set_function(lambda: len(worker_ref[0].awaiting) if worker_ref else 0)
    slot_ids = SlotIdCounts()
    reg.register(slot_ids)
    persia = WorkerPersiaMetrics(
        labels,
        lambda: (len(worker_ref[0].awaiting), len(worker_ref[0].forward)) if worker_ref else (0, 0),
    )
    reg.register(persia)
    return {
        "persia": persia,
        "slot_ids": slot_ids,
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
