"""The processes of one feed-rate run (``feed_rate.py``): Redis, the PS shards and the
embedding workers (from the working tree or a ``git archive``), the NN worker
(``e2e/feed_train.py``) and the data loader (``e2e/feed_data_loader.py``), every one tracked
by the CPU sampler, until the NN worker and the data loader exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from _common import REPO, Cluster
from e2e.procs import CpuSampler

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from tests.redis_server import free_port

E2E = REPO / "benchmarks" / "e2e"
RUN_TIMEOUT_S = 1200.0
LAUNCHER = [sys.executable, "-m", "persia.launcher"]


def run_job(
    tmp: Path,
    tag: str,
    env: dict[str, str],
    flags: list[str],
    sampler: CpuSampler,
    from_source: list[str] | None,
    ps_replicas: int = 1,
    ew_replicas: int = 1,
) -> dict[str, int | None]:
    """Redis, ``ps_replicas`` PS shards and ``ew_replicas`` embedding workers (run by
    ``from_source`` when given), the NN worker (``feed_train.py``) and the data loader until
    both of those exit (every child killed and reaped if one fails); the exit codes.
    ``sampler`` tracks every process (PS shard i as ``embedding_ps.i``, embedding worker i as
    ``embedding_worker.i``). The data loader starts once every embedding worker has
    registered: it deals its batches among those it finds."""
    with Cluster(log_dir=tmp) as cluster:
        full_env = {**os.environ, **cluster.env, **env}
        logs = {name: open(tmp / f"{name}-{tag}.log", "wb") for name in ("nn", "dl")}  # noqa: SIM115
        children: list[subprocess.Popen] = []
        started: list[str] = []  # in start order: the cluster stops them newest first
        try:
            nn = _start(children, sampler, "nn_worker", _nn_argv(), full_env, logs["nn"])
            replicas = {"embedding_ps": ps_replicas, "embedding_worker": ew_replicas}
            started = _start_services(cluster, flags, from_source, replicas, sampler)
            dl = _start(children, sampler, "data_loader", _dl_argv(), full_env, logs["dl"])
            sampler.start()
            nn_code, dl_code = wait_both(nn, dl)
        finally:
            _end(children, logs.values(), sampler)
        codes = {"nn_worker": nn_code, "data_loader": dl_code}
        codes.update(zip(reversed(started), cluster.stop(), strict=True))
    return codes


def _nn_argv() -> list[str]:
    """The NN worker: one rank of ``feed_train.py`` with its rendezvous on a free port."""
    train, port = str(E2E / "feed_train.py"), str(free_port())
    return [*LAUNCHER, "nn-worker", train, "--nproc-per-node", "1", "--master-port", port]


def _dl_argv() -> list[str]:
    """The one data loader, exiting once its data is sent."""
    return [
        *LAUNCHER,
        "data-loader",
        "--exit-when-done",
        "--replica-index",
        "0",
        "--replica-size",
        "1",
        str(E2E / "feed_data_loader.py"),
    ]


def _start(
    children: list[subprocess.Popen],
    sampler: CpuSampler,
    name: str,
    argv: list[str],
    env: dict[str, str],
    log: IO[bytes],
) -> subprocess.Popen:
    """Start ``argv`` in the repository with its output in ``log``, tracked as ``name``."""
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    children.append(proc)
    sampler.track(name, proc.pid)
    return proc


def _start_services(
    cluster: Cluster,
    flags: list[str],
    from_source: list[str] | None,
    replicas: dict[str, int],
    sampler: CpuSampler,
) -> list[str]:
    """Every PS shard, then every embedding worker (``replicas``: how many of each), without
    waiting for them; their names (``embedding_ps.0``, ...) in start order."""
    roles = {"embedding_ps": ROLE_EMBEDDING_PS, "embedding_worker": ROLE_EMBEDDING_WORKER}
    started = []
    for service, count in replicas.items():
        for i in range(count):
            svc = cluster.start(
                f"pyrsia.services.{service}",
                [*flags, "--replica-index", str(i), "--replica-size", str(count)],
                role=roles[service],
                replica_index=i,
                wait_ready=False,
                python_args=from_source,
            )
            started.append(f"{service}.{i}")
            sampler.track(started[-1], svc.proc.pid)
    return started


def _end(children: list[subprocess.Popen], logs, sampler: CpuSampler) -> None:
    """Kill and reap the children still running, close their logs, stop the sampler."""
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()
    for fh in logs:
        fh.close()
    sampler.stop()


def wait_both(nn: subprocess.Popen, dl: subprocess.Popen) -> tuple[int | None, int | None]:
    """Exit codes of the NN worker and the data loader; a data loader that fails ends the
    wait at once (the NN worker would wait for its batches until ``RUN_TIMEOUT_S``)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if nn.poll() is not None:
            try:
                return nn.returncode, dl.wait(timeout=60)
            except subprocess.TimeoutExpired:
                return nn.returncode, None
        if dl.poll() not in (None, 0):
            return None, dl.returncode
        time.sleep(0.2)
    return None, dl.poll()
