"""What every Pyrsia service's aiohttp app has in common.

``make_app`` builds an app with ``GET /health``, ``GET /metrics`` (Prometheus text),
the error middleware and request accounting; ``msgpack_handler`` turns
``async def f(request, body) -> dict`` into a route that speaks msgpack, and ``read_body``
is how any route reads its body. The middleware applies ``pyrsia.shared.http_body``'s limits to
every route but ``/health`` and ``/metrics``: a ``Content-Length`` over the cap is a 413
before the body is read, bodies held at once stay under ``PYRSIA_MAX_INFLIGHT_REQUEST_BYTES``
(503 + ``Retry-After`` beyond), and a client that hangs up or stalls mid-body is dropped
with one INFO line (``PYRSIA_BODY_TIMEOUT_S``); ``serve``
runs an app on uvloop until SIGTERM/SIGINT and then drains it: stop taking work
(new requests get 503), wait for in-flight requests up to a bound, run the app's
cleanup (which deregisters from Redis), exit.

The middlewares and the error answers are ``pyrsia.shared.http_middleware``'s; the app's
state (``ServiceState`` under ``STATE``, the registry under ``METRICS``) is
``pyrsia.shared.service_state``'s, imported here for the services.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client as prom
from aiohttp import web
from prometheus_client.core import CounterMetricFamily

from pyrsia.shared.auth import auth_token_from_env
from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import (
    ENV_MAX_MESSAGE_BYTES,
    INFLIGHT_BYTES_WAIT_S,
    MAX_MESSAGE_BYTES,
    MSGPACK_CONTENT_TYPE,
    SHUTDOWN_CANCEL_S,
    SHUTDOWN_GRACE_S,
)
from pyrsia.shared.errors import ConfigError, ServiceUnavailableError, UsageError
from pyrsia.shared.http_body import (
    InflightBytes,
    body_timeout_s,
    max_inflight_request_bytes,
    read_payload,
)
from pyrsia.shared.http_connections import ConnectionGuard, ConnectionLimits
from pyrsia.shared.http_middleware import (
    BODY_DROPPED,
    CHUNKED_HOLD,
    auth_middleware,
    error_middleware,
)
from pyrsia.shared.redaction import redact_value
from pyrsia.shared.service_state import METRICS, STATE, ServiceState
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)

CONNECTIONS = web.AppKey("pyrsia_connections", ConnectionGuard)

Handler = Callable[[web.Request, Any], Awaitable[Any]]


def msgpack_handler(func: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Wrap ``func(request, body)`` so it takes and returns msgpack bodies."""

    async def route(request: web.Request) -> web.Response:
        raw = await read_body(request)
        body = unpackb(raw, max_bytes=request.app[STATE].max_body_bytes) if raw else None
        del raw  # the decoded body is what the handler needs; let the raw one go first
        result = await func(request, body)
        if isinstance(result, web.StreamResponse):
            return result
        return web.Response(body=packb(result), content_type=MSGPACK_CONTENT_TYPE)

    route.__name__ = func.__name__
    route.__doc__ = func.__doc__
    return route


async def read_body(request: web.Request) -> bytes | bytearray:
    """The request's whole body, read under the service's limits (``pyrsia.shared.http_body``).

    Use it instead of ``request.read()``, which keeps a second copy of the body and lets
    aiohttp buffer up to twice the cap. A chunked body is counted against the in-flight
    bound as it arrives and cut at the cap (``PayloadTooLargeError``); a client that hangs
    up or stalls raises ``BodyAborted``, which the middleware logs as one INFO line.
    """
    state = request.app[STATE]
    chunked = request.get(CHUNKED_HOLD)
    try:
        return await read_payload(
            request.content,
            length=request.content_length,
            cap=state.max_body_bytes,
            timeout_s=state.body_timeout_s,
            charge=state.inflight_bytes if chunked is not None else None,
            charged=chunked,
            wait_s=INFLIGHT_BYTES_WAIT_S,
        )
    except (ConnectionResetError, TimeoutError) as exc:
        # the client's problem, not ours: one INFO line, no traceback, and the request is
        # dropped (a timed-out client is disconnected; no answer could reach either)
        reason = "timeout" if isinstance(exc, TimeoutError) else "disconnect"
        state.aborted[reason] += 1
        request[BODY_DROPPED] = True
        log.info(
            "%s %s from %s: %s; request dropped", request.method, request.path, request.remote, exc
        )
        if request.transport is not None:
            request.transport.close()
        raise ConnectionResetError(str(exc)) from None


