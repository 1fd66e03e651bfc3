"""Two NN-worker ranks on gloo, started by the nn-worker launcher: dense parameters stay equal."""

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

class Rank(IterableDataset):
    def __iter__(self):
        for k in range(6):  # each rank trains on its own batches
            yield make_batch([100 * get_rank() + k, 7 + k], seed=10 * get_rank() + k)

torch.manual_seed(get_rank())  # different initial weights: DDP must broadcast rank 0's
model = SmallModel()
option = DDPOption(backend="gloo", master_port=int(sys.argv[2]))
with TrainCtx(Adagrad(lr=0.05), torch.optim.SGD(model.parameters(), lr=0.5), model=model,
              mixed_precision=False, distributed_option=option) as ctx:
    for batch in DataLoader(Rank()):
        output, labels = ctx.forward(batch)
        ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
torch.save(model.state_dict(), f"{sys.argv[1]}/rank{get_rank()}.pt")
"""


@pytest.mark.slow
def test_two_gloo_ranks_keep_identical_dense_parameters(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"ddp-{uuid.uuid4().hex[:8]}"}
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    with job_services(env, tmp_path / "svc"):
        proc = launch_two_ranks(script, tmp_path, env, timeout_s=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    initial = SmallModelState.initial()
    for name in rank0:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0)
        assert not torch.equal(rank0[name], initial[name])  # it trained


class SmallModelState:
    @staticmethod
    def initial():
        from tests.nn_helpers import SmallModel

        torch.manual_seed(0)
        return SmallModel().state_dict()
