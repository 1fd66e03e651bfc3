"""Service discovery on Redis.

Each replica writes a small JSON record under ``pyrsia:<job>:svc:<role>:<index>`` with
a TTL and refreshes it from a heartbeat task, so a replica that dies leaves the
registry by itself. Because every heartbeat rewrites the record, a replica
re-registers on its own after Redis restarts. Lookups remember the last answer for
each role and fall back to it while Redis is down, so a Redis outage does not stop
a running job.

Where the registry lives and how its errors read: ``pyrsia.shared.registry_settings``
(``RegistrySettings`` and ``wait_timeout_s`` are imported from here too); a launcher whose
main thread runs the user's code holds its lease slot with ``pyrsia.shared.slot_keeper``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from pyrsia.shared.constants import (
    DEFAULT_WAIT_TIMEOUT_S,
    DEREGISTER_TIMEOUT_S,
    DISCOVERY_POLL_INTERVAL_S,
    ENV_JOB_ID,
    ENV_REDIS_URL,
    ENV_WAIT_TIMEOUT_S,
    HEARTBEAT_INTERVAL_S,
    MASTER_ADDR_TTL_S,
    REDIS_SOCKET_TIMEOUT_S,
    REGISTRATION_TTL_S,
    WAIT_REPORT_INTERVAL_S,
    master_addr_key,
    service_key,
    service_pattern,
)
from pyrsia.shared.errors import ConfigError, RegistryError
from pyrsia.shared.failure_report import started_by_hand
from pyrsia.shared.job_lease import JobLease
from pyrsia.shared.redaction import redact_url
from pyrsia.shared.registry_settings import (
    RegistrySettings,
    redis_fix,
    unreachable_error,
    wait_timeout_s,  # noqa: F401 - imported from here too
)

log = logging.getLogger(__name__)


class _WaitReport:
    """Says every WAIT_REPORT_INTERVAL_S what a wait still waits for, instead of silence."""

    def __init__(self, interval_s: float = WAIT_REPORT_INTERVAL_S):
        self.started = time.monotonic()
        self.interval_s = interval_s
        self._next = self.started + interval_s

    def due(self) -> float | None:
        """Seconds waited so far when a report is due now, else None."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.interval_s
        return now - self.started


def redis_gone(exc: BaseException) -> bool:
    """Redis refused the connection: it has stopped (the job's shutdown stops it too), and a
    record or slot left in it ends with its TTL; no reason for a warning."""
    return isinstance(exc, (RedisConnectionError, ConnectionRefusedError))


@dataclass(frozen=True)
class ServiceRecord:
    """One registered replica."""

    role: str
    replica_index: int
    replica_size: int
    address: str  # "host:port"
    pid: int = 0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ServiceRecord:
        data = json.loads(raw)
        return cls(
            role=str(data["role"]),
            replica_index=int(data["replica_index"]),
            replica_size=int(data["replica_size"]),
            address=str(data["address"]),
            pid=int(data.get("pid", 0)),
        )

    @property
    def url(self) -> str:
        return f"http://{self.address}"


