"""A peer that accepts and never answers (a pulled cable, a hung process): the client says so.

On a cut link TCP keeps retransmitting into the dead link and nothing fails until the
request's own deadline; the embedding worker's PS calls (60 s timeout, one retry) and the
NN worker's lookups (120 s) then waited minutes without a line in any log (found by the
cluster harness: a PS cut for 100 s). Here a local TCP server accepts and never answers;
the client must log, every ``stall_report_s`` while the request lasts, a line naming the
peer and the seconds waited, and a line naming the peer and the elapsed time when it
gives up an attempt and retries.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from pyrsia.shared.errors import ServiceUnavailableError
from pyrsia.shared.http_client import HttpClient

pytestmark = pytest.mark.timeout(60)


class SilentPeer:
    """Accepts connections, reads what comes, never writes a byte."""

    async def __aenter__(self) -> SilentPeer:
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/lookup"
        return self

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        while await reader.read(65536):
            pass

    async def __aexit__(self, *exc) -> None:
        for writer in self.writers:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize("lean", [True, False], ids=["lean-pool", "aiohttp"])
async def test_a_silent_peer_is_reported_while_it_lasts_and_named_on_retry(lean, caplog):
    caplog.set_level(logging.INFO, logger="pyrsia.shared.http_client")
    async with SilentPeer() as peer:
        client = HttpClient(timeout_s=1.8, stall_report_s=0.5, lean=lean, auth_token=None)
        started = time.monotonic()
        try:
            # the error that stops a caller names the peer and the deadline, in one line
            gave_up = rf"^{re.escape(peer.url)} did not answer within 1\.8s$"
            with pytest.raises(ServiceUnavailableError, match=gave_up):
                await client.call(peer.url, {"x": 1}, idempotent=True, retries=1)
        finally:
            await client.close()
        took = time.monotonic() - started
    assert 3.0 <= took < 15.0, took  # two attempts of 1.8 s plus a backoff; a loaded box is late
    assert peer.accepted == 2
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    where = f"127.0.0.1:{peer.port}"
    stalls = [ln for ln in lines if "no answer from" in ln]
    # every 0.5 s of each 1.8 s attempt: 0.5, 1.0, 1.5 s, twice
    assert len(stalls) >= 5, lines
    assert all(where in ln for ln in stalls), stalls
    waited = [float(m[1]) for ln in stalls if (m := re.search(r"for ([\d.]+) s", ln))]
    assert len(waited) == len(stalls) and waited[:3] == sorted(waited[:3]), stalls
    assert waited[0] >= 0.45 and max(waited) < 2.0, waited  # per attempt, not since the call
    retried = [ln for ln in lines if "retrying" in ln]
    assert len(retried) == 1 and where in retried[0], lines
    assert re.search(r"retrying, [\d.]+ s since the call began", retried[0]), retried


async def test_an_answer_before_the_first_report_logs_nothing(caplog):
    """The report is for silent peers only: a peer that answers in time costs no line."""
    caplog.set_level(logging.INFO, logger="pyrsia.shared.http_client")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writers.append(writer)

    writers: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpClient(timeout_s=5.0, stall_report_s=0.5, auth_token=None)
    try:
        assert await client.call(f"http://127.0.0.1:{port}/x", method="GET") is None
        await asyncio.sleep(0.6)  # a report timer left behind would fire now
    finally:
        await client.close()
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_the_first_report_waits_a_quarter_of_the_timeout_and_a_url_gets_one_line(caplog):
    """A slow but healthy answer (a first lookup compiling its kernels, a long checkpoint
    write) is not a stall: with a 4 s timeout nothing is reported before 1 s, even with a
    0.3 s period; and eight requests waiting on one peer make one line per period, not
    eight (a cold start's prefetch printed 20 identical lines at once)."""
    caplog.set_level(logging.INFO, logger="pyrsia.shared.http_client")
    async with SilentPeer() as peer:
        client = HttpClient(timeout_s=4.0, stall_report_s=0.3, auth_token=None)
        try:
            calls = [
                asyncio.create_task(client.call(peer.url, {"i": i}, idempotent=True, retries=0))
                for i in range(8)
            ]
            await asyncio.sleep(1.9)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await client.close()
    stalls = [r.getMessage() for r in caplog.records if "no answer from" in r.getMessage()]
    waited = [float(re.search(r"for ([\d.]+) s", ln)[1]) for ln in stalls]
    assert stalls and min(waited) >= 0.95, stalls  # a quarter of 4 s, not the 0.3 s period
    assert len(stalls) <= 4, stalls  # 1.0 .. 1.9 s every 0.3 s: one line per tick, not 8
    assert all("8 requests waiting" in ln for ln in stalls), stalls
