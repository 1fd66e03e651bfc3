"""PERSIA's example checkpoints on rank 0 only: with two gloo ranks that must not hang."""

from __future__ import annotations

import uuid

import pytest
import torch

from tests.nn_helpers import job_services
from tests.rank_launch import launch_two_ranks

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


@pytest.mark.slow
def test_checkpoint_on_rank_zero_only_does_not_hang(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"r0ck-{uuid.uuid4().hex[:8]}"}
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    with job_services(env, tmp_path / "svc"):
        proc = launch_two_ranks(script, tmp_path, env, timeout_s=90)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("ckpt", "ckpt_end"):
        assert (tmp_path / name / "dense.pt").is_file() and (tmp_path / name / "opt.pt").is_file()
        assert any(p.is_dir() or p.suffix != ".pt" for p in (tmp_path / name).iterdir())
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name in rank0:  # the load restored rank 0's own weights: the ranks stayed equal
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0)
