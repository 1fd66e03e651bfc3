"""The lean keep-alive client (pyrsia/shared/http_conn.py) through HttpClient, against a real aiohttp server."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import pytest
from aiohttp import web

from pyrsia.shared.codec import packb
from pyrsia.shared.errors import AuthError, NotFoundError, ServiceUnavailableError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.http_server import make_app, msgpack_handler
from pyrsia.shared.settings import Settings
from tests.redis_server import free_port


class Peer:
    """A real aiohttp app on a free loopback port that remembers the connections it saw."""

    def __init__(self, token: str | None = None):
        self.app = make_app("peer", auth_token=token, settings=Settings.from_env({}))
        self.connections: set[tuple] = set()
        self.open_now = 0
        self.most_open = 0
        self.app.router.add_post("/echo", msgpack_handler(self.echo))
        self.app.router.add_post("/slow", msgpack_handler(self.slow))
        self.app.router.add_get("/json", self.json)
        self.app.router.add_post("/chunked", self.chunked)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def echo(self, request: web.Request, body) -> dict:
        self.connections.add(request.transport.get_extra_info("peername"))
        return {"echo": body}

    async def slow(self, request: web.Request, body) -> dict:
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await asyncio.sleep(float(body["s"]))
        finally:
            self.open_now -= 1
        return {"slept": body["s"]}

    async def json(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(packb({"a": 1}))
        await response.write_eof()
        return response

    async def __aenter__(self) -> Peer:
        self.runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "aiohttp"])
async def test_round_trips_reuse_one_connection(lean):
    async with Peer() as peer:
        http = HttpClient(auth_token=None, lean=lean)
        try:
            for i in range(20):
                assert await http.call(f"{peer.url}/echo", {"i": i}) == {"echo": {"i": i}}
            assert await http.call(f"{peer.url}/json", method="GET") == {"ok": True}
        finally:
            await http.close()
        assert len(peer.connections) == 1


async def test_error_statuses_map_to_the_project_errors():
    async with Peer(token="t" * 32) as peer:
        http = HttpClient(auth_token=None)
        try:
            with pytest.raises(AuthError):
                await http.call(f"{peer.url}/echo", {})
        finally:
            await http.close()
        http = HttpClient(auth_token="t" * 32)
        try:
            with pytest.raises(NotFoundError):
                await http.call(f"{peer.url}/nowhere", {})
            assert await http.call(f"{peer.url}/echo", [1]) == {"echo": [1]}
        finally:
            await http.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced():
    async with Peer() as peer:
        http = HttpClient(auth_token=None)
        try:
            await http.call(f"{peer.url}/echo", 1)
            await asyncio.sleep(0.6)  # past the server's 0.2 s keep-alive: it closed the socket
            assert await http.call(f"{peer.url}/echo", 2) == {"echo": 2}
        finally:
            await http.close()
        assert len(peer.connections) == 2


async def test_timeout_unreachable_and_chunked_are_service_unavailable():
    async with Peer() as peer:
        http = HttpClient(auth_token=None)
        try:
            started = time.monotonic()
            with pytest.raises(ServiceUnavailableError, match="did not answer within"):
                await http.call(f"{peer.url}/slow", {"s": 5}, timeout_s=0.2)
            assert time.monotonic() - started < 2
            with pytest.raises(ServiceUnavailableError, match="chunked"):
                await http.call(f"{peer.url}/chunked", {})
            assert await http.call(f"{peer.url}/echo", 3) == {"echo": 3}  # pool still works
        finally:
            await http.close()
    http = HttpClient(auth_token=None)
    try:
        with pytest.raises(ServiceUnavailableError, match="cannot reach"):
            await http.call(f"http://127.0.0.1:{free_port()}/echo", {})
    finally:
        await http.close()


async def test_open_connections_stay_under_the_pool_limit():
    async with Peer() as peer:
        http = HttpClient(auth_token=None, pool_limit=3)
        try:
            answers = await asyncio.gather(
                *(http.call(f"{peer.url}/slow", {"s": 0.05}) for _ in range(12))
            )
        finally:
            await http.close()
        assert answers == [{"slept": 0.05}] * 12
        assert peer.most_open == 3


async def test_a_cancelled_call_does_not_poison_the_pool():
    async with Peer() as peer:
        http = HttpClient(auth_token=None, pool_limit=1)
        try:
            task = asyncio.create_task(http.call(f"{peer.url}/slow", {"s": 5}))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await http.call(f"{peer.url}/echo", 4, timeout_s=2) == {"echo": 4}
        finally:
            await http.close()


class RawPeer:
    """A bare asyncio server that answers every request with ``answer`` (or the next of a list
    of answers, in turn) written in pieces of ``piece`` bytes, draining between them, so the
    client reads it in many chunks."""

    def __init__(self, answer: bytes | list[bytes], piece: int):
        self.answers = itertools.cycle(answer if isinstance(answer, list) else [answer])
        self.piece = piece
        self.tasks: set[asyncio.Task] = set()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                answer = next(self.answers)
                for start in range(0, len(answer), self.piece):
                    writer.write(answer[start : start + self.piece])
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def __aenter__(self) -> RawPeer:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for task in list(self.tasks):  # connections still open: end their handlers
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body + extra


@pytest.mark.parametrize("piece", [7, 4096, 1 << 30], ids=["7-byte", "4-KB", "one-write"])
async def test_an_answer_in_any_number_of_chunks_arrives_whole(piece):
    import numpy as np

    from pyrsia.shared.codec import unpackb

    data = np.arange(1 << 18, dtype=np.float32)  # a 1 MB array, as a Criteo lookup answer
    body = packb({"data": data})
    if piece == 7:
        body = packb({"data": data[:2000]})  # keep the 7-byte case quick
    async with RawPeer(_answer(body), piece) as peer:
        http = HttpClient(auth_token=None, lean=True)
        try:
            for _ in range(2):  # the connection is reused: nothing is left over
                got = await http.call(f"{peer.url}/x", {"q": 1})
                np.testing.assert_array_equal(got["data"], unpackb(body)["data"])
        finally:
            await http.close()


async def test_bytes_after_the_answer_are_refused():
    async with RawPeer(_answer(packb({"a": 1}), extra=b"junk"), 1 << 30) as peer:
        http = HttpClient(auth_token=None, lean=True)
        try:
            with pytest.raises(ServiceUnavailableError):
                await http.call(f"{peer.url}/x", {"q": 1})
        finally:
            await http.close()


async def test_large_and_small_answers_in_turn_on_one_connection_arrive_whole():
    import numpy as np

    big = {"data": np.arange(1 << 18, dtype=np.float32)}  # 1 MB: read into its own buffer
    small = {"data": np.arange(3, dtype=np.int64)}
    async with RawPeer([_answer(packb(big)), _answer(packb(small))], 4096) as peer:
        http = HttpClient(auth_token=None, lean=True)
        try:
            got = [await http.call(f"{peer.url}/x", {"q": k}) for k in range(4)]
            for answer, sent in zip(got, [big, small, big, small], strict=True):
                np.testing.assert_array_equal(answer["data"], sent["data"])
            assert http._get_pool()._open[("127.0.0.1", peer.port)] == 1  # one connection
        finally:
            await http.close()


async def test_an_answer_head_over_64_kb_is_refused():
    head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 0\r\n\r\n"
    async with RawPeer(head, 4096) as peer:
        http = HttpClient(auth_token=None, lean=True)
        try:
            with pytest.raises(ServiceUnavailableError, match="answer head over 65536 bytes"):
                await http.call(f"{peer.url}/x", {"q": 1})
        finally:
            await http.close()
