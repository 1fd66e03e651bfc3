"""A lean HTTP/1.1 keep-alive client for Pyrsia's own servers (plain http, Content-Length).

aiohttp's client costs ~0.1 CPU-ms per request (request/response objects, timers, traces,
cookie and header machinery); an embedding worker makes two of them per training step,
which at 10x the demo's rate is a quarter of a core. This pool sends a request as one
write (request line, a few headers, the body) and reads the answer with a buffered
protocol: status line, headers, then a ``Content-Length`` body read straight into a buffer
of that length. That is all Pyrsia's servers
ever send (aiohttp sets ``Content-Length`` on every ``web.Response``); an answer without
it (chunked) is refused as malformed rather than misread.

``ConnectionPool.request`` raises ``OSError`` (refused, reset, closed early),
``asyncio.TimeoutError`` and ``ProtocolError`` (an answer this client cannot read);
``pyrsia.shared.http_client`` maps them all to ``ServiceUnavailableError``. A request on a reused connection that the server had closed
(keep-alive expiry) is sent again once on a fresh one, which is safe because the server
read none of it.
"""

from __future__ import annotations

import asyncio
import collections
from urllib.parse import urlsplit

from pyrsia.shared.constants import CONNECT_TIMEOUT_S, MAX_ANSWER_BYTES, MAX_HEAD_BYTES
from pyrsia.shared.errors import InvalidInputError, ProtocolError

_URL_CACHE_MAX = 1024
_WRITE_JOINED_MAX = 1 << 16  # smaller bodies are joined with the head: one write, one segment


class _Answer:
    __slots__ = ("status", "content_type", "body", "keep_alive")

    def __init__(self, status: int, content_type: str, body: bytearray, keep_alive: bool):
        self.status, self.content_type, self.body, self.keep_alive = (
            status,
            content_type,
            body,
            keep_alive,
        )


