"""Request bodies: how many bytes a service holds at once, and how one body is read.

A service bounds the request bodies it holds in three ways (``pyrsia.shared.http_server`` applies
them to every route but ``/health`` and ``/metrics``):

- **one body**: a ``Content-Length`` over the per-request cap (``PYRSIA_MAX_MESSAGE_BYTES``)
  is answered 413 before a byte of the body is read; a chunked body is counted as it
  arrives and cut with a 413 once it passes the cap.
- **all bodies at once**: :class:`InflightBytes` reserves a body's ``Content-Length``
  before the body is read and gives it back once the answer is made (the decoded body lives
  until then); a chunked body reserves each chunk as it comes. A request that does not fit
  under the bound (``PYRSIA_MAX_INFLIGHT_REQUEST_BYTES``) waits up to
  ``INFLIGHT_BYTES_WAIT_S`` for room, in arrival order, then gets 503 with ``Retry-After``.
  The bound is at least one cap, so a single body under the cap is always admitted once
  the bodies before it are done: no deadlock.
- **time**: :func:`read_payload` disconnects a client whose body has a gap of more than
  ``PYRSIA_BODY_TIMEOUT_S`` (30 s) or, past its first ``PYRSIA_BODY_TIMEOUT_S``, arrives at
  under ``BODY_MIN_RATE`` (1 MiB/s) on average, so a stalled or trickling client cannot keep
  its reservation. Such a body raises ``TimeoutError``, one whose client hung up
  ``ConnectionResetError``; ``pyrsia.shared.http_server.read_body`` turns both into one INFO line
  and a dropped request.

A body that has fully arrived with its headers (nearly every Pyrsia request) is taken from
aiohttp's buffer as is, with no timer and no copy. A larger one is read into one buffer of
its ``Content-Length``, which the decoder reads in place: memory per body is its size plus
what decoding makes of it, not aiohttp's ``read()`` (a growing buffer, then a ``bytes``
copy of it, with the stream's pause threshold raised to the cap).
"""

from __future__ import annotations

import asyncio
import collections
import os
from pathlib import Path

from aiohttp import StreamReader
from aiohttp.http_exceptions import HttpProcessingError

from pyrsia.shared.constants import (
    BODY_MIN_RATE,
    BODY_TIMEOUT_S,
    ENV_BODY_TIMEOUT_S,
    ENV_MAX_INFLIGHT_REQUEST_BYTES,
    ENV_MAX_MESSAGE_BYTES,
    INFLIGHT_BYTES_CAPS,
    INFLIGHT_BYTES_MEMORY_SHARE,
    INFLIGHT_BYTES_RETRY_AFTER_S,
)
from pyrsia.shared.errors import (
    ConfigError,
    InvalidInputError,
    PayloadTooLargeError,
    ProtocolError,
    ServiceUnavailableError,
)
from pyrsia.shared.settings import Settings

_CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


