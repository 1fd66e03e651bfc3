"""The children of ``persia-launcher run``: each started with its lines prefixed and killed
with ``run`` (:class:`Job`), stopped with SIGTERM then SIGKILL, a local Redis on a free port
(:func:`start_redis`), the watch that ends the job when the NN worker or a failing child exits
(:func:`watch`) and the stop signals ``run`` records (:class:`StopSignals`).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from persia._launch.console import Output, pump_lines
from pyrsia.shared.constants import CHILD_POLL_S as POLL_S
from pyrsia.shared.constants import (
    LOG_READER_JOIN_S,
    REDIS_PROBE_INTERVAL_S,
    REDIS_PROBE_TIMEOUT_S,
    REDIS_START_TIMEOUT_S,
)
from pyrsia.shared.errors import UsageError
from pyrsia.shared.parent_death import die_with_parent


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    reader: threading.Thread
    stopped: bool = False


@dataclass
class Job:
    """The children of one ``run``, in start order."""

    out: Output
    env: dict[str, str]
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> Child:
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        reader = threading.Thread(
            target=pump_lines, args=(name, proc.stdout, self.out), name=f"run-{name}", daemon=True
        )
        reader.start()
        child = Child(name, proc, reader)
        self.children.append(child)
        return child

    def get(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    def stop(self, names: tuple[str, ...], timeout_s: float) -> None:
        """SIGTERM the named children still running, wait for them, kill the late ones."""
        group = [c for c in self.children if c.name in names]
        for c in group:
            if c.proc.poll() is None:
                c.stopped = True
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for c in group:
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.out.line(
                    "run", f"{c.name} still running {timeout_s:.0f}s after SIGTERM: killed"
                )
                c.proc.kill()
                c.proc.wait()
            c.reader.join(timeout=LOG_READER_JOIN_S)  # its last lines out before ours


def free_port() -> int:
    """A port the system has just handed out as free (loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=REDIS_PROBE_TIMEOUT_S):
                return True
        except OSError:
            time.sleep(REDIS_PROBE_INTERVAL_S)
    return False


def start_redis(job: Job) -> str:
    """A local Redis on a free port (three tries: a port found free can be taken before redis
    binds it); its URL."""
    for _ in range(3):
        port = free_port()
        child = job.start(
            "redis",
            [
                sys.executable,
                "-m",
                "pyrsia.shared.redis_local",
                "--port",
                str(port),
                "--restart-on-failure",
            ],
        )
        if wait_port(port, child.proc, REDIS_START_TIMEOUT_S):
            return f"redis://127.0.0.1:{port}/0"
        job.stop(("redis",), 2.0)
        job.children.remove(child)
    raise UsageError("could not start a local redis-server (see its lines above)")


def watch(job: Job, nn: Child, stop_requested: Callable[[], bool]) -> Child | None:
    """Until the NN worker exits or a signal comes; the child that failed first, if any.

    A data loader that finished (exit 0) is no failure; any other child ending is.
    """
    while not stop_requested():
        if nn.proc.poll() is not None:
            return None
        for c in job.children:
            code = c.proc.poll()
            if c is nn or code is None or (c.name == "data_loader" and code == 0):
                continue
            return c
        time.sleep(POLL_S)
    return None


class StopSignals:
    """SIGINT and SIGTERM recorded (the first one's number), restored on :meth:`restore`."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved = {s: signal.signal(s, self._on) for s in (signal.SIGINT, signal.SIGTERM)}

    def _on(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def received(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)
