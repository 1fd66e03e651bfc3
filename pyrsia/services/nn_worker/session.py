"""What an entered context holds on the network side: registry, embedding-worker client, ingress.

A :class:`Session` is opened by ``EmbeddingCtx.__enter__`` (never in ``__init__``) and
closed by ``__exit__``; a context nested in another one reuses its parent's session.
Everything async runs on the process's :class:`~pyrsia.shared.runtime.Runtime`.

While a training loop runs (:class:`TrainingLoopClass`) the runtime's loop thread (lookups,
tensors, gradients, the ingress server) is in the ``background`` CPU class (Linux's
``SCHED_IDLE``) unless ``$PERSIA_CPU_PRIORITY=normal``, as embedded mode's engine threads are
while its session is open: torch splits each operator of a CPU step over every core and waits
for its slowest thread, so a loop thread that preempts one stalls the whole step (services
mode on 2 cores: backward 15.2 ms instead of 8.8); in the idle class the loop runs when the
training threads leave a core. While the training thread waits on the loop (its next batch,
a gradient-send slot, ``Runtime.run``) the loop runs in the default class
(``Runtime.waiting_on_loop``): other processes that keep every core busy would otherwise
starve it, heartbeat and scrapes included (docs/guides/scaling.md).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from pyrsia.services.nn_worker.embedding_client import EmbeddingClient, EmbeddingWorkerClient
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.services.nn_worker.rank_stats import RankStats
from pyrsia.shared.constants import (
    DEFAULT_WAIT_TIMEOUT_S,
    DISCOVERY_POLL_INTERVAL_S,
    ENV_ADVERTISE_HOST,
)
from pyrsia.shared.cpu_priority import resolve_cpu_priority
from pyrsia.shared.errors import InvalidInputError, RegistryError
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.runtime import CpuClassHold, Runtime, get_runtime
from pyrsia.shared.settings import Settings
from pyrsia.shared.warming import warming_in_progress

log = logging.getLogger(__name__)


class Session:
    """Connections of one context; create with :meth:`open`, release with :meth:`close`."""

    def __init__(
        self,
        runtime: Runtime,
        client: EmbeddingClient,
        registry: Registry | None,
        settings: RegistrySettings | None,
        environment: Settings,
    ):
        """``settings``: the job's registry (None with fixed addresses); ``environment``: the
        process settings of the context that opened the session."""
        self.runtime = runtime
        self.client = client
        self.registry = registry
        self.settings = settings
        self.environment = environment
        self._ingress: Ingress | None = None
        self.resume_skip: frozenset[int] = frozenset()  # batch ids trained before a --resume
        self.stats = RankStats()
        """What this rank's training did; its ingress serves it on ``/metrics``."""
        self.cpu_priority = resolve_cpu_priority(None, environment, default="background")
        """The loop thread's CPU class while a training loop runs (``$PERSIA_CPU_PRIORITY``)."""

    @classmethod
    def open(
        cls,
        environment: Settings,
        *,
        addresses: list[str] | None = None,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    ) -> Session:
        """Registry-backed (``addresses=None``) or fixed-address session; waits for the workers.

        Services mode's session: ``persia._session_open.open_session`` picks embedded mode's
        instead when ``PERSIA_EMBEDDED=1``."""
        runtime = get_runtime(environment)
        settings = None if addresses is not None else RegistrySettings.from_env(environment)

        async def connect() -> tuple[EmbeddingWorkerClient, Registry | None]:
            registry = Registry(settings) if settings is not None else None
            try:
                if registry is not None:
                    await registry.ping()
                client = EmbeddingWorkerClient(
                    runtime.client,
                    registry=registry,
                    addresses=addresses,
                    wait_timeout_s=wait_timeout_s,
                )
                if registry is not None:
                    await client.connect()
                return client, registry
            except BaseException:
                if registry is not None:
                    await registry.close()
                raise

        client, registry = runtime.run(connect())
        return cls(runtime, client, registry, settings, environment)

    def ingress(
        self, *, rank: int, world_size: int, capacity: int, reproducible: bool
    ) -> BatchQueue:
        """This rank's batch queue; the ingress server starts (and registers) on first use."""
        if self._ingress is not None:
            queue = self._ingress.queue
            if queue.capacity != capacity or queue.reproducible != reproducible:
                raise InvalidInputError(
                    "buffer_size/reproducible",
                    "one StreamingDataset configuration per context",
                    message="this rank's ingress already runs with buffer_size="
                    f"{queue.capacity}, reproducible={queue.reproducible}; one StreamingDataset "
                    "configuration per training context",
                )
            return queue

        async def start() -> Ingress:
            queue = BatchQueue(
                capacity,
                rank=rank,
                world_size=world_size,
                reproducible=reproducible,
                skip=self.resume_skip,
            )
            ingress = Ingress(queue, registry_settings=self.settings, stats=self.stats)
            await ingress.start()
            return ingress

        self._ingress = self.runtime.run(start())
        return self._ingress.queue

    def exchange_master_addr(self, rank: int, timeout_s: float = DEFAULT_WAIT_TIMEOUT_S) -> str:
        """The address of rank 0's process-group store: rank 0 publishes its own in the
        registry (``PERSIA_ADVERTISE_HOST``, else its host name's address); the other ranks
        wait up to ``timeout_s`` for it."""
        registry = self.registry
        if registry is None:
            raise RegistryError(
                "no registry to exchange the master address: pass master_addr= to the option"
            )
        if rank == 0:
            address = self.environment.text(ENV_ADVERTISE_HOST) or socket.gethostbyname(
                socket.gethostname()
            )
            self.runtime.run(registry.publish_master_addr(address))
            return address

        async def wait() -> str:
            deadline = time.monotonic() + timeout_s
            while (address := await registry.get_master_addr()) is None:
                if time.monotonic() >= deadline:
                    raise RegistryError(
                        f"rank 0 did not publish its master address within {timeout_s:.0f}s"
                    )
                await asyncio.sleep(DISCOVERY_POLL_INTERVAL_S)
            return address

        return self.runtime.run(wait())

    def close(self, *, final_scrape: bool = False) -> None:
        """Stop the ingress (deregistering it) and close the registry connection.
        ``final_scrape``: the job ended normally; the ingress first waits for Prometheus's
        last scrape when ``PYRSIA_FINAL_SCRAPE_S`` asks it to (``Ingress.stop``)."""
        ingress, self._ingress = self._ingress, None
        registry, self.registry = self.registry, None

        async def close() -> None:
            if ingress is not None:
                await ingress.stop(final_scrape=final_scrape)
            if registry is not None:
                await registry.close()

        if self.runtime.running and (ingress is not None or registry is not None):
            self.runtime.run(close())


class TrainingLoopClass:
    """The loop thread in its session's CPU class while one training loop runs: from the
    first batch taken once this process's kernel warm-up is over, to :meth:`release`.

    A warm-up that compiles (a cold start: tens of seconds) runs in the default class on
    every core; an idle-class loop thread beside it got no CPU for its registry heartbeat,
    and the rank dropped out of the registry (seen under docker compose, 2 ranks on 2
    cores). Between training steps the training thread waits for the loop and lends it the
    default class meanwhile (``Runtime.waiting_on_loop``)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._hold: CpuClassHold | None = None

    def settle(self) -> None:
        """Called as each batch is taken: take the class once no warm-up is running."""
        if self._hold is None and not warming_in_progress():
            self._hold = self.session.runtime.hold_cpu_class(self.session.cpu_priority)

    def release(self) -> None:
        """The loop ended: the class goes with the last holder (idempotent)."""
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()