class Registry:
    """A job's view of the Redis registry: register, discover, wait, publish."""

    def __init__(
        self,
        settings: RegistrySettings,
        *,
        ttl_s: float = REGISTRATION_TTL_S,
        heartbeat_s: float = HEARTBEAT_INTERVAL_S,
    ):
        self.settings = settings
        self.ttl_s = ttl_s
        self.heartbeat_s = heartbeat_s
        try:
            self._redis = aioredis.Redis.from_url(
                self.settings.redis_url,
                socket_timeout=REDIS_SOCKET_TIMEOUT_S,
                socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
                decode_responses=True,
            )
        except ValueError as exc:
            raise ConfigError(
                f"{ENV_REDIS_URL}: expected a redis:// URL, got {self.settings.display_url!r} "
                f"({redact_url(str(exc))})"
            ) from exc
        self.lease = JobLease(self._redis, self.settings.job_id, ttl_s=ttl_s)
        self._known: dict[str, dict[int, ServiceRecord]] = {}
        self._heartbeats: list[asyncio.Task] = []
        self._stopping = False  # set by deregister: the heartbeats end on it
        self._records: list[ServiceRecord] = []

    async def ping(self, wait_s: float = 0.0) -> None:
        """Raise RegistryError naming the URL when Redis cannot be reached within ``wait_s``.

        Services wait a little at start-up: under a Procfile, Redis starts alongside them.
        A refused password is not waited for: it will not become right.
        """
        if wait_s > 0:
            wait_s = self.settings.wait_timeout_s(wait_s)
        deadline = time.monotonic() + wait_s
        report = _WaitReport()
        while True:
            try:
                await self._redis.ping()
                return
            except (RedisError, OSError) as exc:
                refused = isinstance(exc, (AuthenticationError, ResponseError))
                if not refused and time.monotonic() < deadline:
                    waited = report.due()
                    if waited is not None:
                        log.info(
                            "waiting for Redis at %s: %.0f s of %.0f (%s)",
                            self.settings.display_url,
                            waited,
                            wait_s,
                            exc,
                        )
                    await asyncio.sleep(DISCOVERY_POLL_INTERVAL_S * 2)
                    continue
                error = exc
                break
        given = self.settings.url_given
        if not given and started_by_hand(self.settings.environment):
            raise RegistryError(
                f"started without the launcher, and no Redis answers at "
                f"{self.settings.display_url} ({ENV_REDIS_URL} is unset): start the job with "
                "persia-launcher run --nn-worker train.py --data-loader data_loader.py "
                "--embedding-config embedding_config.yml (it starts Redis and every service), "
                f"or set {ENV_REDIS_URL} to a running job's Redis"
            ) from error
        source = f"set by {ENV_REDIS_URL}" if given else f"the default; set {ENV_REDIS_URL}"
        raise RegistryError(
            f"cannot reach Redis at {self.settings.display_url} ({source}): {error}"
            f"{redis_fix(error)}"
        ) from error

    # --- registration -----------------------------------------------------------------
    async def register(self, record: ServiceRecord) -> None:
        """Take the record's slot in the job lease, write ``record`` now and keep refreshing
        both until ``close``/``deregister``.

        Raises :class:`pyrsia.shared.job_lease.JobConflictError` (a RegistryError) when a live
        process of another job with this ``PERSIA_JOB_ID`` holds the slot.
        """
        await self.ping()
        try:
            await self.lease.claim(record.role, record.replica_index, record.replica_size)
            await self._write(record)
        except (RedisError, OSError) as exc:
            raise unreachable_error(self.settings, exc) from exc
        self._records.append(record)
        self._stopping = False
        self._heartbeats.append(asyncio.create_task(self._heartbeat(record)))
        log.info("registered %s/%d at %s", record.role, record.replica_index, record.address)

    async def _write(self, record: ServiceRecord) -> None:
        key = service_key(self.settings.job_id, record.role, record.replica_index)
        await self._redis.set(key, record.to_json(), px=int(self.ttl_s * 1000))

    async def _heartbeat(self, record: ServiceRecord) -> None:
        healthy = True
        # The flag, not only the cancel, ends the loop: redis-py can swallow a cancellation
        # that lands inside a command while it reconnects after a Redis restart, and the
        # heartbeat then slept on forever, holding deregister() (seen ~1 run in 2 of
        # test_reregisters_after_redis_restart_and_keeps_addresses_during_outage).
        while not self._stopping:
            await asyncio.sleep(self.heartbeat_s)
            if self._stopping:
                return
            try:
                # a process whose slot another one took (it was not heard from for a TTL)
                # stops writing its record: the two would overwrite each other
                if not await self.lease.refresh(record.role, record.replica_index):
                    continue
                await self._write(record)
                if not healthy:
                    log.info(
                        "Redis is back: re-registered %s/%d", record.role, record.replica_index
                    )
                healthy = True
            except (RedisError, OSError) as exc:
                if healthy:
                    log.warning(
                        "Redis unreachable, heartbeat of %s/%d failing: %s",
                        record.role,
                        record.replica_index,
                        exc,
                    )
                healthy = False

    async def deregister(self) -> None:
        """Stop heartbeats and delete this process's records (best effort)."""
        self._stopping = True
        for task in self._heartbeats:
            task.cancel()
        await asyncio.gather(*self._heartbeats, return_exceptions=True)
        self._heartbeats.clear()
        for record in self._records:
            key = service_key(self.settings.job_id, record.role, record.replica_index)
            try:
                # bounded: when the whole job stops, Redis may already be gone, and the
                # client's own reconnect back-off would hold a stopping service for seconds
                await asyncio.wait_for(self._leave(record, key), DEREGISTER_TIMEOUT_S)
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                (log.debug if redis_gone(exc) else log.warning)(
                    "could not deregister %s (its TTL removes it): %s", key, exc or "timeout"
                )
        self._records.clear()

    async def _leave(self, record: ServiceRecord, key: str) -> None:
        await self._redis.delete(key)
        await self.lease.release(record.role, record.replica_index)

    async def close(self) -> None:
        await self.deregister()
        try:
            await self._redis.aclose()
        except (RedisError, OSError) as exc:
            log.warning("closing the Redis connection failed: %s", exc)

    # --- discovery --------------------------------------------------------------------
    async def discover(self, role: str) -> dict[int, ServiceRecord]:
        """Registered replicas of ``role`` by index; the last known ones if Redis is down."""
        try:
            keys = [
                k
                async for k in self._redis.scan_iter(
                    match=service_pattern(self.settings.job_id, role), count=1000
                )
            ]
            values = await self._redis.mget(keys) if keys else []
        except (RedisError, OSError) as exc:
            if role in self._known:
                log.warning("Redis unreachable (%s); using last known %s addresses", exc, role)
                return dict(self._known[role])
            raise unreachable_error(self.settings, exc, f" to find {role}") from exc
        found: dict[int, ServiceRecord] = {}
        for raw in values:
            if raw is None:
                continue
            try:
                rec = ServiceRecord.from_json(raw)
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed registry record for %s: %r", role, raw[:100])
                continue
            found[rec.replica_index] = rec
        self._known[role] = found
        return dict(found)

    async def wait_for(
        self, role: str, count: int | None = None, *, timeout_s: float = DEFAULT_WAIT_TIMEOUT_S
    ) -> list[ServiceRecord]:
        """Wait until replicas ``0..n-1`` of ``role`` are registered; return them in order.

        ``count=None`` takes n from the replicas' own ``replica_size``. Every few seconds
        it logs what it still waits for; on timeout the error names the role, the indices
        still missing and what to check. ``$PERSIA_WAIT_TIMEOUT_S`` replaces ``timeout_s``.
        """
        timeout_s = self.settings.wait_timeout_s(timeout_s)
        deadline = time.monotonic() + timeout_s
        report = _WaitReport()
        while True:
            found = await self.discover(role)
            expected = count
            if expected is None and found:
                expected = max(r.replica_size for r in found.values())
            if expected is not None and all(i in found for i in range(expected)):
                return [found[i] for i in range(expected)]
            if time.monotonic() >= deadline:
                if expected is None:
                    missing = "no replica registered at all"
                else:
                    idx = [i for i in range(expected) if i not in found]
                    missing = f"missing replica(s) {idx} of {expected}"
                raise RegistryError(
                    f"timed out after {timeout_s:.0f}s waiting for {role} in job "
                    f"'{self.settings.job_id}' at {self.settings.display_url}: {missing}; "
                    f"{self._never_registered_hint(role)}"
                )
            waited = report.due()
            if waited is not None:
                have = (
                    f"{sum(1 for i in range(expected) if i in found)} of {expected} registered"
                    if expected
                    else "none registered yet"
                )
                log.info(
                    "waiting for %s: %s, %.0f s (job '%s' at %s, timeout %.0f s)",
                    role,
                    have,
                    waited,
                    self.settings.job_id,
                    self.settings.display_url,
                    timeout_s,
                )
            await asyncio.sleep(DISCOVERY_POLL_INTERVAL_S)

    def _never_registered_hint(self, role: str) -> str:
        return (
            f"start it (persia-launcher {role.replace('_', '-')}) "
            f"with the same {ENV_REDIS_URL} and {ENV_JOB_ID}, or look at its log for why it "
            f"did not start ({ENV_WAIT_TIMEOUT_S} sets how long to wait)"
        )

    # --- small shared values ------------------------------------------------------------
    async def publish_master_addr(self, address: str, ttl_s: float = MASTER_ADDR_TTL_S) -> None:
        """Publish NN-worker rank 0's torch.distributed address for the other ranks."""
        try:
            await self._redis.set(
                master_addr_key(self.settings.job_id), address, px=int(ttl_s * 1000)
            )
        except (RedisError, OSError) as exc:
            raise unreachable_error(self.settings, exc, " to publish the master address") from exc

    async def get_master_addr(self) -> str | None:
        """The address rank 0 published, or None when it has not (yet)."""
        try:
            return await self._redis.get(master_addr_key(self.settings.job_id))
        except (RedisError, OSError) as exc:
            raise unreachable_error(self.settings, exc) from exc
