"""Request bodies under load and from hostile clients, against a real PS over loopback.

Issue 25: three concurrent 300 MiB bodies took a PS from 209 MB to 1.49 GB, a 2 GiB
``Content-Length`` was not refused until 1 GiB of it had been read, a client that stalled
its body held the request open for ever, and every dropped body logged an ERROR with a
traceback. Here: 413 before the body for a ``Content-Length`` over the cap; a bound on the
request bytes held at once (``PYRSIA_MAX_INFLIGHT_REQUEST_BYTES``, metric
``pyrsia_request_bytes_held``) answered with 503 + ``Retry-After``; chunked bodies counted
as they arrive; slow bodies cut after ``PYRSIA_BODY_TIMEOUT_S``; one INFO line per dropped
body. Memory is read from the server's own accounting (its metric, ``VmHWM``).
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.http_client import HttpClient
from tests.raw_socket import chunk, closed_by_server, connect, head, post, read_answer

MiB = 1 << 20
HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _wait_for(predicate, timeout_s: float = 15.0, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError("condition not met in time")


def _log_lines(svc, pattern: str) -> list[str]:
    return [line for line in svc.log_text().splitlines() if re.search(pattern, line)]


def _no_errors_in(svc) -> None:
    text = svc.log_text()
    assert " ERROR " not in text and "Traceback" not in text, text[-3000:]


async def _configure(url: str) -> None:
    client = HttpClient(retries=0)
    try:
        await client.call(f"{url}/configure", {"hyperparams": HYPER})
        await client.call(f"{url}/register_optimizer", {"optimizer": {"type": "sgd", "lr": 0.5}})
    finally:
        await client.close()


def _padded(n: int) -> bytes:
    """A valid msgpack body of ``n`` bytes that /lookup refuses (400 naming a field)."""
    pad = n - 10  # fixmap (1) + "pad" (4) + bin 32 header (5): n is over 64 KiB
    body = packb({"pad": b"\0" * pad})
    assert len(body) == n, len(body)
    return body


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


# --- the size cap: refused before the body -------------------------------------------


async def test_content_length_over_the_cap_is_413_before_any_body_byte(start_ps):
    ps = start_ps()  # the default cap, 1 GiB
    await _configure(ps.url)
    with connect(ps.url, timeout_s=10) as sock:
        sock.sendall(head("/lookup", 2 << 30))  # 2 GiB announced, nothing sent
        status, headers, body = read_answer(sock)
    assert status == 413
    answer = unpackb(body)
    assert answer["error"] == "too_large" and answer["limit"] == 1 << 30
    assert headers.get("connection", "").lower() == "close"
    assert _metrics(ps.url)['pyrsia_requests_refused_total{reason="too_large"}'] == 1
    assert ps.health()[0] == 200


async def test_chunked_body_is_counted_as_it_arrives_and_cut_at_the_cap(start_ps):
    ps = start_ps(PYRSIA_MAX_MESSAGE_BYTES=str(8 * MiB))
    await _configure(ps.url)
    with connect(ps.url) as sock:
        sock.sendall(head("/lookup", None, chunked=True) + chunk(b"\x01" * (3 * MiB)))
        held = _wait_for(
            lambda: (v := _metrics(ps.url)["pyrsia_request_bytes_held"]) >= 3 * MiB and v
        )
        assert 3 * MiB <= held <= 8 * MiB
        try:  # keep sending; the server answers 413 once the cap is passed
            for _ in range(10):
                sock.sendall(chunk(b"\x01" * MiB))
        except (ConnectionResetError, BrokenPipeError):
            pass
        status, _, body = read_answer(sock)
    assert status == 413 and unpackb(body)["limit"] == 8 * MiB
    assert _wait_for(lambda: _metrics(ps.url)["pyrsia_request_bytes_held"] == 0.0 or "zero")
    assert ps.health()[0] == 200


# --- the bound on bytes held at once ---------------------------------------------------


async def test_a_body_that_would_pass_the_inflight_bound_gets_503_with_retry_after(start_ps):
    limit = 8 * MiB
    ps = start_ps(PYRSIA_MAX_MESSAGE_BYTES=str(limit), PYRSIA_MAX_INFLIGHT_REQUEST_BYTES=str(limit))
    await _configure(ps.url)
    first = _padded(6 * MiB)
    with connect(ps.url) as a, connect(ps.url) as b:
        a.sendall(head("/lookup", len(first)) + first[:MiB])  # admitted, then waits
        _wait_for(lambda: _metrics(ps.url)["pyrsia_request_bytes_held"] == len(first))
        b.sendall(head("/lookup", len(first)))  # would hold 12 MiB > 8 MiB
        status, headers, body = read_answer(b)
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert unpackb(body)["error"] == "unavailable"
        assert "PYRSIA_MAX_INFLIGHT_REQUEST_BYTES" in unpackb(body)["message"]
        metrics = _metrics(ps.url)
        assert metrics['pyrsia_requests_refused_total{reason="inflight_bytes"}'] == 1
        assert metrics["pyrsia_request_bytes_held"] == len(first)
        a.sendall(first[MiB:])
        assert read_answer(a)[0] == 400  # /lookup names the field it does not know
    # room again: one request of the whole bound is admitted (no deadlock at bound == cap)
    assert post(ps.url, "/lookup", _padded(limit))[0] == 400
    metrics = _metrics(ps.url)
    assert metrics["pyrsia_request_bytes_held"] == 0
    assert metrics["pyrsia_request_bytes_held_peak"] <= limit
    _no_errors_in(ps)


def _send_concurrently(url: str, bodies: list[bytes]) -> list[int]:
    """Send every body on its own connection at once; their statuses."""
    socks = [connect(url, timeout_s=60) for _ in bodies]
    try:
        for sock, body in zip(socks, bodies, strict=True):
            sock.sendall(head("/lookup", len(body)) + body[: 4 * MiB])
        import threading

        def rest(sock: socket.socket, body: bytes) -> None:
            try:
                sock.sendall(body[4 * MiB :])
            except OSError:
                pass  # answered early (503) and closed

        threads = [
            threading.Thread(target=rest, args=(s, b)) for s, b in zip(socks, bodies, strict=True)
        ]
        for t in threads:
            t.start()
        statuses = [read_answer(s)[0] for s in socks]
        for t in threads:
            t.join()
        return statuses
    finally:
        for sock in socks:
            sock.close()


async def test_concurrent_large_bodies_stay_under_the_bound_in_memory(start_ps):
    """Four 96 MiB bodies at once (cap 100 MiB, bound 128 MiB): at most one is held at a
    time; the PS's peak RSS grows by well under what four would take (~4 x 96 MiB read +
    the same again decoded)."""
    ps = start_ps(
        PYRSIA_MAX_MESSAGE_BYTES=str(100 * MiB),
        PYRSIA_MAX_INFLIGHT_REQUEST_BYTES=str(128 * MiB),
    )
    await _configure(ps.url)
    pid = ps.proc.pid
    base = _rss_kib(pid, "VmRSS")
    body = _padded(96 * MiB)
    statuses = _send_concurrently(ps.url, [body] * 4)
    assert set(statuses) <= {400, 503} and 400 in statuses, statuses
    grown_mib = (_rss_kib(pid, "VmHWM") - base) / 1024
    # one body held (96) + its decoded copy (96) + buffers: generous margin, far under 4x
    assert grown_mib < 330, f"peak RSS grew by {grown_mib:.0f} MiB"
    metrics = _metrics(ps.url)
    assert metrics["pyrsia_request_bytes_held_peak"] <= 128 * MiB
    assert metrics["pyrsia_request_bytes_held"] == 0
    assert ps.health()[0] == 200


# --- slow and dropped bodies -----------------------------------------------------------


async def test_dropped_body_is_one_info_line_and_the_service_keeps_serving(start_ps):
    ps = start_ps()
    await _configure(ps.url)
    with connect(ps.url) as sock:
        sock.sendall(head("/lookup", 1_000_000) + b"\0" * 1000)
        _wait_for(lambda: _metrics(ps.url)["pyrsia_request_bytes_held"] == 1_000_000)
    lines = _wait_for(lambda: _log_lines(ps, r"/lookup.*disconnected"))
    time.sleep(0.3)  # anything else the drop would log lands by now
    lines = _log_lines(ps, r"/lookup.*disconnected")
    assert len(lines) == 1 and " INFO " in lines[0], lines
    assert "1000 of 1000000" in lines[0]
    _no_errors_in(ps)
    assert _metrics(ps.url)['pyrsia_request_bodies_aborted_total{reason="disconnect"}'] == 1
    assert ps.health()[0] == 200
    assert post(ps.url, "/lookup", packb({"train": False, "groups": []}))[0] == 200


async def test_a_stalled_body_is_disconnected_after_the_body_timeout(start_ps):
    ps = start_ps(PYRSIA_BODY_TIMEOUT_S="1")
    await _configure(ps.url)
    with connect(ps.url) as sock:
        started = time.monotonic()
        sock.sendall(head("/lookup", 100_000) + b"\0" * 10)
        assert closed_by_server(sock, within_s=10)
        took = time.monotonic() - started
    assert 0.9 < took < 8, took
    lines = _wait_for(lambda: _log_lines(ps, r"/lookup.*timed out"))
    assert len(lines) == 1 and " INFO " in lines[0], lines
    _no_errors_in(ps)
    assert _metrics(ps.url)['pyrsia_request_bodies_aborted_total{reason="timeout"}'] == 1
    assert post(ps.url, "/lookup", packb({"train": False, "groups": []}))[0] == 200


async def test_a_trickled_body_is_disconnected_too(start_ps):
    """A byte every 0.2 s never stalls for the timeout, but is far under the least rate."""
    ps = start_ps(PYRSIA_BODY_TIMEOUT_S="1")
    await _configure(ps.url)
    with connect(ps.url) as sock:
        sock.sendall(head("/lookup", 100 * MiB))
        started = time.monotonic()
        cut = False
        while time.monotonic() - started < 15:
            try:
                sock.sendall(b"\0")
            except (ConnectionResetError, BrokenPipeError):
                cut = True
                break
            if closed_by_server(sock, within_s=0.2):
                cut = True
                break
        took = time.monotonic() - started
    assert cut and took < 10, took
    assert len(_log_lines(ps, r"/lookup.*timed out")) == 1
    _no_errors_in(ps)


async def test_a_healthy_body_slower_than_the_timeout_in_total_is_read(start_ps):
    """24 MiB at ~10 MiB/s takes ~2.4 s against a 1 s body timeout: no gap reaches it and
    the rate is far over the least, so it is read in full."""
    ps = start_ps(PYRSIA_BODY_TIMEOUT_S="1", PYRSIA_MAX_MESSAGE_BYTES=str(32 * MiB))
    await _configure(ps.url)
    body = _padded(24 * MiB)
    with connect(ps.url) as sock:
        sock.sendall(head("/lookup", len(body)))
        started = time.monotonic()
        for i in range(0, len(body), MiB):
            sock.sendall(body[i : i + MiB])
            time.sleep(0.1)
        assert time.monotonic() - started > 1.5
        assert read_answer(sock)[0] == 400
    _no_errors_in(ps)


# --- settings --------------------------------------------------------------------------


def test_bad_body_settings_end_the_service_with_one_line_and_exit_2():
    import subprocess
    import sys

    from tests.service_procs import REPO

    cases = [
        (
            ["--max-request-bytes", str(8 * MiB), "--max-inflight-request-bytes", str(4 * MiB)],
            {},
            "under the per-request cap",
        ),
        ([], {"PYRSIA_BODY_TIMEOUT_S": "soon"}, "PYRSIA_BODY_TIMEOUT_S"),
        ([], {"PYRSIA_MAX_INFLIGHT_REQUEST_BYTES": "-5"}, "PYRSIA_MAX_INFLIGHT_REQUEST_BYTES"),
    ]
    for args, env, expected in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "pyrsia.services.embedding_ps", *args],
            cwd=REPO,
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], (args, env, lines)


async def test_flags_set_the_bound_and_the_body_timeout(services, monkeypatch):
    monkeypatch.delenv("PYRSIA_MAX_INFLIGHT_REQUEST_BYTES", raising=False)
    monkeypatch.delenv("PYRSIA_BODY_TIMEOUT_S", raising=False)
    flags = [
        "--max-request-bytes",
        str(8 * MiB),
        "--max-inflight-request-bytes",
        str(24 * MiB),
        "--body-timeout-s",
        "1",
    ]
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", *flags],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )
    assert _metrics(ps.url)["pyrsia_request_bytes_held_limit"] == 24 * MiB
    await _configure(ps.url)
    with connect(ps.url) as sock:
        sock.sendall(head("/lookup", 100_000) + b"\0" * 10)
        assert closed_by_server(sock, within_s=10)
    assert len(_log_lines(ps, r"/lookup.*timed out")) == 1
