"""Two NN-worker ranks of a test's ``train.py``, started by ``persia-launcher nn-worker``.

The slow multi-rank tests (EPL, DDP, rank-0 checkpoints) run their script the same way: two
ranks on this node, torch's rendezvous on a free port, the script given the test's output
folder and a second free port (its ``DDPOption``'s ``master_port``), the repository on
``PYTHONPATH`` so that the ranks import ``tests.nn_helpers``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]


def nn_worker_argv(
    script: Path, nproc: int, *, master_port: int | None = None, script_args: tuple[str, ...] = ()
) -> list[str]:
    """The ``persia-launcher nn-worker`` command line running ``script`` as ``nproc`` ranks
    (torch's rendezvous on ``master_port`` when given), ``script_args`` after ``--``."""
    argv = [sys.executable, "-m", "persia.launcher", "nn-worker", str(script)]
    argv += ["--nproc-per-node", str(nproc)]
    if master_port is not None:
        argv += ["--master-port", str(master_port)]
    return argv + (["--", *script_args] if script_args else [])


def launch_two_ranks(
    script: Path, out_dir: Path, env: dict[str, str], *, timeout_s: float
) -> subprocess.CompletedProcess:
    """Run ``script`` as two ranks with ``env`` added to this process's environment; its
    output, captured. The launcher runs in its own process group: a hang fails the test and
    kills every rank."""
    argv = nn_worker_argv(
        script, 2, master_port=free_port(), script_args=(str(out_dir), str(free_port()))
    )
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # torchrun gives each rank its own session; on SIGTERM it stops them itself.
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(
            f"the ranks hung for {timeout_s:.0f}s (a collective waiting for rank 1?)\n{err[-3000:]}"
        )
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
