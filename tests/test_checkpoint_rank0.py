"""PERSIA's example checkpoints on rank 0 only: with two gloo ranks that must not hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from tests.nn_helpers import job_services
from tests.redis_server import free_port

TRAIN_SCRIPT = """
import sys, torch
from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.distributed import DDPOption
from persia.embedding.optim import Adagrad
from persia.env import get_rank
from tests.nn_helpers import SmallModel, make_batch

class Batches(IterableDataset):
    def __init__(self, first, count):
        super().__init__()
        self.first, self.count = first, count
    def __iter__(self):
        for k in range(self.first, self.first + self.count):
            yield make_batch([100 * get_rank() + k, 7 + k], seed=10 * get_rank() + k)

def train(ctx, first, count):
    for batch in DataLoader(Batches(first, count)):
        output, labels = ctx.forward(batch)
        ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))

out = sys.argv[1]
model = SmallModel()
option = DDPOption(backend="gloo", master_port=int(sys.argv[2]))
with TrainCtx(Adagrad(lr=0.05), torch.optim.SGD(model.parameters(), lr=0.5), model=model,
              mixed_precision=False, distributed_option=option) as ctx:
    train(ctx, 0, 3)
    if get_rank() == 0:  # as PERSIA's adult-income train.py does
        ctx.dump_checkpoint(f"{out}/ckpt")
        ctx.load_checkpoint(f"{out}/ckpt")
    train(ctx, 3, 2)  # DDP all-reduces again: both ranks are still in step
    if get_rank() == 0:
        ctx.dump_checkpoint(f"{out}/ckpt_end")
torch.save(model.state_dict(), f"{out}/rank{get_rank()}.pt")
"""


def run_group(
    argv: list[str], *, cwd: Path, env: dict, timeout_s: float
) -> subprocess.CompletedProcess:
    """Run the launcher in its own process group; a hang fails the test and kills every rank."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
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


@pytest.mark.slow
def test_checkpoint_on_rank_zero_only_does_not_hang(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"r0ck-{uuid.uuid4().hex[:8]}"}
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    repo = Path(__file__).resolve().parents[1]
    with job_services(env, tmp_path / "svc"):
        proc = run_group(
            [
                sys.executable,
                "-m",
                "persia.launcher",
                "nn-worker",
                str(script),
                "--nproc-per-node",
                "2",
                "--master-port",
                str(free_port()),
                "--",
                str(tmp_path),
                str(free_port()),
            ],
            cwd=repo,
            env={**os.environ, **env, "PYTHONPATH": str(repo)},
            timeout_s=90,
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("ckpt", "ckpt_end"):
        assert (tmp_path / name / "dense.pt").is_file() and (tmp_path / name / "opt.pt").is_file()
        assert any(p.is_dir() or p.suffix != ".pt" for p in (tmp_path / name).iterdir())
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name in rank0:  # the load restored rank 0's own weights: the ranks stayed equal
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0)
