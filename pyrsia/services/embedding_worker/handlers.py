"""The worker side of every embedding route, in one table both transports dispatch through.

:data:`HANDLERS` binds each :class:`~pyrsia.shared.embedding_transport.Route` of
:data:`~pyrsia.shared.embedding_transport.ROUTES` to the function that answers it on a
:class:`~pyrsia.services.embedding_worker.replica.Worker` with the request object::

    HTTP (server.py)    body ─ route.request.from_wire ─┐
                                                        ├─▶ handler.answer(worker, request)
    in process          request ─ handler.check ────────┘        │
    (embedded/transport.py)                                      ▼
                        HTTP: handler.encode(reply), msgpack; in process: the reply itself

Decoding a body checks it; in process the request object is checked by ``check`` instead
(on the arrays themselves, no copy), where its constructor did not already check it all.
The routes that reach the PS (the administration routes, fanned out to every replica) go
through the worker's :class:`~pyrsia.services.embedding_worker.ps_link.PSLink`. A route of
``ROUTES`` with no entry here fails the embedding worker's start, the in-process transport's
construction and ``tests/test_embedding_handlers.py``, naming the route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.shared import embedding_transport as routes
from pyrsia.shared.embedding_transport import ROUTES, Rep, Req, Route
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.wire import worker as wire
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.batch import IDPart


def _as_is(reply: Any) -> Any:
    return reply


@dataclass(frozen=True)
class Handler(Generic[Req, Rep]):
    """How the embedding worker answers one route."""

    route: Route[Req, Rep]
    answer: Callable[[Worker, Req], Awaitable[Rep]]
    """The work: the worker and the checked request -> the reply."""
    encode: Callable[[Rep], Any]
    """HTTP: the reply's wire form (the reply type's own ``to_wire``, called unbound: no
    extra frame per request)."""
    check: Callable[[Req], Req] | None = None
    """In process: the request object checked as decoding its wire form checks it (None:
    its constructor checks all there is)."""
    before_ready: bool = False
    """HTTP: answered while the worker still waits for its PS replicas."""


# --- the data routes --------------------------------------------------------------------
async def _lookup(worker: Worker, request: wire.Lookup) -> wire.Embeddings:
    """Embeddings of a buffered batch, after the gradients the request carries; a training
    batch then awaits its gradients."""
    return await worker.lookup(request.batch_id, request.train, request.gathered, request.carried)


def _check_lookup(request: wire.Lookup) -> wire.Lookup:
    """The carried gradient bodies checked as ``/gradients`` checks them."""
    if not request.carried:
        return request
    carried = tuple(_check_gradients(g) for g in request.carried)
    return wire.Lookup(request.batch_id, request.train, request.gathered, carried)


def _check_direct(request: wire.LookupDirect) -> wire.LookupDirect:
    batch = IDPart.from_wire(request.batch.to_wire(), "batch")
    return wire.LookupDirect(batch, request.train, request.gathered)


async def _lookup_direct(worker: Worker, request: wire.LookupDirect) -> wire.Embeddings:
    """Embeddings of ids sent in the request, no buffering; eval never inserts."""
    return await worker.lookup_direct(request.batch, request.train, request.gathered)


def _check_gradients(request: wire.Gradients) -> wire.Gradients:
    return wire.Gradients.from_wire(request.to_wire())


async def _gradients(worker: Worker, request: wire.Gradients) -> wire.GradientsApplied:
    """Pooled gradients (and a gathered answer's table gradients) turned into per-id
    gradients and pushed to the PS replicas."""
    return await worker.apply_gradients(request)


# --- what the worker serves -------------------------------------------------------------
async def _schema(worker: Worker, request: Empty) -> wire.WorkerSchema:
    """The embedding schema and PS replica count this worker serves (``persia-launcher
    serve`` checks it is the exported model's before it takes requests)."""
    return wire.WorkerSchema(worker.schema, worker.ps.replica_count)


async def _stats(worker: Worker, request: Empty) -> wire.WorkerStats:
    """Buffer sizes, drops, and every PS replica's stats."""
    ps = worker.ps
    details = {
        "pending_by_loader": worker.forward.pending_by_loader(),
        "expired": worker.forward.expired + worker.awaiting.expired,
        "evicted_awaiting": worker.awaiting.evicted,
        "dropped_update_ids": ps.dropped_updates,
        "applied_update_ids": ps.applied_updates,
    }
    replicas = tuple(await ps.stats())
    return wire.WorkerStats(len(worker.forward), len(worker.awaiting), replicas, details)


# --- the PS's administration routes, fanned out to every replica ------------------------
async def _configure(worker: Worker, request: Configure) -> Any:
    return {"replicas": await worker.ps.configure(request)}


async def _register_optimizer(worker: Worker, request: RegisterOptimizer) -> Any:
    return {"replicas": await worker.ps.register_optimizer(request)}


async def _dump(worker: Worker, request: Directory) -> Any:
    return {"replicas": await worker.ps.dump(request)}


async def _load(worker: Worker, request: Directory) -> Any:
    return {"replicas": await worker.ps.load(request)}


async def _clear(worker: Worker, request: Empty) -> Any:
    return {"replicas": await worker.ps.clear()}


HANDLERS: Mapping[str, Handler[Any, Any]] = {
    handler.route.path: handler
    for handler in (
        Handler(routes.LOOKUP, _lookup, wire.Embeddings.to_wire, _check_lookup),
        Handler(routes.LOOKUP_DIRECT, _lookup_direct, wire.Embeddings.to_wire, _check_direct),
        Handler(routes.GRADIENTS, _gradients, wire.GradientsApplied.to_wire, _check_gradients),
        Handler(routes.SCHEMA, _schema, wire.WorkerSchema.to_wire, before_ready=True),
        Handler(routes.STATS, _stats, wire.WorkerStats.to_wire, before_ready=True),
        Handler(routes.CONFIGURE, _configure, _as_is),
        Handler(routes.REGISTER_OPTIMIZER, _register_optimizer, _as_is),
        Handler(routes.DUMP, _dump, _as_is),
        Handler(routes.LOAD, _load, _as_is),
        Handler(routes.CLEAR, _clear, _as_is),
    )
}
"""Route path -> how the embedding worker answers it: the worker side of every route."""


def check_handlers(
    handlers: Mapping[str, Handler[Any, Any]] = HANDLERS, wanted: Iterable[Route[Any, Any]] = ROUTES
) -> None:
    """Raise a ``MisuseError`` naming each route of ``wanted`` with no handler in ``handlers``
    (or one bound under another route's path)."""
    missing = [r.path for r in wanted if r.path not in handlers or handlers[r.path].route != r]
    if missing:
        raise MisuseError(
            f"no embedding-worker handler for the route(s) {', '.join(missing)}: every route of "
            "pyrsia.shared.embedding_transport.ROUTES needs one in "
            "pyrsia.services.embedding_worker.handlers.HANDLERS"
        )