def _parse_head(head: bytes) -> tuple[int, int, str, bool]:
    """(status, content length, content type, keep-alive) of an answer's head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    length, content_type, keep_alive = -1, "", parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or length >= 0:
                raise ProtocolError(f"bad or repeated Content-Length {value[:40]!r}")
            length = int(value)
        elif name == b"content-type":
            content_type = value.split(b";", 1)[0].strip().decode("latin-1").lower()
        elif name == b"connection":
            keep_alive = value.strip().lower() != b"close"
        elif name == b"transfer-encoding":
            raise ProtocolError("chunked answers are not read by this client")
    if length < 0:
        if status in (204, 304) or status < 200:
            length = 0
        else:
            raise ProtocolError(f"answer {status} has no Content-Length")
    if length > MAX_ANSWER_BYTES:
        raise ProtocolError(f"answer of {length} bytes is over {MAX_ANSWER_BYTES}")
    return status, length, content_type, keep_alive


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; one request at a time.

    A buffered protocol: the transport reads the head into a small scratch buffer, then the
    body straight into a ``bytearray`` of its ``Content-Length``, which becomes the answer's
    body. A copy per chunk, a slice and a ``bytes`` of a whole body cost ~0.3 CPU-ms per MB
    on the lookups' answers, which are the largest the NN worker and the embedding worker read.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.scratch = bytearray(MAX_HEAD_BYTES)  # the head, and the body's first bytes
        self.filled = 0  # bytes of ``scratch`` in use
        self.body: bytearray | None = None  # set once the head is read, until it is full
        self.body_filled = 0
        self.received = False  # any byte of the current answer
        self.waiter: asyncio.Future[_Answer] | None = None
        self.head: tuple[int, int, str, bool] | None = None  # parsed head of the current answer
        self.closed = False
        self.used = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            why = f": {exc}" if exc else ""
            self.waiter.set_exception(
                ConnectionResetError(f"connection closed before the answer was complete{why}")
            )

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None:
            return memoryview(self.body)[self.body_filled :]  # never past the body's end
        if self.filled == len(self.scratch):  # a head this long was refused already
            self.filled = 0
        return memoryview(self.scratch)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.received = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        if self.body is not None:
            self.body_filled += nbytes
            if self.body_filled == len(self.body):
                self._answer(waiter, self.body)
            return
        self.filled += nbytes
        try:
            end = self.scratch.find(b"\r\n\r\n", 0, self.filled)
            if end < 0:
                if self.filled >= MAX_HEAD_BYTES:
                    raise ProtocolError(f"answer head over {MAX_HEAD_BYTES} bytes")
                return
            self.head = _parse_head(bytes(self.scratch[:end]))
            length, start = self.head[1], end + 4
            if self.filled - start > length:
                raise ProtocolError("bytes after the answer's body")
        except ProtocolError as exc:
            waiter.set_exception(exc)
            self.abort()
            return
        body = bytearray(length)
        got = self.filled - start
        body[:got] = memoryview(self.scratch)[start : self.filled]
        self.filled = 0
        if got == length:
            self._answer(waiter, body)
        else:
            self.body, self.body_filled = body, got

    def _answer(self, waiter: asyncio.Future[_Answer], body: bytearray) -> None:
        assert self.head is not None
        status, _, content_type, keep_alive = self.head
        self.body, self.head = None, None
        waiter.set_result(_Answer(status, content_type, body, keep_alive))

    def send(self, head: bytes, body: bytes | None) -> asyncio.Future[_Answer]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.used = True
        self.received = False
        if body and len(body) > _WRITE_JOINED_MAX:
            self.transport.write(head)
            self.transport.write(body)
        else:
            self.transport.write(head + body if body else head)
        return self.waiter

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class ConnectionPool:
    """Keep-alive connections per (host, port), at most ``limit`` open per peer."""

    def __init__(self, limit: int, headers: dict[str, str]):
        self.limit = limit
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        self._idle: dict[tuple[str, int], list[_Connection]] = collections.defaultdict(list)
        self._open: dict[tuple[str, int], int] = collections.defaultdict(int)
        self._waiting: dict[tuple[str, int], collections.deque] = collections.defaultdict(
            collections.deque
        )
        self._urls: dict[str, tuple[tuple[str, int], bytes]] = {}
        self.closed = False

    def _split(self, url: str) -> tuple[tuple[str, int], bytes]:
        cached = self._urls.get(url)
        if cached is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise InvalidInputError(
                    "url", "a plain http URL", url, message=f"not a plain http URL: {url!r}"
                )
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            if any(c in url for c in " \r\n\t"):
                raise InvalidInputError(
                    "url", "a URL without whitespace", url, message=f"URL with whitespace: {url!r}"
                )
            key = (parts.hostname, parts.port or 80)
            prefix = f" {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode("latin-1")
            cached = (key, prefix)
            if len(self._urls) >= _URL_CACHE_MAX:
                self._urls.clear()
            self._urls[url] = cached
        return cached

    def _pop_idle(self, key: tuple[str, int]) -> _Connection | None:
        """An open idle connection to ``key``, if there is one (no await: the common case)."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._open[key] -= 1
        return None

    async def _acquire(self, key: tuple[str, int]) -> _Connection:
        """A new connection, or an idle one freed while waiting for room under ``limit``."""
        idle = self._idle[key]
        while self._open[key] >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting[key].append(waiter)
            try:
                await waiter
            except BaseException:
                if not waiter.cancelled() and waiter.done():
                    self._wake(key)  # pass the wake-up we were given on
                raise
            if idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn
                self._open[key] -= 1
        self._open[key] += 1
        try:
            _, conn = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(_Connection, *key),
                CONNECT_TIMEOUT_S,
            )
        except BaseException:
            self._open[key] -= 1
            self._wake(key)
            raise
        return conn

    def _wake(self, key: tuple[str, int]) -> None:
        waiting = self._waiting.get(key)
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, key: tuple[str, int], conn: _Connection, reusable: bool) -> None:
        if reusable and not conn.closed and not self.closed:
            conn.waiter = None
            self._idle[key].append(conn)
        else:
            conn.abort()
            self._open[key] -= 1
        self._wake(key)

    async def request(
        self, method: str, url: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, str, bytearray]:
        """Send one request; (status, content type, body) of the answer."""
        if method == "HEAD":  # its answer has a Content-Length but no body
            raise InvalidInputError(
                "method", "not HEAD", method, message="HEAD requests are not supported"
            )
        key, prefix = self._split(url)
        length = len(body) if body else 0
        head = b"".join(
            (method.encode("ascii"), prefix, self._extra, b"Content-Length: %d\r\n\r\n" % length)
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in (0, 1):
            conn = self._pop_idle(key)
            if conn is None:
                conn = await asyncio.wait_for(self._acquire(key), max(deadline - loop.time(), 0))
            reused = conn.used
            answer = conn.send(head, body)
            timer = loop.call_at(deadline, _expire, answer, conn)
            try:
                result = await answer
            except ConnectionResetError:
                self._release(key, conn, False)
                if reused and attempt == 0 and not conn.received:
                    continue  # the server had closed this idle connection: send it afresh
                raise
            except BaseException:
                self._release(key, conn, False)  # cancelled or timed out mid-answer
                raise
            finally:
                timer.cancel()
            self._release(key, conn, result.keep_alive)
            return result.status, result.content_type, result.body
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every idle connection; busy ones close when their answer is in."""
        self.closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()


def _expire(answer: asyncio.Future, conn: _Connection) -> None:
    if not answer.done():
        answer.set_exception(asyncio.TimeoutError())
        conn.abort()
