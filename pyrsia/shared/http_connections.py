"""The connections a service holds: a deadline for every request head, and a bound on them all.

aiohttp reads a request's body under our timeout (``pyrsia.shared.http_body``), but nothing
bounds how long a client may take to send the request line and headers, nor how many
connections one process holds: a client that sends one byte and stalls keeps a socket and a
file descriptor for ever, and a thousand of them exhaust the process's file limit before any
token is checked. :class:`ConnectionGuard` wraps aiohttp's protocol factory and keeps, per
connection, one timer::

    accepted ──► waiting for a head ──(head parsed, handler runs)──► in a request
        ▲             │ header_timeout_s                                   │
        │             ▼                                                    ▼
        │          closed ◄──── idle_timeout_s ──── idle (keep-alive) ◄── answered
        └──────────── (first byte of the next request: waiting for a head again)

A connection waiting for its head longer than ``header_timeout_s`` (from its first byte, or
from the accept) is closed, and so is a keep-alive connection idle longer than
``idle_timeout_s``; a request being handled has no deadline here (its body has its own).
At ``max_connections``, a new connection evicts the connection that has waited longest
outside a request; when every connection is inside a request, the new one gets 503 and is
closed. Pyrsia's own client sends a request again once on a fresh connection when the
server has closed an idle one, so eviction costs it nothing.

The values come from ``PYRSIA_HEADER_TIMEOUT_S``, ``PYRSIA_IDLE_TIMEOUT_S`` and
``PYRSIA_MAX_CONNECTIONS`` (the servers' ``--header-timeout-s``, ``--idle-timeout-s`` and
``--max-connections`` set them); a bad value is a ``ConfigError`` naming the variable.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import prometheus_client as prom
from aiohttp import web
from prometheus_client.core import CounterMetricFamily

from pyrsia.shared.constants import (
    ENV_HEADER_TIMEOUT_S,
    ENV_IDLE_TIMEOUT_S,
    ENV_MAX_CONNECTIONS,
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS_CAP,
)
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)

_CLOSE_REASONS = ("header_timeout", "idle_timeout", "evicted", "refused")
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 31\r\nConnection: close\r\n\r\ntoo many connections; try again"
)


def default_max_connections() -> int:
    """Half the process's soft file-descriptor limit (the rest is for Redis, peers, files),
    at most ``MAX_CONNECTIONS_CAP``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return MAX_CONNECTIONS_CAP
    return max(16, min(MAX_CONNECTIONS_CAP, soft // 2))


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a request head and an idle connection may take, and how many connections."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS_CAP

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "idle_timeout_s", "max_connections"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: expected a positive value, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, settings: Settings) -> ConnectionLimits:
        """The limits from ``settings``, each defaulting as the
        module docstring says."""
        header = settings.positive(ENV_HEADER_TIMEOUT_S, float)
        idle = settings.positive(ENV_IDLE_TIMEOUT_S, float)
        most = settings.positive(ENV_MAX_CONNECTIONS, int, "")
        return cls(
            header_timeout_s=HEADER_TIMEOUT_S if header is None else float(header),
            idle_timeout_s=IDLE_TIMEOUT_S if idle is None else float(idle),
            max_connections=default_max_connections() if most is None else int(most),
        )


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's timer around it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.waiting_head = False
        self.requests = 0
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.guard.admit(self):
            transport.write(_REFUSAL)  # type: ignore[attr-defined]
            transport.close()
            return
        self.admitted = True
        self.inner.connection_made(transport)
        self.expect_head()

    def data_received(self, data: bytes) -> None:
        if self.requests == 0 and not self.waiting_head:
            self.expect_head()
        if self.admitted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_timer()
        if self.admitted:
            self.guard.forget(self)
            self.inner.connection_lost(exc)

    # --- the timer ---------------------------------------------------------------------

    def expect_head(self) -> None:
        self.waiting_head = True
        self.arm(self.guard.limits.header_timeout_s, "header_timeout")

    def arm(self, delay_s: float, reason: str) -> None:
        self.cancel_timer()
        self.guard.waiting.pop(self, None)
        self.guard.waiting[self] = None  # last in the eviction order
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(delay_s, self.guard.close, self, reason)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class ConnectionGuard:
    """Every connection of one service: their deadlines, their number, and what was closed."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.open: dict[Any, _Guarded] = {}
        """By transport, every admitted connection still open."""
        self.waiting: dict[_Guarded, None] = {}
        """Connections outside a request, longest waiting first (the eviction order)."""
        self.closed: dict[str, int] = dict.fromkeys(_CLOSE_REASONS, 0)
        self.peak = 0

    def protocol_factory(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """Wrap aiohttp's protocol factory (``AppRunner.server``) for ``loop.create_server``."""
        return lambda: _Guarded(self, factory())

    def admit(self, conn: _Guarded) -> bool:
        """Take ``conn`` in, evicting the longest-waiting idle one at the bound; ``False``
        when every connection is inside a request (the caller answers 503)."""
        if len(self.open) >= self.limits.max_connections:
            if not self.waiting:
                self.closed["refused"] += 1
                return False
            self.close(next(iter(self.waiting)), "evicted")
        self.open[conn.transport] = conn
        self.peak = max(self.peak, len(self.open))
        return True

    def close(self, conn: _Guarded, reason: str) -> None:
        """Close ``conn`` (its head or idle deadline passed, or it is evicted)."""
        if conn.requests or conn.transport is None:
            return
        self.closed[reason] += 1
        self.forget(conn)
        conn.cancel_timer()
        log.debug("closing a connection from %s: %s", _peer(conn.transport), reason)
        conn.transport.close()

    def forget(self, conn: _Guarded) -> None:
        self.open.pop(conn.transport, None)
        self.waiting.pop(conn, None)

    def middleware(self) -> Callable[..., Awaitable[Any]]:
        """The app's outermost middleware: it tells the guard when a request runs."""

        @web.middleware
        async def connection_middleware(
            request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
        ) -> Any:
            return await self.handle(request, handler)

        return connection_middleware

    async def handle(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> Any:
        """Mark the connection as inside a request while ``handler`` runs (no deadline), and
        idle (``idle_timeout_s``) after it."""
        conn = self.open.get(request.transport)
        if conn is None:  # a test server without the guard, or a connection already closed
            return await handler(request)
        conn.requests += 1
        conn.waiting_head = False
        conn.cancel_timer()
        self.waiting.pop(conn, None)
        try:
            return await handler(request)
        finally:
            conn.requests -= 1
            if conn.requests == 0 and request.transport in self.open:
                conn.arm(self.limits.idle_timeout_s, "idle_timeout")

    def register_metrics(self, registry: prom.CollectorRegistry) -> None:
        """``pyrsia_connections_open``/``_peak``/``_limit`` and ``pyrsia_connections_closed``."""
        prom.Gauge(
            "pyrsia_connections_open", "client connections open now", registry=registry
        ).set_function(lambda: len(self.open))
        prom.Gauge(
            "pyrsia_connections_open_peak",
            "most client connections open at once",
            registry=registry,
        ).set_function(lambda: self.peak)
        prom.Gauge(
            "pyrsia_connections_limit",
            "bound on client connections (PYRSIA_MAX_CONNECTIONS)",
            registry=registry,
        ).set_function(lambda: self.limits.max_connections)
        registry.register(_ClosedCollector(self))


class _ClosedCollector:
    def __init__(self, guard: ConnectionGuard):
        self.guard = guard

    def collect(self) -> list[CounterMetricFamily]:
        family = CounterMetricFamily(
            "pyrsia_connections_closed",
            "connections the server closed, by reason (header_timeout, idle_timeout, evicted "
            "at the bound, refused with 503 at the bound)",
            labels=["reason"],
        )
        for reason, n in self.guard.closed.items():
            family.add_metric([reason], n)
        return [family]


def _peer(transport: Any) -> Any:
    try:
        return transport.get_extra_info("peername")
    except Exception:  # noqa: BLE001 - only for a debug line
        return None
