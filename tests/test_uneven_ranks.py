"""Two NN-worker ranks (gloo, started by the nn-worker launcher) with an odd number of batches.

A data loader (the data-loader launcher) sends 7 batches; batch b goes to rank b mod 2, so
rank 0 gets 4 and rank 1 gets 3. The training script is a plain PERSIA loop. Without the
per-step agreement of ``pyrsia/services/nn_worker/even_steps.py`` rank 0's fourth step waits in DDP's
all-reduce for a rank that has left. With it: both ranks take 4 synchronous steps (rank 1's
last one a shadow step with zero gradients), the dense parameters end identical, every
batch's embedding gradients are applied exactly once, and no batch is left on a worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from tests.nn_helpers import job_services
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
BATCHES = 7  # odd: rank 0 trains 4, rank 1 trains 3
SAMPLES = 4  # per batch: slot a has 4 ids, raw slot r 8 (i and i + 1 of each)
ID_ROWS_PER_BATCH = 4 + 8  # unique id rows each batch's gradients update on the PS

LOADER_SCRIPT = f"""
from persia.ctx import DataCtx
from tests.nn_helpers import make_batch

with DataCtx() as ctx:
    for k in range({BATCHES}):  # ids never repeat across batches: each row updated once
        ctx.send_data(make_batch([1000 * (k + 1) + 10 * s for s in range({SAMPLES})], seed=k))
"""

TRAIN_SCRIPT = """
import json, os, sys, torch
from persia.ctx import TrainCtx
from persia.data import DataLoader, StreamingDataset
from persia.distributed import DDPOption
from persia.embedding.optim import Adagrad
from persia.env import get_rank
from tests.nn_helpers import SmallModel

out, cap = sys.argv[1], int(sys.argv[3])
torch.manual_seed(get_rank())  # different initial weights: DDP broadcasts rank 0's
model = SmallModel()
option = DDPOption(backend="gloo", master_port=int(sys.argv[2]))
with TrainCtx(Adagrad(lr=0.05), torch.optim.Adam(model.parameters(), lr=0.01), model=model,
              mixed_precision=False, distributed_option=option) as ctx:
    steps = 0
    for batch in DataLoader(StreamingDataset(buffer_size=10)):
        output, labels = ctx.forward(batch)
        ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
        steps += 1
        if steps >= cap:
            break
    ctx.wait_for_gradients()
    torch.distributed.barrier()  # both ranks' embedding gradients are applied
    stats = ctx._run(ctx.session.client.stats()).to_wire()  # WorkerStats as the worker sent it
    state = {k: v.tolist() for k, v in model.state_dict().items()}
    json.dump({"steps": steps, "update_times": ctx.update_times, "stats": stats, "state": state},
              open(f"{out}/rank{get_rank()}.json", "w"))
"""


def run_job(tmp_path: Path, redis_url: str, cap: int) -> list[dict]:
    """The launcher's 2 gloo ranks plus one data loader; each rank's JSON report."""
    env = {"PERSIA_REDIS_URL": redis_url, "PERSIA_JOB_ID": f"uneven-{uuid.uuid4().hex[:8]}"}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    (tmp_path / "loader.py").write_text(LOADER_SCRIPT)
    run_env = {**os.environ, **env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    rank_log, loader_log = tmp_path / "ranks.log", tmp_path / "loader.log"
    with (
        job_services(env, tmp_path / "svc"),
        open(rank_log, "w") as rank_out,
        open(loader_log, "w") as loader_out,
    ):
        ranks = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "persia.launcher",
                "nn-worker",
                str(tmp_path / "train.py"),
                "--nproc-per-node",
                "2",
                "--master-port",
                str(free_port()),
                "--",
                str(tmp_path),
                str(free_port()),
                str(cap),
            ],
            cwd=REPO,
            env=run_env,
            stdout=rank_out,
            stderr=subprocess.STDOUT,
        )
        loader = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "persia.launcher",
                "data-loader",
                "--exit-when-done",
                str(tmp_path / "loader.py"),
            ],
            cwd=REPO,
            env=run_env,
            stdout=loader_out,
            stderr=subprocess.STDOUT,
        )
        try:
            ranks.wait(timeout=180)
            loader.wait(timeout=60)
        finally:
            for proc in (ranks, loader):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert ranks.returncode == 0, rank_log.read_text()[-5000:]
    assert loader.returncode == 0, loader_log.read_text()[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def applied_rows(report: dict) -> int:
    return sum(int(ps["updates_applied"]) for ps in report["stats"]["ps"])


def assert_same_dense_state(rank0: dict, rank1: dict) -> None:
    for name, value in rank0["state"].items():
        torch.testing.assert_close(
            torch.tensor(value), torch.tensor(rank1["state"][name]), rtol=0, atol=0
        )


@pytest.mark.timeout(300)
def test_odd_batch_count_over_two_ranks_takes_equal_steps_and_applies_each_batch_once(
    redis_server, tmp_path
):
    rank0, rank1 = run_job(tmp_path, redis_server.url, cap=1_000)
    assert (rank0["steps"], rank1["steps"]) == (4, 3)  # what each training loop saw
    assert rank0["update_times"] == rank1["update_times"] == 4  # synchronous steps taken
    assert_same_dense_state(rank0, rank1)  # the shadow step stepped the optimizer alike
    assert applied_rows(rank0) == BATCHES * ID_ROWS_PER_BATCH  # no batch lost, none twice
    assert rank0["stats"]["awaiting_gradients"] == 0 and rank0["stats"]["expired"] == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_loops_that_break_at_the_same_step_end_together(redis_server, tmp_path):
    # cap 2: both loops break after 2 steps; rank 0's remaining batches stay untrained
    rank0, rank1 = run_job(tmp_path, redis_server.url, cap=2)
    assert (rank0["steps"], rank1["steps"]) == (2, 2)
    assert rank0["update_times"] == rank1["update_times"] == 2
    assert applied_rows(rank0) == 4 * ID_ROWS_PER_BATCH
    assert_same_dense_state(rank0, rank1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_loop_that_breaks_ends_the_shadowing_ranks_loop(redis_server, tmp_path):
    # cap 4: rank 0 breaks after its 4th step while rank 1 (3 batches) shadows that step and
    # then waits for a 5th: it must hear that rank 0 stopped instead of waiting forever
    rank0, rank1 = run_job(tmp_path, redis_server.url, cap=4)
    assert (rank0["steps"], rank1["steps"]) == (4, 3)
    assert rank0["update_times"] == rank1["update_times"] == 4
    assert applied_rows(rank0) == BATCHES * ID_ROWS_PER_BATCH
    assert_same_dense_state(rank0, rank1)
