"""The batch ingress each NN-worker rank hosts for the data loaders (data-flow step 2).

Routes (msgpack, PROTOCOL.md)::

    POST /ingress {"loader", "batch_id", "worker", "dense": dense_part} -> {}
         a batch that finds the bounded queue full is held until the loop takes one,
         429 after INGRESS_ROOM_WAIT_S; 409 for a batch id already received
    POST /done    {"loader", "loader_count", "sent"} -> {}
    GET  /metrics the rank's training: steps, samples/s, step phases, staleness, lookup
                  wait, skipped updates, loss scale, last loss (pyrsia.services.nn_worker.rank_stats);
                  pushed to a push gateway as the PS's are (enable_metrics + gateway address)

The rank registers as ``nn_worker/<rank>`` with ``replica_size`` = world size while the
ingress runs, and deregisters when it stops. :class:`BatchQueue` is the bounded queue
behind it: FIFO by default; in reproducible mode it hands batches out in batch-id order
(rank, rank + world_size, ...), skipping ids a finished loader will never send
(loader ``l`` sends ids ``k * loader_count + l``). The stream ends once every loader
has said it is done and every batch it announced was handed out.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from typing import Any

from aiohttp import web

from pyrsia.services.nn_worker.rank_stats import RankStats, register_rank_metrics
from pyrsia.shared.auth import auth_token_from_env, check_bind, insecure_from_env
from pyrsia.shared.config import load_global_config
from pyrsia.shared.config_schema import MetricsConfig
from pyrsia.shared.constants import (
    ENV_FINAL_SCRAPE_S,
    ENV_GLOBAL_CONFIG,
    INGRESS_ROOM_WAIT_S,
    ROLE_NN_WORKER,
    SHUTDOWN_CANCEL_S,
)
from pyrsia.shared.errors import BackPressureError, ConflictError, InvalidInputError
from pyrsia.shared.http_server import METRICS, STATE, listen, make_app, msgpack_handler
from pyrsia.shared.metrics_push import MetricsPushSettings, install_metrics_push, push_settings
from pyrsia.shared.registry import Registry, RegistrySettings, ServiceRecord
from pyrsia.shared.service_runner import advertise_host
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.ingress import IngressBatch, LoaderDone

log = logging.getLogger(__name__)


class BatchQueue:
    """Bounded queue of ingress items with end-of-stream accounting; lives on one loop."""

    def __init__(
        self,
        capacity: int,
        *,
        rank: int,
        world_size: int,
        reproducible: bool = False,
        skip: frozenset[int] = frozenset(),
        room_wait_s: float = INGRESS_ROOM_WAIT_S,
    ):
        """``skip``: batch ids trained before the checkpoint this job resumed from; the data
        loaders do not send them again, so reproducible order steps over them."""
        self.capacity = capacity
        self.room_wait_s = room_wait_s
        self._skip = skip
        self.rank = rank
        self.world_size = world_size
        self.reproducible = reproducible
        self._fifo: deque[IngressBatch] = deque()
        self._by_id: dict[int, IngressBatch] = {}
        self._seen: set[int] = set()
        self._expected = rank
        self._consumed: dict[int, int] = {}
        self._announced: dict[int, int] = {}
        self._loader_count: int | None = None
        self._error: BaseException | None = None
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._by_id) if self.reproducible else len(self._fifo)

    # --- producers (HTTP handlers) ------------------------------------------------------
    async def put(self, item: IngressBatch) -> None:
        if item.batch_id in self._seen:
            raise ConflictError(f"batch {item.batch_id} was already received by this rank")
        if item.loader in self._announced:
            raise ConflictError(f"loader {item.loader} already said it is done")
        if self.reproducible and item.batch_id % self.world_size != self.rank:
            raise InvalidInputError(
                "batch_id",
                f"an id equal to rank {self.rank} modulo world size {self.world_size}",
                item.batch_id,
            )
        if self._full(item):
            await self._wait_for_room(item)
            if item.batch_id in self._seen:  # the same id arrived while this one waited
                raise ConflictError(f"batch {item.batch_id} was already received by this rank")
        self._seen.add(item.batch_id)
        if self.reproducible:
            self._by_id[item.batch_id] = item
        else:
            self._fifo.append(item)
        await self._notify()

    def _full(self, item: IngressBatch) -> bool:
        if len(self) < self.capacity:
            return False
        return not (self.reproducible and item.batch_id == self._expected)

    async def _wait_for_room(self, item: IngressBatch) -> None:
        """Hold a batch that found the queue full until the loop takes one (at most
        ``room_wait_s``), so the loader's retry does not leave the loop without a batch."""
        try:
            async with asyncio.timeout(self.room_wait_s), self._changed:
                await self._changed.wait_for(lambda: not self._full(item))
        except TimeoutError:
            raise BackPressureError(
                f"NN worker rank {self.rank}: batch queue full ({self.capacity}); retry later",
            ) from None

    async def done(self, loader: int, loader_count: int, sent: int) -> None:
        if self._loader_count is not None and loader_count != self._loader_count:
            raise ConflictError(
                f"loader_count {loader_count} differs from {self._loader_count} announced before",
            )
        previous = self._announced.get(loader)
        if previous is not None and previous != sent:
            raise ConflictError(f"loader {loader} already said done with sent={previous}")
        self._loader_count = loader_count
        self._announced[loader] = sent
        await self._notify()

    async def fail(self, exc: BaseException) -> None:
        """End the stream with ``exc``: :meth:`get` raises it from now on (embedded mode's
        data loader thread failed; in services mode the launcher stops the job instead)."""
        self._error = exc
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- consumer ---------------------------------------------------------------------
    def finished(self) -> bool:
        """True when every loader said done and every batch it announced was handed out."""
        if self._loader_count is None or len(self._announced) < self._loader_count:
            return False
        if len(self) > 0:
            return False
        return all(self._consumed.get(lo, 0) >= n for lo, n in self._announced.items())

    def _pop_ready(self) -> IngressBatch | None:
        if not self.reproducible:
            return self._fifo.popleft() if self._fifo else None
        while True:
            if self._expected in self._skip:
                self._expected += self.world_size
                continue
            item = self._by_id.pop(self._expected, None)
            if item is not None:
                self._expected += self.world_size
                return item
            count = self._loader_count
            if count is None or (self._expected % count) not in self._announced:
                return None
            # The loader that would send this id is done: the id never comes.
            if not self._by_id and len(self._announced) == count:
                return None
            self._expected += self.world_size

    async def get(self) -> IngressBatch | None:
        """The next batch, or None at the end of the stream; the error of :meth:`fail`."""
        async with self._changed:
            while True:
                if self._error is not None:
                    raise self._error
                item = self._pop_ready()
                if item is not None:
                    self._consumed[item.loader] = self._consumed.get(item.loader, 0) + 1
                    self._changed.notify_all()  # room for a batch held in _wait_for_room
                    return item
                if self.finished():
                    return None
                await self._changed.wait()


