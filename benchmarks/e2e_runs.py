"""One run of each side of the end-to-end benchmark (``e2e_bench.py``), as a JSON-able dict.

- :func:`run_pyrsia`: the whole pipeline in services mode, every process real on loopback
  (redis-server, embedding PS, embedding worker, ``nn_workers`` NN-worker ranks of
  ``e2e/train.py`` and as many data loaders of ``e2e/data_loader.py``);
- ``e2e_embedded.run_pyrsia_embedded``: the same scripts in embedded mode, one process;
- ``e2e_baseline.run_baseline``: the single-process PyTorch baseline (``baseline.py``), or
  the TorchRec peer, on the same batches.

Each adds to the training script's JSON the start-up times, each process's CPU over the
training window (``/proc``) and the exit codes. Kept apart from ``e2e_bench.py`` (the
command line, the runs' plan and their summary) so each file has one job;
``benchmarks/rank_quality.py`` uses :func:`run_pyrsia` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import REPO, Cluster
from e2e.procs import CpuSampler, scrape_histograms

from pyrsia.shared.constants import (
    ENV_MALLOC_TUNING,
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
)
from tests.redis_server import free_port

E2E = REPO / "benchmarks" / "e2e"
BATCH = 1024
RUN_TIMEOUT_S = 1800.0


# ------------------------------------------------------------------------------- Pyrsia
def rank_rows(nn_workers: int, rank_batch: str) -> int:
    """Rows in one rank's batch: ``BATCH`` (``whole``) or its 1 / ``nn_workers`` (``split``)."""
    return BATCH if rank_batch == "whole" else BATCH // nn_workers


