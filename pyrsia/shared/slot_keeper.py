"""A job-lease slot held from a background thread, for a launcher whose main thread is busy.

``persia-launcher nn-worker`` and ``data-loader`` run the user's code on their main thread,
so they cannot heartbeat from an event loop there as the services do
(``pyrsia.shared.registry.Registry.register``); :class:`SlotKeeper` takes their slot of the
job lease (``pyrsia.shared.job_lease``) and keeps it from a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from redis.exceptions import RedisError

from pyrsia.shared.constants import (
    DEREGISTER_TIMEOUT_S,
    ENV_JOB_ID,
    REDIS_STARTUP_WAIT_S,
    SLOT_KEEPER_JOIN_SLACK_S,
)
from pyrsia.shared.errors import RegistryError, UsageError
from pyrsia.shared.job_lease import JobConflictError
from pyrsia.shared.registry import Registry, redis_gone
from pyrsia.shared.registry_settings import RegistrySettings, unreachable_error

log = logging.getLogger(__name__)


class SlotKeeper:
    """Holds one slot of the job lease from a background thread, for a launcher process
    whose main thread runs the user's code (``persia-launcher nn-worker`` and
    ``data-loader``): :meth:`start` takes the slot or raises, :meth:`stop` gives it back.

    The thread runs its own event loop and Redis connection, refreshes the slot every
    heartbeat, and only logs when Redis is away (the lease is made again when it is back).
    Between heartbeats it sleeps: ``stop()`` wakes it, so it never polls a flag (the
    launchers share the cores with the training threads).
    """

    def __init__(
        self,
        role: str,
        replica_index: int,
        replica_size: int,
        settings: RegistrySettings,
    ):
        self.role, self.replica_index, self.replica_size = role, replica_index, replica_size
        self.settings = settings
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        """The thread's loop and the event that wakes it for ``stop()`` (set once it runs)."""

    def start(self, wait_s: float = REDIS_STARTUP_WAIT_S) -> None:
        """Take the slot (waiting up to ``wait_s`` for Redis). Raises JobConflictError when
        another live job holds it, RegistryError when Redis cannot be reached."""
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._run(wait_s),), name="pyrsia-job-lease", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _run(self, wait_s: float) -> None:
        registry = Registry(self.settings)
        lease = registry.lease
        try:
            try:
                await registry.ping(wait_s=wait_s)
                await lease.claim(self.role, self.replica_index, self.replica_size)
            except (RedisError, OSError) as exc:
                raise unreachable_error(self.settings, exc, " to take this job's lease") from exc
        except RegistryError as exc:
            self._error = exc
            self._ready.set()
            await registry.close()
            return
        wake = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), wake)
        self._ready.set()
        healthy = True
        while not self._stopping.is_set():
            # asleep until the next heartbeat or stop(), whichever comes first
            with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError from 3.11
                await asyncio.wait_for(wake.wait(), registry.heartbeat_s)
            if self._stopping.is_set():
                break
            try:
                await lease.refresh(self.role, self.replica_index)
                healthy = True
            except (RedisError, OSError) as exc:
                if healthy:
                    log.warning("Redis unreachable, job lease not refreshed: %s", exc)
                healthy = False
        try:
            await asyncio.wait_for(
                lease.release(self.role, self.replica_index), DEREGISTER_TIMEOUT_S
            )
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            # Redis gone first (a Procfile's or run's shutdown): nothing to give back to, the
            # TTL ends the slot as designed; anything else is worth a warning
            (log.debug if redis_gone(exc) else log.warning)(
                "could not give back the job lease (its TTL ends it): %s", exc or "timeout"
            )
        await registry.close()

    def stop(self) -> None:
        """Give the slot back and end the thread (bounded; idempotent)."""
        self._stopping.set()
        if self._wake is not None:
            loop, wake = self._wake
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(wake.set)
        if self._thread is not None:
            self._thread.join(timeout=DEREGISTER_TIMEOUT_S + SLOT_KEEPER_JOIN_SLACK_S)


def take_job_slot(
    role: str, index: int, size: int, settings: RegistrySettings
) -> SlotKeeper | None:
    """This launcher's slot in the job lease (pyrsia/shared/job_lease.py), held until ``stop()``.

    A live job with this ``PERSIA_JOB_ID`` holding the slot is a UsageError (one line, exit
    2). Without a reachable Redis the launcher goes on without a lease, with a warning:
    its ranks (or script) report Redis themselves when they need it.
    """
    keeper = SlotKeeper(role, index, size, settings)
    try:
        keeper.start()
    except JobConflictError as exc:
        raise UsageError(str(exc)) from exc
    except RegistryError as exc:
        log.warning(
            "no job lease taken (%s): a second job with this %s is not detected", exc, ENV_JOB_ID
        )
        return None
    return keeper
