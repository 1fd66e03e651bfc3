"""Calls from an NN worker (or an inference client) to the embedding workers.

:class:`EmbeddingClient` is written once against the embedding transport protocol
(:mod:`pyrsia.shared.embedding_transport`): :meth:`EmbeddingClient.call` sends any route's
request object and returns the route's checked reply, whatever carries it; the named methods
build a route's request from plain arguments, validating what the caller passed. Services
mode's :class:`EmbeddingWorkerClient` runs it over HTTP (``http_transport``); embedded mode
runs it over the in-process transport (``pyrsia/services/embedded/transport.py``).

Embedding layout per slot, as the worker answers it::

    summed slot  (embedding_summation: true)   float32 (batch, dim)
    raw slot     (embedding_summation: false)  float32 (batch, sample_fixed_size, dim + 1)
                                               last column: 1 for a real id, 0 for padding
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np

from pyrsia.services.nn_worker.carry import GradientCarrier
from pyrsia.services.nn_worker.http_transport import HttpEmbeddingTransport, normalize_address
from pyrsia.shared import embedding_transport as routes
from pyrsia.shared.constants import GRADIENT_CARRY_RECENT_S, GRADIENT_CARRY_WAIT_S
from pyrsia.shared.embedding_spec import EmbeddingHyperparams, optimizer_from_dict
from pyrsia.shared.embedding_transport import EmbeddingTransport, Rep, Req, Route, check_routes
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.worker import (
    Embeddings,
    Gradients,
    GradientsApplied,
    Lookup,
    LookupDirect,
    WorkerSchema,
    WorkerStats,
)

__all__ = ["EmbeddingClient", "EmbeddingWorkerClient", "normalize_address"]


class EmbeddingClient:
    """The calls an NN worker makes to the embedding workers, over any embedding transport.

    Use from coroutines running on the NN-worker runtime's loop.
    """

    def __init__(self, transport: EmbeddingTransport):
        check_routes(transport)
        self.transport = transport
        self._round_robin = itertools.count()
        self.carrier: GradientCarrier | None = None
        """Gradients kept for the next lookup (made on the loop by the first carrying lookup,
        where the transport's ``carries_gradients`` says carrying saves a request)."""
        self._carried_at = -float("inf")

    # --- discovery ----------------------------------------------------------------------
    async def connect(self) -> list[str]:
        """Wait until the embedding workers are known; their addresses."""
        return await self.transport.connect()

    async def refresh(self) -> None:
        """Re-read the workers' addresses (a worker restarted elsewhere)."""
        await self.transport.refresh()

    @property
    def urls(self) -> list[str]:
        return self.transport.addresses

    async def url(self, index: int) -> str:
        """Address of embedding worker ``index`` (an InvalidInputError naming ``worker``)."""
        return await self.transport.address(index)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Return once every worker is ready (services: they wait for their PS)."""
        await self.transport.wait_ready(timeout_s)

    # --- any route ----------------------------------------------------------------------
    async def call(
        self, route: Route[Req, Rep], request: Req, worker: int = 0, batch_size: int | None = None
    ) -> Rep:
        """Send ``request`` on ``route`` to embedding worker ``worker`` (the administration
        routes: worker 0, which forwards them to every PS replica); the route's reply.
        ``batch_size``: the rows an embeddings reply must have."""
        return await self.transport.call(worker, route, request, batch_size)

    # --- data path (the transport called directly: no extra frame per batch) -------------
    async def lookup(
        self,
        worker: int,
        batch_id: int,
        train: bool,
        batch_size: int,
        *,
        gathered: bool = False,
        carry: bool = False,
    ) -> tuple[Embeddings, bool]:
        """Embeddings of a batch a data loader buffered on ``worker`` under ``batch_id``.

        Returns them with whether the worker awaits gradients for the batch (``train`` and
        the batch's ``requires_grad``). With ``gathered`` single-id summed slots come as
        tables (``pyrsia.shared.wire.gathered``), and their gradients must go back as tables.
        With ``carry`` (a training lookup) the request carries the gradients
        :meth:`carry_gradients` kept for ``worker`` (``pyrsia.services.nn_worker.carry``).
        """
        carrier = self._carrier() if carry and train else None
        if carrier is None:
            request = Lookup(batch_id, train, gathered)
            embeddings = await self.transport.call(worker, routes.LOOKUP, request, batch_size)
            return embeddings, bool(train and embeddings.requires_grad)
        self._carried_at = time.monotonic()
        carried = await carrier.before_lookup(worker)
        request = Lookup(batch_id, train, gathered, tuple(body for body, _ in carried))
        try:
            embeddings = await self.transport.call(worker, routes.LOOKUP, request, batch_size)
        except BaseException:
            carrier.failed(worker, carried)
            raise
        carrier.answered(carried, embeddings.applied)
        return embeddings, bool(train and embeddings.requires_grad)

    def _carrier(self) -> GradientCarrier | None:
        if not getattr(self.transport, "carries_gradients", False):
            return None
        if self.carrier is None:
            self.carrier = GradientCarrier(self.send_gradients, GRADIENT_CARRY_WAIT_S)
        return self.carrier

    def carry_gradients(self, worker: int, request: Gradients) -> asyncio.Future | None:
        """Keep one batch's gradients for the next carrying lookup to ``worker``: the future
        of what applying them did; None (send them yourself) when no carrying lookup ran in
        the last ``GRADIENT_CARRY_RECENT_S`` (direct datasets, evaluation) or when flushing."""
        carrier = self.carrier
        if carrier is None or not carrier.hold:
            return None
        if time.monotonic() - self._carried_at > GRADIENT_CARRY_RECENT_S:
            return None
        return carrier.offer(worker, request)

    async def lookup_direct(
        self, id_part: IDPart, train: bool, worker: int | None = None, *, gathered: bool = False
    ) -> tuple[Embeddings, int]:
        """Embeddings of ids sent in the request; returns (embeddings, worker).

        ``embeddings.batch_id`` is the reference for the gradients (None unless a training
        lookup of a batch that requires grad). Without ``worker`` the workers take turns.
        """
        if worker is None:
            count = len(self.transport.addresses) or len(await self.transport.connect())
            worker = next(self._round_robin) % count
        request = LookupDirect(id_part, train, gathered)
        route = routes.LOOKUP_DIRECT
        return await self.transport.call(worker, route, request, id_part.batch_size), worker

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
        """Send one batch's embedding gradients: per pooled slot (the embeddings' layout), and
        per table of a gathered answer (``tables``; gathered slots left out named in
        ``skipped_slots``)."""
        request = Gradients(
            batch_id,
            float(loss_scale),
            tuple(grads),
            None if tables is None else tuple(tables),
            tuple(skipped_slots),
        )
        return await self.send_gradients(worker, request)

    async def send_gradients(self, worker: int, request: Gradients) -> GradientsApplied:
        """Send one batch's ``Gradients`` body on ``/gradients``."""
        return await self.transport.call(worker, routes.GRADIENTS, request)

    # --- administration (worker 0 fans these out to every PS replica) --------------------
    async def configure(self, hyperparams: dict) -> Any:
        params = EmbeddingHyperparams.from_dict(hyperparams, field="hyperparams")
        return await self.call(routes.CONFIGURE, Configure(params))

    async def register_optimizer(self, optimizer: dict) -> Any:
        spec = optimizer_from_dict(optimizer, field="optimizer")
        return await self.call(routes.REGISTER_OPTIMIZER, RegisterOptimizer(spec))

    async def dump(self, directory: str) -> Any:
        return await self.call(routes.DUMP, Directory(directory))

    async def load(self, directory: str) -> Any:
        return await self.call(routes.LOAD, Directory(directory))

    async def clear(self) -> Any:
        return await self.call(routes.CLEAR, Empty())

    async def schema(self) -> WorkerSchema:
        """The embedding schema worker 0 serves and its PS replica count."""
        return await self.call(routes.SCHEMA, Empty())

    async def stats(self) -> WorkerStats:
        """Worker 0's buffers and every PS replica's counters."""
        return await self.call(routes.STATS, Empty())

    def close(self) -> None:
        """Release what the transport owns (embedded mode: the engines' threads and store)."""
        self.transport.close()


class EmbeddingWorkerClient(EmbeddingClient):
    """An :class:`EmbeddingClient` over HTTP: the workers of the registry, or at ``addresses``."""

    transport: HttpEmbeddingTransport

    def __init__(self, http: HttpClient, **where: Any):
        """``where``: ``registry=`` or ``addresses=`` (exactly one), and ``wait_timeout_s``
        (:class:`~pyrsia.services.nn_worker.http_transport.HttpEmbeddingTransport`'s)."""
        super().__init__(HttpEmbeddingTransport(http, **where))

    @property
    def http(self) -> HttpClient:
        return self.transport.http

    @property
    def registry(self) -> Registry | None:
        return self.transport.registry
