"""The Adult job as separate processes the test controls one by one (no honcho).

Redis is the test's own :class:`~tests.redis_server.RedisServer` (so it can be stopped and
restarted on the same port), the PS and the embedding worker are
:class:`~tests.service_procs.ServiceProc` s, and the NN worker and the data loader run
through ``persia-launcher`` on the example's own ``train.py`` / ``data_loader.py``
with ``EPOCHS`` passes, so the job trains long enough to be disturbed mid-way.
Progress is read from the PS over loopback (``/stats`` ``updates_applied``), never
through Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from pyrsia.shared.codec import unpackb
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from tests.redis_server import RedisServer, free_port
from tests.service_procs import ServiceProc

REPO = Path(__file__).resolve().parents[2]
ADULT = REPO / "examples" / "adult_income"


class DirectJob:
    """Redis + PS + embedding worker + NN worker + data loader of one Adult job."""

    def __init__(self, workdir: Path, redis: RedisServer, *, epochs: int):
        self.workdir = workdir
        self.redis = redis
        self.env = {
            "PERSIA_REDIS_URL": redis.url,
            "PERSIA_JOB_ID": f"faults-{uuid.uuid4().hex[:8]}",
            "PERSIA_EMBEDDING_CONFIG": str(ADULT / "config" / "embedding_config.yml"),
            "PERSIA_GLOBAL_CONFIG": str(ADULT / "config" / "global_config.yml"),
            "EPOCHS": str(epochs),
            "MASTER_PORT": str(free_port()),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.ps: ServiceProc | None = None
        self.ew: ServiceProc | None = None
        self.nn: subprocess.Popen | None = None
        self.dl: subprocess.Popen | None = None

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "persia.launcher", *args],
                cwd=REPO,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def start(self) -> DirectJob:
        flags = ["--port", "0", "--replica-index", "0", "--replica-size", "1"]
        self.ps = ServiceProc.start(
            "pyrsia.services.embedding_ps",
            flags,
            self.env,
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
            log_dir=self.workdir,
        )
        self.ew = ServiceProc.start(
            "pyrsia.services.embedding_worker",
            flags,
            self.env,
            role=ROLE_EMBEDDING_WORKER,
            wait_ready=False,
            log_dir=self.workdir,
        )
        self.nn = self._launch("nn_worker", ["nn-worker", str(ADULT / "train.py")])
        self.dl = self._launch("data_loader", ["data-loader", str(ADULT / "data_loader.py")])
        return self

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def updates_applied(self) -> int:
        """The PS's acknowledged id updates so far (loopback HTTP, no Redis involved)."""
        assert self.ps is not None
        with urllib.request.urlopen(f"{self.ps.url}/stats", timeout=5) as resp:
            return int(unpackb(resp.read())["updates_applied"])

    def worker_stats(self) -> dict:
        """The embedding worker's /stats: id rows the PS acknowledged to it
        (``applied_update_ids``), id rows it dropped after answering the NN worker
        (``dropped_update_ids``), batches whose gradients it stopped awaiting, ..."""
        assert self.ew is not None
        with urllib.request.urlopen(f"{self.ew.url}/stats", timeout=5) as resp:
            return unpackb(resp.read())

    def wait_training(self, min_updates: int = 5000, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.updates_applied() < min_updates:
            for name, proc in (("nn_worker", self.nn), ("data_loader", self.dl)):
                assert proc is not None and proc.poll() is None, self.log(name)[-3000:]
            assert time.monotonic() < deadline, self.log("nn_worker")[-3000:]
            time.sleep(0.2)

    def processes(self) -> dict[str, subprocess.Popen]:
        assert self.ps and self.ew and self.nn and self.dl
        return {
            "embedding_parameter_server": self.ps.proc,
            "embedding_worker": self.ew.proc,
            "nn_worker": self.nn,
            "data_loader": self.dl,
        }

    def kill_all(self) -> None:
        """Tear-down: SIGKILL whatever still runs (only processes this job started)."""
        for proc in self.processes().values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def sigterm_and_time(procs: list[subprocess.Popen], limit_s: float) -> list[tuple[int, float]]:
    """SIGTERM every process at once; (exit code, seconds to exit) each; -9 after ``limit_s``."""
    started = time.monotonic()
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    out = []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, limit_s - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.append((proc.returncode, time.monotonic() - started))
    return out
