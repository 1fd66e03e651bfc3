"""Connections from clients that never finish a request head, against a real PS over loopback.

Issue 49: 1,100 connections that sent one byte of a request line and stalled stayed open for
ever (after 65 s the PS held 1,116 file descriptors), which can exhaust the process's file
limit before any token is checked. Here, with a short ``PYRSIA_HEADER_TIMEOUT_S``: 1,000
stalled connections are closed within the timeout, the PS's descriptors return to baseline
and its memory stays bounded, and a normal client is answered throughout; at
``PYRSIA_MAX_CONNECTIONS`` the longest-waiting idle connection is closed for a new one, and
when every connection is inside a request the new one gets 503.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from tests.service_procs import REPO


@pytest.fixture
def start_ps(services, monkeypatch):
    def start(**env: str):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return services(
            "pyrsia.services.embedding_ps",
            ["--port", "0"],
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
        )

    return start


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _settled(pid: int, timeout_s: float = 20.0) -> None:
    """Wait until the PS's memory stops growing (its start-up work is done), for a baseline."""
    last, deadline = -1, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = _rss_kib(pid)
        if abs(now - last) < 256:
            return
        last = now
        time.sleep(0.5)


def _answered(url: str) -> int:
    """The status of ``GET /health`` (503 until the PS is configured: an answer all the same)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _stall(address: str, n: int, first: bytes = b"G") -> list[socket.socket]:
    host, port = address.rsplit(":", 1)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        if first:
            s.sendall(first)
        s.setblocking(False)
        socks.append(s)
    return socks


def _open_count(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has not closed."""
    n = 0
    for s in socks:
        try:
            if s.recv(4096):
                n += 1
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not served")


def test_a_thousand_stalled_heads_are_closed_and_a_normal_client_is_served(start_ps):
    ps = start_ps(PYRSIA_HEADER_TIMEOUT_S="1.5")
    pid = ps.proc.pid
    assert _answered(ps.url) in (200, 503)
    _settled(pid)
    base_fds, base_rss = _fds(pid), _rss_kib(pid)
    started = time.monotonic()
    socks = _stall(ps.address, 1000)
    try:
        last_connect = time.monotonic()
        print(f"1000 connections in {last_connect - started:.2f}s; PS fds {_fds(pid)}")
        served, closed_after = 0, None
        while time.monotonic() - last_connect < 15:
            assert _answered(ps.url) in (200, 503)  # a normal client, throughout
            served += 1
            if _open_count(socks) == 0:
                closed_after = time.monotonic() - last_connect
                break
            time.sleep(0.2)
        assert closed_after is not None, f"{_open_count(socks)} stalled connections still open"
        assert closed_after < 1.5 + 3.0  # the timeout, plus slack for a loaded machine
        deadline = time.monotonic() + 5
        while _fds(pid) > base_fds + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fds(pid) <= base_fds + 2
        assert _rss_kib(pid) - base_rss < 32 * 1024  # bounded: no per-connection leftovers
        assert served >= 1
        assert _metric(ps.url, "pyrsia_connections_open_peak") >= 100  # they were held a while
        assert _metric(ps.url, 'pyrsia_connections_closed_total{reason="header_timeout"}') >= 1000
    finally:
        for s in socks:
            s.close()


def test_a_connection_that_sends_nothing_and_an_idle_keep_alive_are_closed(start_ps):
    ps = start_ps(PYRSIA_HEADER_TIMEOUT_S="0.5", PYRSIA_IDLE_TIMEOUT_S="0.5")
    silent = _stall(ps.address, 1, first=b"")
    idle = _stall(ps.address, 1, first=b"GET /health HTTP/1.1\r\nHost: pyrsia\r\n\r\n")
    try:
        time.sleep(0.2)
        assert _open_count(idle) == 1  # the answer arrived; the connection is kept alive
        deadline = time.monotonic() + 5
        while _open_count(silent + idle) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _open_count(silent + idle) == 0
        assert _metric(ps.url, 'pyrsia_connections_closed_total{reason="idle_timeout"}') >= 1
    finally:
        for s in silent + idle:
            s.close()


def test_at_the_bound_the_longest_idle_connection_makes_room(start_ps):
    ps = start_ps(PYRSIA_MAX_CONNECTIONS="20")
    pid = ps.proc.pid
    base_fds = _fds(pid)
    socks = _stall(ps.address, 60)
    try:
        time.sleep(0.3)
        assert _fds(pid) <= base_fds + 21
        assert _open_count(socks[:40]) == 0 and _open_count(socks[40:]) == 20  # oldest went
        assert _answered(ps.url) in (200, 503)  # a normal client still gets in
        assert _metric(ps.url, 'pyrsia_connections_closed_total{reason="evicted"}') >= 40
    finally:
        for s in socks:
            s.close()


def test_at_the_bound_with_every_connection_busy_a_new_one_gets_503(start_ps):
    ps = start_ps(PYRSIA_MAX_CONNECTIONS="2", PYRSIA_BODY_TIMEOUT_S="30")
    head = b"POST /lookup HTTP/1.1\r\nHost: pyrsia\r\nContent-Length: 100\r\n\r\nx"
    busy = _stall(ps.address, 2, first=head)  # inside a request, waiting for their bodies
    try:
        time.sleep(0.3)
        host, port = ps.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: pyrsia\r\n\r\n")
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 1" in answer and b"too many connections" in answer
    finally:
        for s in busy:
            s.close()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--header-timeout-s", "0"), ("--idle-timeout-s", "-1"), ("--max-connections", "0")],
)
def test_a_bad_connection_flag_is_refused_naming_it(flag, value):
    proc = subprocess.run(
        [sys.executable, "-m", "pyrsia.services.embedding_ps", "--port", "0", flag, value],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{flag} must be positive" in proc.stderr


async def test_the_nn_worker_ingress_closes_a_stalled_head(registry_settings):
    from dataclasses import replace

    from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
    from pyrsia.shared.settings import Settings

    environment = Settings.from_env({"PYRSIA_HEADER_TIMEOUT_S": "0.3"})
    ingress = Ingress(
        BatchQueue(1, rank=0, world_size=1),
        registry_settings=replace(registry_settings, environment=environment),
    )
    address = await ingress.start()
    try:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"P")
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # closed, no answer
        assert time.monotonic() - started < 3
        writer.close()
    finally:
        await ingress.stop()