def require_ready(request: web.Request) -> None:
    """Raise 503 naming the reason when the service is not ready for work."""
    state = request.app[STATE]
    if not state.ready:
        raise ServiceUnavailableError(f"{state.name} is not ready: {state.reason}")


async def _health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = {
        "service": state.name,
        "ready": state.ready and not state.draining,
        "reason": "shutting down" if state.draining else state.reason,
        **state.details,
    }
    status = 200 if body["ready"] else 503
    # /health answers without a token: a reason quoting the Redis URL must not show its password
    return web.json_response(redact_value(body), status=status)


async def _metrics(request: web.Request) -> web.Response:
    payload = prom.generate_latest(request.app[METRICS])
    request.app[STATE].scraped.set()  # the counters are read: stopping now loses nothing
    return web.Response(body=payload, headers={"Content-Type": prom.CONTENT_TYPE_LATEST})


def max_message_bytes(settings: Settings) -> int:
    """The body size cap: ``PYRSIA_MAX_MESSAGE_BYTES`` of ``settings`` if set, else ``MAX_MESSAGE_BYTES``."""
    raw = settings.text(ENV_MAX_MESSAGE_BYTES)
    if not raw:
        return MAX_MESSAGE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{ENV_MAX_MESSAGE_BYTES}: expected a positive integer, got {raw!r}")
    return value


_FROM_ENV = "from the environment"


def make_app(
    name: str,
    *,
    client_max_size: int | None = None,
    auth_token: str | None = _FROM_ENV,
    settings: Settings,
) -> web.Application:
    """An aiohttp app with health, metrics, error handling and drain support.

    ``client_max_size`` caps request bodies (413 beyond; default ``max_message_bytes()``);
    ``PYRSIA_MAX_INFLIGHT_REQUEST_BYTES`` bounds the bodies held at once and
    ``PYRSIA_BODY_TIMEOUT_S`` the gaps in one (``pyrsia.shared.http_body``; a bad value is a
    ``ConfigError`` naming the variable).
    ``auth_token`` (default: ``PERSIA_AUTH_TOKEN``) makes every route require it (401).
    ``PYRSIA_HEADER_TIMEOUT_S``, ``PYRSIA_IDLE_TIMEOUT_S`` and ``PYRSIA_MAX_CONNECTIONS``
    bound the connections ``serve`` holds (``pyrsia.shared.http_connections``).
    Every variable is read from ``settings``, the process's, passed down from its entry point.
    """
    client_max_size = client_max_size or max_message_bytes(settings)
    inflight = InflightBytes(max_inflight_request_bytes(client_max_size, settings))
    timeout_s = body_timeout_s(settings)
    guard = ConnectionGuard(ConnectionLimits.from_env(settings))
    if auth_token is _FROM_ENV:
        auth_token = auth_token_from_env(settings)
    middlewares = [guard.middleware(), error_middleware]
    if auth_token is not None:
        middlewares.insert(1, auth_middleware(auth_token))
    app = web.Application(middlewares=middlewares, client_max_size=client_max_size)
    state = ServiceState(
        name=name,
        max_body_bytes=client_max_size,
        inflight_bytes=inflight,
        body_timeout_s=timeout_s,
    )
    state.idle.set()
    app[STATE] = state
    app[CONNECTIONS] = guard
    app[METRICS] = _body_metrics(state, prom.CollectorRegistry())
    guard.register_metrics(app[METRICS])
    # process_resident_memory_bytes, process_start_time_seconds, process_cpu_seconds_total:
    # read from /proc at scrape time (memory and uptime in `persia-launcher status`)
    prom.ProcessCollector(registry=app[METRICS])
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