def loader_env(threads: int | None, staleness: int | None, tuned: bool) -> dict[str, str]:
    """train.py's environment for torch ``threads`` (None: torch's default, the launcher's
    ``OMP_NUM_THREADS`` untouched) and the DataLoader's options: ``staleness`` (None: not
    passed) and, ``tuned``, ``reproducible=True`` with a 16-batch ingress buffer; neither:
    the README's ``DataLoader(StreamingDataset(buffer_size=10))``."""
    env = {
        "E2E_STALENESS": "" if staleness is None else str(staleness),
        "E2E_REPRODUCIBLE": "1" if tuned else "",
        "E2E_BUFFER": "16" if tuned else "",
    }
    if threads is not None:
        env.update(E2E_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return env


def run_pyrsia(
    data_path: Path,
    configs: tuple[Path, Path],
    tmp: Path,
    *,
    threads: int | None,
    staleness: int | None,
    max_steps: int,
    tuned: bool = False,
    profile: bool = False,
    mixed_precision: bool = False,
    nn_workers: int = 1,
    cpu_priority: str = "normal",
    rank_batch: str = "whole",
    fused_adam: bool = False,
    malloc_tuning: str = "on",
    batch: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One training run through the whole pipeline; train.py's JSON plus CPU, metrics, exits.

    ``cpu_priority``: the PS, embedding worker and data loaders' ``--cpu-priority``
    (``normal`` as the Procfiles start them, or ``background``).

    ``nn_workers`` NN-worker ranks (``--nproc-per-node``; ``threads`` torch threads each) and
    as many data loaders, loader ``i`` feeding rank ``i`` (batch ``b`` goes to rank ``b mod
    n``), as ``Procfile.multi`` runs them. ``rank_batch`` (``whole`` or ``split``): see
    ``e2e_bench.py``'s docstring. ``malloc_tuning`` (``on``, Pyrsia's default, or ``off``):
    ``PERSIA_MALLOC_TUNING`` of the NN worker (``pyrsia/shared/allocator.py``). ``batch``:
    rows per rank batch instead of ``rank_batch``'s; ``extra_env``: more ``E2E_*`` settings
    of train.py, over these (``benchmarks/rank_quality.py`` uses both).
    """
    batch = rank_rows(nn_workers, rank_batch) if batch is None else batch
    lr_scale = nn_workers if rank_batch == "whole" else 1
    result_path = tmp / f"result-{nn_workers}x{threads or 'default'}-{time.monotonic_ns()}.json"
    env = {
        "E2E_DATA": str(data_path),
        "E2E_RESULT": str(result_path),
        "E2E_BATCH": str(batch),
        **loader_env(threads, staleness, tuned),
        "E2E_MAX_STEPS": str(max_steps),
        "E2E_MIXED_PRECISION": "1" if mixed_precision else "0",
        "E2E_DENSE_LR_SCALE": str(lr_scale),
        "E2E_FUSED_ADAM": "1" if fused_adam else "0",
        ENV_MALLOC_TUNING: "1" if malloc_tuning == "on" else "0",
        **(extra_env or {}),
    }
    if profile:
        env["E2E_PROFILE"] = str(tmp / f"train-{threads or 'default'}.prof")
    flags = server_flags(configs, cpu_priority)
    sampler = CpuSampler()
    t_launch = time.time()
    codes, metrics, t_services = _run_cluster(
        tmp, env, flags, sampler, threads=threads, nn_workers=nn_workers, cpu_priority=cpu_priority
    )
    res = _read_result(result_path, tmp, threads, nn_workers, codes)
    add_launch_figures(res, sampler, t_launch, t_services - t_launch, metrics, codes)
    res.update(nn_workers=nn_workers, cpu_priority=cpu_priority, rank_batch=batch)
    res["malloc_tuning"] = malloc_tuning
    return res


def server_flags(configs: tuple[Path, Path], cpu_priority: str) -> list[str]:
    """The PS's and the embedding worker's flags: the job's configs, a port the system picks,
    one replica, ``cpu_priority``."""
    return [
        "--embedding-config",
        str(configs[0]),
        "--global-config",
        str(configs[1]),
        "--port",
        "0",
        "--replica-index",
        "0",
        "--replica-size",
        "1",
        "--cpu-priority",
        cpu_priority,
    ]


def _run_cluster(
    tmp: Path,
    env: dict[str, str],
    flags: list[str],
    sampler: CpuSampler,
    *,
    threads: int | None,
    nn_workers: int,
    cpu_priority: str,
) -> tuple[dict[str, int | None], dict[str, Any], float]:
    """Redis, the servers and the clients until the NN worker exits (every child killed and
    reaped if one fails): the exit codes, the servers' ``/metrics`` histograms and the wall
    clock when the servers were started. ``sampler`` tracks every process."""
    with Cluster(log_dir=tmp) as cluster:
        sampler.track("redis", cluster.redis.proc.pid)
        full_env = {**os.environ, **cluster.env, **env, "PYTHONUNBUFFERED": "1"}
        logs = {
            name: open(tmp / f"{name}-{threads or 'default'}.log", "wb") for name in ("nn", "dl")
        }  # noqa: SIM115
        children: list[subprocess.Popen] = []
        try:
            # The NN worker and the data loader start first (they wait for the registry), so
            # their imports overlap the servers' start-up.
            nn, loaders = _start_clients(
                full_env, logs, children, sampler, nn_workers=nn_workers, cpu_priority=cpu_priority
            )
            ps = cluster.start(
                "pyrsia.services.embedding_ps", flags, role=ROLE_EMBEDDING_PS, wait_ready=False
            )
            sampler.track("embedding_ps", ps.proc.pid)
            ew = cluster.start(
                "pyrsia.services.embedding_worker",
                flags,
                role=ROLE_EMBEDDING_WORKER,
                wait_ready=False,
            )
            sampler.track("embedding_worker", ew.proc.pid)
            sampler.start()
            t_services = time.time()
            nn_code = nn.wait(timeout=RUN_TIMEOUT_S)
            dl_code = max((dl.wait(timeout=60) for dl in loaders), key=abs)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            for fh in logs.values():
                fh.close()
        metrics = {
            "embedding_worker": scrape_histograms(ew.url),
            "embedding_ps": scrape_histograms(ps.url),
        }
        sampler.stop()
        codes = {"nn_worker": nn_code, "data_loader": dl_code}
        codes.update(zip(("embedding_worker", "embedding_ps"), cluster.stop(), strict=True))
    return codes, metrics, t_services


def _start_clients(
    full_env: dict[str, str],
    logs: dict[str, Any],
    children: list[subprocess.Popen],
    sampler: CpuSampler,
    *,
    nn_workers: int,
    cpu_priority: str,
) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    """The NN worker (``nn_workers`` ranks of train.py) and one data loader per rank, each
    added to ``children`` (for the caller's clean-up) and tracked by ``sampler``."""
    launcher = [sys.executable, "-m", "persia.launcher"]
    nn = subprocess.Popen(
        [
            *launcher,
            "nn-worker",
            str(E2E / "train.py"),
            "--nproc-per-node",
            str(nn_workers),
            "--master-port",
            str(free_port()),
        ],
        cwd=REPO,
        env={**full_env, "E2E_DDP_PORT": str(free_port())},
        stdout=logs["nn"],
        stderr=subprocess.STDOUT,
    )
    children.append(nn)
    sampler.track("nn_worker", nn.pid)
    loaders = []
    for i in range(nn_workers):
        loaders.append(
            subprocess.Popen(
                [
                    *launcher,
                    "data-loader",
                    "--exit-when-done",
                    "--replica-index",
                    str(i),
                    "--replica-size",
                    str(nn_workers),
                    "--cpu-priority",
                    cpu_priority,
                    str(E2E / "data_loader.py"),
                ],
                cwd=REPO,
                env=full_env,
                stdout=logs["dl"],
                stderr=subprocess.STDOUT,
            )
        )
        children.append(loaders[-1])
        name = "data_loader" if nn_workers == 1 else f"data_loader_{i}"
        sampler.track(name, loaders[-1].pid)
    return nn, loaders


def _read_result(
    result_path: Path, tmp: Path, threads: int | None, nn_workers: int, codes: dict[str, int | None]
) -> dict[str, Any]:
    """train.py's JSON (with each rank's own under ``ranks`` on several ranks); a run with a
    non-zero exit or no JSON raises, with the tails of the NN worker's and loaders' logs."""
    bad = {k: v for k, v in codes.items() if v != 0}
    if bad or not result_path.exists():
        tail = (tmp / f"nn-{threads or 'default'}.log").read_text(errors="replace")[-3000:]
        tail_dl = (tmp / f"dl-{threads or 'default'}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(
            f"Pyrsia run failed, exit codes {codes}\n--- nn worker\n{tail}\n--- data loader\n{tail_dl}"
        )
    res = json.loads(result_path.read_text())
    if nn_workers > 1:  # each rank's own samples, steps, phases and thread CPU
        res["ranks"] = [
            json.loads(Path(f"{result_path}.rank{r}").read_text()) for r in range(nn_workers)
        ]
    return res


def add_launch_figures(
    res: dict[str, Any],
    sampler: CpuSampler,
    t_launch: float,
    services_registered_s: float,
    metrics: dict[str, Any],
    codes: dict[str, int | None],
) -> None:
    """Start-up times from ``t_launch`` (first batch, servers started, TrainCtx entered),
    each process's CPU over the training window, the servers' metrics, the exit codes."""
    res["startup_s"] = res["t_first"] - t_launch
    res["services_registered_s"] = services_registered_s
    res["ctx_ready_s"] = res["t_ready"] - t_launch
    res["cpu"] = sampler.window(res["t_first"], res["t_end"])
    res["cpu_s"] = sum(v["cpu_s"] for v in res["cpu"].values())
    res["metrics"] = metrics
    res["exit_codes"] = codes