QUEUE = web.AppKey("nn_ingress_queue", BatchQueue)


def _push_settings(settings: Settings) -> MetricsPushSettings | None:
    """Push settings of ``$PERSIA_GLOBAL_CONFIG``'s ``metrics_config`` and
    ``PERSIA_METRICS_GATEWAY_ADDR``, as the PS and embedding worker read them."""
    path = settings.text(ENV_GLOBAL_CONFIG)
    config = (
        load_global_config(path, settings=settings).common_config.metrics_config
        if path
        else MetricsConfig()
    )
    return push_settings(config, settings)


@msgpack_handler
async def _ingress(request: web.Request, body: Any) -> dict:
    """A data loader's dense half of one batch plus the reference of its id half."""
    await request.app[QUEUE].put(IngressBatch.from_wire(body))
    return {}


@msgpack_handler
async def _done(request: web.Request, body: Any) -> dict:
    """A data loader finished: it sent ``sent`` batches to this rank."""
    msg = LoaderDone.from_wire(body)
    await request.app[QUEUE].done(msg.loader, msg.loader_count, msg.sent)
    return {}


class Ingress:
    """The aiohttp server of one rank's ingress, registered while it runs."""

    def __init__(
        self,
        queue: BatchQueue,
        *,
        registry_settings: RegistrySettings,
        host: str | None = None,
        port: int = 0,
        stats: RankStats | None = None,
    ):
        """``stats``: what the rank's training did, served on ``/metrics`` (and pushed to
        ``PERSIA_METRICS_GATEWAY_ADDR`` when ``enable_metrics``). ``registry_settings``: the
        job's registry, and the process settings it came from (bind host, token, limits)."""
        self.queue = queue
        self.stats = stats or RankStats()
        self.settings = registry_settings
        self.environment = registry_settings.environment
        self.host = host or self.environment.bind_host
        self.port = port
        self.address: str | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._registry: Registry | None = None
        self._final_scrape_s = 0.0

    async def start(self) -> str:
        """Serve, register as ``nn_worker/<rank>``, and return the advertised address.

        Raises ConfigError for a non-loopback bind host without ``PERSIA_AUTH_TOKEN`` (unless
        ``PERSIA_INSECURE=1``), and the size cap comes from ``PYRSIA_MAX_MESSAGE_BYTES``.
        """
        settings = self.environment
        token = auth_token_from_env(settings)
        check_bind(self.host, token=token, insecure=insecure_from_env(settings))
        self._final_scrape_s = settings.final_scrape_s
        app = make_app(f"nn_worker/{self.queue.rank}", auth_token=token, settings=settings)
        app[QUEUE] = self.queue
        register_rank_metrics(self.stats, app[METRICS])
        install_metrics_push(
            app, _push_settings(settings), role=ROLE_NN_WORKER, replica_index=self.queue.rank
        )
        app.router.add_post("/ingress", _ingress)
        app.router.add_post("/done", _done)
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_CANCEL_S
        )
        await runner.setup()
        self._runner = runner
        try:
            self._listener, bound = await listen(runner, self.host, self.port)
            self.address = f"{advertise_host(self.host, settings)}:{bound}"
            registry = Registry(self.settings)
            self._registry = registry
            await registry.register(
                ServiceRecord(
                    role=ROLE_NN_WORKER,
                    replica_index=self.queue.rank,
                    replica_size=self.queue.world_size,
                    address=self.address,
                    pid=os.getpid(),
                )
            )
        except BaseException:
            await self.stop()
            raise
        app[STATE].set_ready()
        log.info("NN worker rank %d ingress at %s", self.queue.rank, self.address)
        return self.address

    async def stop(self, *, final_scrape: bool = False) -> None:
        """Deregister, then stop serving (idempotent). ``final_scrape`` (the job ended
        normally): first, with ``PYRSIA_FINAL_SCRAPE_S`` set, wait up to that long for a
        scrape of ``/metrics`` that starts now, so the final counters reach Prometheus."""
        if final_scrape and self._final_scrape_s > 0 and self._runner is not None:
            await self._await_final_scrape()
        registry, self._registry = self._registry, None
        if registry is not None:
            await registry.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _await_final_scrape(self) -> None:
        """Serve, registered, until ``/metrics`` has been answered once more, or the limit."""
        runner = self._runner
        assert runner is not None
        scraped = runner.app[STATE].scraped
        scraped.clear()
        log.info(
            "NN worker rank %d: waiting up to %gs for a final scrape of /metrics (%s)",
            self.queue.rank,
            self._final_scrape_s,
            ENV_FINAL_SCRAPE_S,
        )
        try:
            await asyncio.wait_for(scraped.wait(), self._final_scrape_s)
        except asyncio.TimeoutError:
            log.warning(
                "NN worker rank %d: no scrape of /metrics within %gs of the job's end; "
                "stopping without it",
                self.queue.rank,
                self._final_scrape_s,
            )
