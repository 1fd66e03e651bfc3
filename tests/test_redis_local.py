"""``python -m pyrsia.shared.redis_local --restart-on-failure``: the Procfile's Redis supervisor.

A redis-server killed with SIGKILL is started again on the same port (the job rides
through, see tests/faults/test_kill9.py); SIGTERM ends supervisor and server with exit 0;
a crash loop is given up on with the child's exit code; redis-server does not outlive a
killed supervisor.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyrsia.shared.redis_local import supervise
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def supervisor():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyrsia.shared.redis_local", "--port", str(port), "--restart-on-failure"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait(lambda: _pong(port))
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stderr.close()


def test_killed_redis_server_is_restarted_on_the_same_port_and_sigterm_exits_0(supervisor):
    proc, port = supervisor
    (server,) = _children(proc.pid)
    os.kill(server, signal.SIGKILL)
    _wait(lambda: _children(proc.pid) not in ([], [server]) and _pong(port))
    (again,) = _children(proc.pid)
    assert again != server and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    assert not _alive(again)
    err = proc.stderr.read().decode()
    assert "died (killed by SIGKILL); restarting it empty on the same port" in err, err


def test_redis_server_dies_with_a_killed_supervisor(supervisor):
    proc, port = supervisor
    (server,) = _children(proc.pid)
    proc.kill()
    proc.wait()
    _wait(lambda: not _alive(server) and not _pong(port))


def test_a_crash_loop_is_given_up_with_the_childs_exit_code():
    out = io.StringIO()
    started = time.monotonic()
    code = supervise([sys.executable, "-c", "raise SystemExit(3)"], limit=2, window_s=60, out=out)
    assert code == 3
    assert out.getvalue().count("restarting it empty") == 2, out.getvalue()
    assert "2 restarts within 60s already, giving up" in out.getvalue()
    assert time.monotonic() - started < 10
