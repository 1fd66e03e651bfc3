"""Start real Pyrsia services as subprocesses for tests, and stop them as SIGTERM would.

``ServiceProc.start(module, args, env)`` runs ``python -m <module> ...`` and waits
until the replica is registered in Redis and its ``/health`` says ready (or until
it is registered, for ``wait_ready=False``). ``stop()`` sends SIGTERM and checks
the exit code is 0, which is how the tests prove graceful shutdown.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pyrsia.shared.constants import service_key

REPO = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 5.0
"""A service must drain and exit within this long after SIGTERM (DESIGN.md "Services")."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_get(url: str, key: str) -> str | None:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return client.get(key)
    finally:
        client.close()


@dataclass
class ServiceProc:
    """One service subprocess and where it registered."""

    proc: subprocess.Popen
    role: str
    replica_index: int
    env: dict[str, str]
    address: str | None = None
    log_path: Path | None = None
    killed: bool = False
    """True once the test itself sent SIGKILL (a fault it injected on purpose)."""
    stop_seconds: float | None = None
    """How long the last :meth:`stop` took from SIGTERM to exit."""
    _closed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        assert self.address, "service not registered yet"
        return f"http://{self.address}"

    @classmethod
    def start(
        cls,
        module: str,
        args: list[str],
        env: dict[str, str],
        *,
        role: str,
        replica_index: int = 0,
        wait_ready: bool = True,
        timeout_s: float = 60.0,
        log_dir: Path | None = None,
        address: str | None = None,
        cwd: Path | None = None,
    ) -> ServiceProc:
        """``address``: a service that does not register (inference without Redis) listens
        there; readiness is then read from its /health alone. ``cwd``: its working directory
        (default: the repository)."""
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        log_path = None
        out = subprocess.DEVNULL
        if log_dir is not None:
            log_path = (
                Path(log_dir)
                / f"{module.rsplit('.', 1)[-1]}-{replica_index}-{time.monotonic_ns()}.log"
            )
            out = open(log_path, "wb")  # noqa: SIM115 - closed with the process
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                env=full_env,
                cwd=cwd or REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # the child keeps its own descriptor
        svc = cls(proc, role, replica_index, full_env, address=address, log_path=log_path)
        svc._wait(timeout_s, wait_ready)
        return svc

    def log_text(self) -> str:
        return (
            self.log_path.read_text(errors="replace")
            if self.log_path and self.log_path.exists()
            else ""
        )

    def _wait(self, timeout_s: float, wait_ready: bool) -> None:
        key = None
        if self.address is None:
            key = service_key(self.env["PERSIA_JOB_ID"], self.role, self.replica_index)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.role} exited with {self.proc.returncode}\n{self.log_text()[-3000:]}"
                )
            if self.address is not None and key is None:
                try:
                    if self.health()[0] == 200 or not wait_ready:
                        return
                except OSError:
                    pass
                time.sleep(0.05)
                continue
            raw = _redis_get(self.env["PERSIA_REDIS_URL"], key)
            if raw:
                self.address = json.loads(raw)["address"]
                if not wait_ready or self.health()[0] == 200:
                    return
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(
            f"{self.role}/{self.replica_index} not ready after {timeout_s}s\n{self.log_text()[-3000:]}"
        )

    def health(self) -> tuple[int, dict]:
        headers = {}
        if self.env.get("PERSIA_AUTH_TOKEN"):
            headers["Authorization"] = f"Bearer {self.env['PERSIA_AUTH_TOKEN']}"
        request = urllib.request.Request(f"{self.url}/health", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait at most ``timeout_s``, return the exit code.

        A service that has not exited by then is killed, so its exit code is -9: a
        graceful shutdown that takes longer than ``timeout_s`` shows up as a failure.
        """
        if self.proc.poll() is None:
            started = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.stop_seconds = time.monotonic() - started
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL on purpose (a fault the test injects); the -9 is then expected."""
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            self.proc.wait()


async def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.05) -> None:
    """Poll an async predicate until it is true (for state that changes in another process)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(interval_s)
    raise TimeoutError("condition not met in time")
