"""The embedded-mode side of the end-to-end benchmark (``e2e_bench.py``):
``persia-launcher run --embedded`` runs ``e2e/train.py`` with the embedding PS and worker
engines and ``e2e/data_loader.py`` in one process (no Redis, no servers). Same scripts and
same JSON as the services side (``e2e_runs.run_pyrsia``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO
from e2e.procs import CpuSampler
from e2e_runs import BATCH, E2E, RUN_TIMEOUT_S, add_launch_figures, loader_env

from pyrsia.shared.constants import ENV_MALLOC_TUNING


def run_pyrsia_embedded(
    data_path: Path,
    configs: tuple[Path, Path],
    tmp: Path,
    *,
    threads: int | None,
    staleness: int | None,
    max_steps: int,
    tuned: bool = False,
    profile: bool = False,
    fused_adam: bool = False,
    malloc_tuning: str = "on",
) -> dict[str, Any]:
    """One training run in embedded mode, ``persia-launcher run --embedded``: train.py, the
    embedding PS and worker engines and data_loader.py in one process (no Redis, no servers).
    The same train.py and data_loader.py as :func:`run_pyrsia`, the same JSON;
    ``malloc_tuning`` as there."""
    result_path = tmp / f"result-embedded-{threads or 'default'}-{time.monotonic_ns()}.json"
    env = {
        "E2E_DATA": str(data_path),
        "E2E_RESULT": str(result_path),
        "E2E_BATCH": str(BATCH),
        **loader_env(threads, staleness, tuned),
        "E2E_MAX_STEPS": str(max_steps),
        "E2E_MIXED_PRECISION": "0",
        "E2E_DENSE_LR_SCALE": "1",
        "E2E_FUSED_ADAM": "1" if fused_adam else "0",
        "PYTHONUNBUFFERED": "1",
        ENV_MALLOC_TUNING: "1" if malloc_tuning == "on" else "0",
    }
    if profile:
        env["E2E_PROFILE"] = str(tmp / f"train-embedded-{threads or 'default'}.prof")
    log_path = tmp / f"embedded-{threads or 'default'}.log"
    sampler = CpuSampler()
    t_launch = time.time()
    code = _run_launcher(configs, env, log_path, sampler)
    if code != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"Pyrsia embedded run failed, exit code {code}\n{tail}")
    res = json.loads(result_path.read_text())
    # no services: nothing registered, no metrics
    add_launch_figures(res, sampler, t_launch, 0.0, {}, {"nn_worker": code})
    res.update(
        nn_workers=1,
        cpu_priority="normal",
        rank_batch=BATCH,
        malloc_tuning=malloc_tuning,
        mode="embedded",
    )
    return res


def _run_launcher(
    configs: tuple[Path, Path], env: dict[str, str], log_path: Path, sampler: CpuSampler
) -> int:
    """``persia-launcher run --embedded`` until it exits (killed after ``RUN_TIMEOUT_S``),
    its lines in ``log_path``, its CPU tracked by ``sampler``; its exit code."""
    argv = [
        sys.executable,
        "-m",
        "persia.launcher",
        "run",
        "--embedded",
        "--no-progress",
        "--nn-worker",
        str(E2E / "train.py"),
        "--data-loader",
        str(E2E / "data_loader.py"),
        "--embedding-config",
        str(configs[0]),
        "--global-config",
        str(configs[1]),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        sampler.track("nn_worker", proc.pid)  # the launcher and its one child
        sampler.start()
        try:
            return proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            sampler.stop()
