"""An embedding worker started by ``persia-launcher serve`` for itself, when none is named.

The worker is the ordinary one (``python -m pyrsia.services.embedding_worker``: a process, not an
import, so the layering ``persia -> shared`` holds) run with the same embedding and global
config as the endpoint: with ``job_type: Infer`` and ``infer_config.servers`` it dials the PS
replicas at those addresses and needs no Redis. It listens on a free loopback port, is
watched (its exit makes the endpoint unready, with the exit code as the reason) and is
stopped with SIGTERM once the endpoint has drained its requests, then reaped; should serve be
killed outright, the kernel sends the worker SIGTERM (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from pyrsia.shared.constants import SERVE_WATCH_INTERVAL_S as WATCH_INTERVAL_S
from pyrsia.shared.constants import SHUTDOWN_BUDGET_S
from pyrsia.shared.http_server import STATE
from pyrsia.shared.parent_death import die_with_parent

log = logging.getLogger(__name__)

WORKER_MODULE = "pyrsia.services.embedding_worker"


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateWorker:
    """One embedding-worker child process of the serve endpoint."""

    def __init__(self, embedding_config: Path, global_config: Path):
        self.embedding_config = embedding_config
        self.global_config = global_config
        self.port = free_loopback_port()
        self.proc: subprocess.Popen | None = None
        self._terminated = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            WORKER_MODULE,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--embedding-config",
            str(self.embedding_config),
            "--global-config",
            str(self.global_config),
        ]
        # output goes where serve's goes (honcho, terminal); the worker dies with serve
        self.proc = subprocess.Popen(args, preexec_fn=die_with_parent)
        log.info("started a private embedding worker (pid %d) on %s", self.proc.pid, self.address)

    def terminate(self) -> None:
        """SIGTERM (once) without waiting: the worker drains while serve cleans up."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.terminate()

    def stop(self) -> int | None:
        """SIGTERM, wait for the drain, SIGKILL only past the shutdown budget; always reaped."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            if not self._terminated:  # a second SIGTERM could hit it after its handler is gone
                proc.terminate()
            try:
                return proc.wait(timeout=SHUTDOWN_BUDGET_S)
            except subprocess.TimeoutExpired:
                log.error(
                    "private embedding worker did not stop within %.0fs: killed", SHUTDOWN_BUDGET_S
                )
                proc.kill()
        return proc.wait()

    def install(self, app: web.Application) -> None:
        """Started before the app's other resources, stopped after them (aiohttp cleanup ctx)."""

        async def on_shutdown(app: web.Application) -> None:
            self.terminate()  # serve has drained its requests: the worker may stop now

        async def ctx(app: web.Application):
            self.start()
            watcher = asyncio.create_task(self._watch(app))
            yield
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            code = await asyncio.to_thread(self.stop)
            log.info("private embedding worker exited with code %s", code)

        app.cleanup_ctx.insert(0, ctx)
        app.on_shutdown.append(on_shutdown)

    async def _watch(self, app: web.Application) -> None:
        while self.proc is not None:
            code = self.proc.poll()
            if code is not None:
                reason = (
                    f"the private embedding worker exited with code {code}; see its log lines above"
                )
                app[STATE].set_not_ready(reason)
                log.error("%s", reason)
                return
            await asyncio.sleep(WATCH_INTERVAL_S)