class _CountsCollector:
    """Prometheus counters read from ``ServiceState``'s plain dicts at scrape time (no
    per-request cost on the hot path)."""

    def __init__(self, state: ServiceState):
        self.state = state

    def collect(self) -> list[CounterMetricFamily]:
        refused = CounterMetricFamily(
            "pyrsia_requests_refused",
            "requests refused before their body was read, by reason (too_large: "
            "Content-Length over the cap; inflight_bytes: no room under the in-flight bound)",
            labels=["reason"],
        )
        for reason, n in self.state.refused.items():
            refused.add_metric([reason], n)
        aborted = CounterMetricFamily(
            "pyrsia_request_bodies_aborted",
            "request bodies that never arrived in full, by reason (disconnect, timeout)",
            labels=["reason"],
        )
        for reason, n in self.state.aborted.items():
            aborted.add_metric([reason], n)
        return [refused, aborted]


def _body_metrics(state: ServiceState, registry: prom.CollectorRegistry) -> prom.CollectorRegistry:
    """The request-body gauges and counters every service exports, read at scrape time."""
    budget = state.inflight_bytes
    prom.Gauge(
        "pyrsia_request_bytes_held",
        "request-body bytes held now (reserved from Content-Length, or as chunks arrive)",
        registry=registry,
    ).set_function(lambda: budget.held)
    prom.Gauge(
        "pyrsia_request_bytes_held_peak",
        "most request-body bytes held at once since the service started",
        registry=registry,
    ).set_function(lambda: budget.peak)
    prom.Gauge(
        "pyrsia_request_bytes_held_limit",
        "bound on request-body bytes held at once (PYRSIA_MAX_INFLIGHT_REQUEST_BYTES)",
        registry=registry,
    ).set_function(lambda: budget.limit)
    registry.register(_CountsCollector(state))
    return registry


def install_uvloop() -> None:
    """Use uvloop's event loop policy when it is installed (it is a dependency on Linux)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def listen(runner: web.AppRunner, host: str, port: int) -> tuple[asyncio.Server, int]:
    """Listen on ``host:port`` for ``runner``'s app (set up); return the server and its port.

    Used instead of ``web.TCPSite``: every connection goes through the app's
    ``ConnectionGuard`` (a head deadline, an idle deadline and the service's bound,
    ``pyrsia.shared.http_connections``). Close the server before ``runner.cleanup()``.
    A port another process holds is a UsageError.
    """
    factory = runner.app[CONNECTIONS].protocol_factory(runner.server)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(factory, host, port, reuse_address=True)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise UsageError(  # one line and exit 2 (pyrsia/shared/failure_report.py)
            f"port {port} on {host} is already in use by another process: stop that process, "
            "or pick a free port (--port 0 lets the system choose one)"
        ) from exc
    return listener, listener.sockets[0].getsockname()[1]


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_started: Callable[[int], Awaitable[None]] | None = None,
    grace_s: float = SHUTDOWN_GRACE_S,
) -> None:
    """Run ``app`` until SIGTERM/SIGINT, then drain it and clean up.

    ``on_started(port)`` runs once the socket is bound (``port=0`` picks a free port);
    it is where a service registers itself. Cleanup contexts run last, so a service
    deregisters only after its in-flight work is done.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # shutdown_timeout: aiohttp's default (60 s) would wait that long for a handler still
    # running after our drain, far past the SIGKILL of honcho / docker compose.
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_CANCEL_S
    )
    await runner.setup()
    listener: asyncio.Server | None = None
    try:
        listener, bound = await listen(runner, host, port)
        log.info("%s listening on %s:%d", app[STATE].name, host, bound)
        if on_started is not None:
            await on_started(bound)
        await stop.wait()
        log.info("%s: signal received, draining", app[STATE].name)
        await drain(app, grace_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if listener is not None:
            listener.close()
        await runner.cleanup()
    log.info("%s stopped", app[STATE].name)


async def drain(app: web.Application, grace_s: float) -> None:
    """Refuse new work and wait (at most ``grace_s``) for in-flight requests to end."""
    state = app[STATE]
    state.draining = True
    start = time.monotonic()
    try:
        await asyncio.wait_for(state.idle.wait(), timeout=grace_s)
    except asyncio.TimeoutError:
        log.warning(
            "%s: %d requests still running after %.1fs; cancelling them",
            state.name,
            state.inflight,
            grace_s,
        )
        # ours to cancel, bounded: aiohttp's own shutdown would wait whole seconds per
        # connection (its timeouts round up), past the supervisor's SIGKILL
        pending = list(state.handlers)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=SHUTDOWN_CANCEL_S)
    else:
        log.info("%s drained in %.2fs", state.name, time.monotonic() - start)