class InflightBytes:
    """Request-body bytes held at once, at most ``limit``; waiters are served in order.

    ``take`` reserves bytes (waiting at most ``wait_s`` for room, then a
    ``ServiceUnavailableError`` whose ``retry_after_s`` the server sends as ``Retry-After``),
    ``give`` returns them. ``held`` and ``peak`` feed the
    ``pyrsia_request_bytes_held`` gauges. First come, first served: a large body waiting for
    room is not overtaken for ever by small ones.
    """

    def __init__(self, limit: int):
        if limit <= 0:
            raise InvalidInputError("limit", "a positive number of bytes", limit)
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def take_now(self, n: int) -> bool:
        """Reserve ``n`` bytes if they fit now and nobody is waiting before us."""
        if self._waiting or self.held + n > self.limit:
            return False
        self.held += n
        if self.held > self.peak:
            self.peak = self.held
        return True

    async def take(self, n: int, wait_s: float) -> None:
        """Reserve ``n`` bytes, waiting at most ``wait_s`` for room (else 503)."""
        if self.take_now(n):
            return
        if n > self.limit:
            raise self._full(n)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((n, waiter))
        try:
            async with asyncio.timeout(wait_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.give(n)  # granted just as we gave up: hand it on
            else:
                waiter.cancel()
                self._grant()  # we may have been the head blocking others
            if isinstance(exc, TimeoutError):
                raise self._full(n) from None
            raise

    def give(self, n: int) -> None:
        """Return ``n`` reserved bytes and admit the waiters that now fit."""
        self.held -= n
        if self._waiting:
            self._grant()

    def _grant(self) -> None:
        while self._waiting:
            n, waiter = self._waiting[0]
            if waiter.done():
                self._waiting.popleft()
                continue
            if self.held + n > self.limit:
                return
            self._waiting.popleft()
            self.held += n
            if self.held > self.peak:
                self.peak = self.held
            waiter.set_result(None)

    def _full(self, n: int) -> ServiceUnavailableError:
        exc = ServiceUnavailableError(
            f"{self.held} request bytes already held; this body's {n} more would pass the "
            f"{self.limit}-byte bound ({ENV_MAX_INFLIGHT_REQUEST_BYTES}); retry shortly"
        )
        exc.retry_after_s = INFLIGHT_BYTES_RETRY_AFTER_S  # type: ignore[attr-defined]
        return exc


async def read_payload(
    payload: StreamReader,
    *,
    length: int | None,
    cap: int,
    timeout_s: float,
    charge: InflightBytes | None = None,
    charged: list[int] | None = None,
    wait_s: float = 0.0,
) -> bytes | bytearray:
    """The whole body of a request whose headers said ``Content-Length: length`` (``None``:
    chunked), read under the limits above.

    A body already in aiohttp's buffer is returned as is. Otherwise: a ``Content-Length``
    body (reserved by the caller) is read into one preallocated buffer; a chunked body grows
    a buffer, reserving each chunk from ``charge`` (if given; ``charged[0]`` counts what it
    holds, for the caller to give back) and cut at ``cap`` (``PayloadTooLargeError``).
    Raises ``ConnectionResetError`` when the client hangs up, ``TimeoutError`` when it stalls
    or trickles (see the module docstring; the message says how far the body got), and
    ``ProtocolError`` on a malformed chunked encoding.
    """
    _refuse_over_cap(length, cap)
    got = 0
    try:
        if payload.is_eof():  # all of it arrived with the headers: no timer, no copy
            data = payload.read_nowait()
            _refuse_over_cap(len(data), cap)
            return data
        loop = asyncio.get_running_loop()
        start = loop.time()
        buf = bytearray(length) if length is not None else bytearray()
        view = memoryview(buf) if length is not None else None
        async with asyncio.timeout_at(start + timeout_s) as clock:
            while True:
                chunk = await payload.readany()
                if not chunk:
                    break
                n = len(chunk)
                if view is not None:
                    if got + n > length:  # the parser stops at Content-Length; be sure
                        raise ProtocolError("body is longer than its Content-Length")
                    view[got : got + n] = chunk
                else:
                    if got + n > cap:
                        raise PayloadTooLargeError(_over_cap(cap), limit=cap)
                    if charge is not None and charged is not None:
                        await charge.take(n, wait_s)
                        charged[0] += n
                    buf += chunk
                got += n
                last = loop.time()
                clock.reschedule(min(last + timeout_s, start + timeout_s + got / BODY_MIN_RATE))
        if view is not None:
            view.release()
            if got != length:
                raise ProtocolError(f"body has {got} bytes, its Content-Length says {length}")
        return buf
    except (TimeoutError, ConnectionError, HttpProcessingError) as exc:
        raise _read_error(exc, got, length, timeout_s) from None


def _over_cap(cap: int) -> str:
    return f"request body is over the {cap}-byte cap ({ENV_MAX_MESSAGE_BYTES})"


def _refuse_over_cap(size: int | None, cap: int) -> None:
    """Raise ``PayloadTooLargeError`` when a known body size is over the per-request cap."""
    if size is not None and size > cap:
        raise PayloadTooLargeError(_over_cap(cap), limit=cap)


def _read_error(
    exc: TimeoutError | ConnectionError | HttpProcessingError,
    got: int,
    length: int | None,
    timeout_s: float,
) -> TimeoutError | ConnectionResetError | ProtocolError:
    """What ``read_payload`` raises for a failed read: a stall or trickle (``TimeoutError``),
    a client that hung up (``ConnectionResetError``), each saying how far the body got, or a
    malformed chunked encoding (``ProtocolError``)."""
    announced = "?" if length is None else length
    if isinstance(exc, TimeoutError):
        return TimeoutError(
            f"body timed out after {got} of {announced} bytes (a gap over {timeout_s:g} s, or "
            f"under {BODY_MIN_RATE >> 20} MiB/s after the first {timeout_s:g} s; "
            f"{ENV_BODY_TIMEOUT_S})"
        )
    if isinstance(exc, ConnectionError):
        return ConnectionResetError(f"client disconnected after {got} of {announced} body bytes")
    return ProtocolError(f"malformed request body: {exc.message}")


def physical_memory_bytes() -> int | None:
    """The machine's memory, or the cgroup's limit when that is lower; ``None`` if unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    try:
        raw = _CGROUP_MEMORY_MAX.read_text().strip()
        if raw.isdigit():
            total = min(total or int(raw), int(raw))
    except OSError:
        pass
    return total


def max_inflight_request_bytes(cap: int, settings: Settings) -> int:
    """The in-flight bound for a service whose per-request cap is ``cap``.

    ``PYRSIA_MAX_INFLIGHT_REQUEST_BYTES`` if set (at least ``cap``: a smaller bound would
    refuse a body under the cap for ever); else ``INFLIGHT_BYTES_CAPS`` caps (2 GiB at the
    1 GiB default: one body of the largest size and as much again of others), at most
    1/``INFLIGHT_BYTES_MEMORY_SHARE`` of the memory (a decoded body takes about its size
    again, so bodies then use at most about a quarter), and never less than ``cap``.
    """
    value = settings.positive(ENV_MAX_INFLIGHT_REQUEST_BYTES, int)
    if value is not None:
        if value < cap:
            raise ConfigError(
                f"{ENV_MAX_INFLIGHT_REQUEST_BYTES}={value} is under the per-request cap of "
                f"{cap} bytes ({ENV_MAX_MESSAGE_BYTES} or --max-request-bytes): a body under "
                "the cap could never be admitted; raise it or lower the cap"
            )
        return int(value)
    memory = physical_memory_bytes()
    default = INFLIGHT_BYTES_CAPS * cap
    if memory:
        default = min(default, memory // INFLIGHT_BYTES_MEMORY_SHARE)
    return max(cap, default)


def body_timeout_s(settings: Settings) -> float:
    """``PYRSIA_BODY_TIMEOUT_S`` of ``settings`` if set, else
    ``BODY_TIMEOUT_S``."""
    value = settings.positive(ENV_BODY_TIMEOUT_S, float)
    return BODY_TIMEOUT_S if value is None else float(value)
