"""The one HTTP client of a process: pooled, time-limited, retrying, msgpack-speaking.

``HttpClient.call(url, body)`` posts a msgpack body and returns the decoded answer.
Every call has a timeout; idempotent calls are retried with exponential backoff on
connection failures, timeouts and 503; ``until`` makes a call keep retrying 429
(back-pressure) until a deadline. Failures surface as the project's exceptions
(``pyrsia.shared.errors``): no aiohttp exception leaves this module.

A peer that does not answer is never silent in the log: once an attempt has had no
answer for a quarter of its timeout (at least ``stall_report_s``, 5 s by default, and at
most 30 s, so a first lookup compiling its kernels or a long checkpoint write is not
reported as a stall) a warning names the URL and the seconds waited, again every
``stall_report_s`` (one line per URL, however many requests wait on it), and the retry after such an attempt is a warning
naming the URL and the seconds since the call began (a quick refusal or 503, a peer
restarting, is retried quietly as before). On a pulled cable TCP retransmits
into the dead link and nothing fails before the request's own deadline (60 s by default),
so without these lines a partition looks like an idle job.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from typing import Any

import aiohttp

from pyrsia.shared.auth import AUTH_HEADER, auth_header_value
from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import (
    BACKPRESSURE_BACKOFF_MAX_S,
    BACKPRESSURE_BACKOFF_S,
    CONNECT_TIMEOUT_S,
    CONNECTION_POOL_LIMIT,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_RETRIES,
    HTTP_DNS_CACHE_TTL_S,
    MSGPACK_CONTENT_TYPE,
    RETRY_BACKOFF_MAX_S,
    RETRY_BACKOFF_S,
    STALL_FIRST_REPORT_MAX_S,
    STALL_REPORT_S,
)
from pyrsia.shared.errors import (
    AuthError,
    InvalidInputError,
    PayloadTooLargeError,
    PersiaError,
    ProtocolError,
    RemoteBackPressureError,
    RemoteBadRequestError,
    RemoteConflictError,
    RemoteError,
    RemoteNotFoundError,
    ServiceUnavailableError,
)
from pyrsia.shared.http_conn import ConnectionPool

log = logging.getLogger(__name__)


_BY_STATUS: dict[int, type[RemoteError]] = {
    400: RemoteBadRequestError,
    401: AuthError,
    404: RemoteNotFoundError,
    409: RemoteConflictError,
    429: RemoteBackPressureError,
}


def _remote_error(url: str, status: int, raw: bytes) -> PersiaError:
    try:
        body = unpackb(raw) if raw else {}
        if not isinstance(body, dict):
            body = {}
    except ProtocolError:
        body = {"message": raw[:200].decode("utf-8", "replace")}
    message = f"{url} answered {status}: {body.get('message', '')}".rstrip(": ")
    if status == ServiceUnavailableError.status:
        return ServiceUnavailableError(message)
    if status == PayloadTooLargeError.status:
        return PayloadTooLargeError(message, body=body)
    return _BY_STATUS.get(status, RemoteError)(message, peer_status=status, body=body)


class HttpClient:
    """A pooled aiohttp session bound to the running event loop, created lazily.

    ``auth_token`` (the job's ``PERSIA_AUTH_TOKEN``, which the entry point reads from its
    settings; None: no token) is sent as ``Authorization: Bearer <token>`` on every request. Plain ``http://`` calls go
    through ``pyrsia.shared.http_conn``'s lean keep-alive pool (``lean=False``: through aiohttp,
    like every other URL).
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        pool_limit: int = CONNECTION_POOL_LIMIT,
        auth_token: str | None = None,
        lean: bool = True,
        stall_report_s: float = STALL_REPORT_S,
    ):
        """``stall_report_s``: the period of the warning an unanswered attempt logs."""
        if not stall_report_s > 0:
            raise InvalidInputError("stall_report_s", "seconds > 0", stall_report_s)
        self.stall_report_s = stall_report_s
        self._stalls = _StallWatch(stall_report_s)
        self.timeout_s = timeout_s
        self.lean = lean  # False: every call through aiohttp (a benchmark's baseline client)
        self.retries = retries
        self._pool_limit = pool_limit
        self._session: aiohttp.ClientSession | None = None
        self._pool: ConnectionPool | None = None  # plain http: pyrsia.shared.http_conn
        token = auth_token
        self._headers = {"Content-Type": MSGPACK_CONTENT_TYPE}
        if token is not None:
            self._headers[AUTH_HEADER] = auth_header_value(token)

    def _get_pool(self) -> ConnectionPool:
        if self._pool is None or self._pool.closed:
            self._pool = ConnectionPool(self._pool_limit, self._headers)
        return self._pool

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._pool_limit, ttl_dns_cache=HTTP_DNS_CACHE_TTL_S
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S),
                headers=self._headers,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
        if self._pool is not None:
            self._pool.close()
        self._pool = None

    async def _once_lean(self, method: str, url: str, data: bytes | None, timeout_s: float) -> Any:
        """``_once`` through the lean keep-alive pool (plain http to Pyrsia's own servers)."""
        try:
            status, content_type, raw = await self._get_pool().request(method, url, data, timeout_s)
        except asyncio.TimeoutError as exc:
            raise ServiceUnavailableError(f"{url} did not answer within {timeout_s:.1f}s") from exc
        except (OSError, ValueError, ProtocolError) as exc:
            raise ServiceUnavailableError(f"cannot reach {url}: {exc}") from exc
        if status >= 400:
            raise _remote_error(url, status, raw)
        if content_type == "application/json":
            return json.loads(raw)
        return unpackb(raw) if raw else None

    async def _once(self, method: str, url: str, data: bytes | None, timeout_s: float) -> Any:
        if self.lean and url.startswith("http://") and method != "HEAD":
            return await self._once_lean(method, url, data, timeout_s)
        session = self._get_session()
        try:
            async with session.request(
                method, url, data=data, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _remote_error(url, resp.status, raw)
                if resp.content_type == "application/json":
                    return json.loads(raw)
                return unpackb(raw) if raw else None
        except PersiaError:
            raise
        except asyncio.TimeoutError as exc:
            raise ServiceUnavailableError(f"{url} did not answer within {timeout_s:.1f}s") from exc
        except aiohttp.ClientError as exc:
            raise ServiceUnavailableError(f"cannot reach {url}: {exc}") from exc

    async def call(
        self,
        url: str,
        body: Any = None,
        *,
        method: str = "POST",
        idempotent: bool = False,
        timeout_s: float | None = None,
        retries: int | None = None,
        until: float | None = None,
        encoded: bytes | None = None,
    ) -> Any:
        """Send ``body`` (msgpack-encoded) to ``url`` and return the decoded answer.

        ``idempotent`` calls are retried ``retries`` times on unreachable peers,
        timeouts and 503. With ``until`` (a ``time.monotonic()`` deadline) a 429 is
        retried with backoff until the deadline instead of raised at once.
        """
        data = encoded if encoded is not None else (None if body is None else packb(body))
        timeout = self.timeout_s if timeout_s is None else timeout_s
        attempts_left = (self.retries if retries is None else retries) if idempotent else 0
        backoff = RETRY_BACKOFF_S
        pressure_backoff = BACKPRESSURE_BACKOFF_S
        loop = asyncio.get_running_loop()
        began = loop.time()
        watch = self._stalls
        while True:
            attempt = watch.begin(loop, url, timeout)
            try:
                return await self._once(method, url, data, timeout)
            except RemoteBackPressureError:
                watch.end(attempt)  # answered: not silent, and no report during the backoff
                if until is None or time.monotonic() >= until:
                    raise
                await asyncio.sleep(pressure_backoff * (0.5 + random.random()))
                pressure_backoff = min(pressure_backoff * 2, BACKPRESSURE_BACKOFF_MAX_S)
            except ServiceUnavailableError as exc:
                waited = watch.end(attempt)
                if attempts_left <= 0:
                    raise
                attempts_left -= 1
                # an attempt that outlived a stall report is a silent peer: say so; a quick
                # refusal or 503 (a peer restarting, not ready yet) is retried quietly
                log.log(
                    logging.WARNING if waited >= self.stall_report_s else logging.DEBUG,
                    "%s; retrying, %.1f s since the call began (%d %s left)",
                    exc,
                    loop.time() - began,
                    attempts_left + 1,
                    "attempt" if attempts_left == 0 else "attempts",
                )
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
            finally:
                watch.end(attempt)


class _StallWatch:
    """A client's attempts awaiting an answer, and one timer that reports the silent ones.

    An attempt costs a dict insert and a pop, not a timer of its own: while any attempt is
    open, one timer ticks every ``period / TICKS`` and logs, once per URL, the attempts
    whose report is due (first after a quarter of the timeout, at least ``period`` and at
    most ``FIRST_REPORT_MAX_S``; then every ``period``); with none open there is no timer.
    """

    TICKS = 5
    FIRST_REPORT_MAX_S = STALL_FIRST_REPORT_MAX_S

    def __init__(self, period: float):
        self.period = period
        self.open: dict[int, list] = {}  # attempt -> [url, started, timeout, next report]
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, loop: asyncio.AbstractEventLoop, url: str, timeout: float) -> int:
        """Open an attempt to ``url``; its key for :meth:`end`."""
        if loop is not self._loop:  # a new event loop: the old one's attempts cannot go on
            self.open.clear()
            self._loop, self._timer = loop, None
        key = next(self._ids)
        now = loop.time()
        first = max(self.period, min(timeout / 4, self.FIRST_REPORT_MAX_S))
        self.open[key] = [url, now, timeout, now + first]
        if self._timer is None:
            self._timer = loop.call_at(now + self.period / self.TICKS, self._tick)
        return key

    def end(self, key: int) -> float:
        """Close attempt ``key`` (again: no-op); the seconds it waited (0 when closed before)."""
        entry = self.open.pop(key, None)
        if entry is None or self._loop is None:
            return 0.0
        return self._loop.time() - entry[1]

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        due: dict[str, list] = {}  # url -> [longest wait, its timeout, attempts waiting]
        for entry in self.open.values():
            if now >= entry[3]:
                url, started, timeout, _ = entry
                seen = due.setdefault(url, [0.0, timeout, 0])
                if now - started > seen[0]:
                    seen[0], seen[1] = now - started, timeout
                seen[2] += 1
                entry[3] += self.period
        for url, (waited, timeout, count) in due.items():
            log.warning(
                "no answer from %s for %.1f s (the attempt times out at %g s)%s",
                url,
                waited,
                timeout,
                f"; {count} requests waiting" if count > 1 else "",
            )
        self._timer = (
            loop.call_at(now + self.period / self.TICKS, self._tick) if self.open else None
        )
