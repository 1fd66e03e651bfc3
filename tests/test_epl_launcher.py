"""Two NN-worker ranks through the launcher with EPL options: the whole TrainCtx path."""

from __future__ import annotations

import uuid

import pytest
import torch

from tests.nn_helpers import job_services
from tests.rank_launch import launch_two_ranks

TRAIN_SCRIPT = """
import json, sys, torch
import persia.epl as epl
from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.distributed import DDPOption
from persia.embedding.optim import Adagrad
from persia.env import get_rank
from tests.nn_helpers import SmallModel, make_batch

class Rank(IterableDataset):
    def __iter__(self):
        for k in range(6):
            yield make_batch([100 * get_rank() + k, 7 + k, 9 + k, 11 + k], seed=10 * get_rank() + k)

epl.init(epl.Config({"zero.level": "v1", "amp.level": "O1", "amp.loss_scale": 64,
                     "communication.gradients_reduce_method": "mean", "communication.max_splits": 2}))
torch.manual_seed(get_rank())
model = SmallModel()
option = DDPOption(backend="gloo", master_port=int(sys.argv[2]))
with TrainCtx(Adagrad(lr=0.05), torch.optim.Adam(model.parameters(), lr=0.05), model=model,
              mixed_precision=False, distributed_option=option) as ctx:
    assert isinstance(ctx.dense_optimizer, torch.distributed.optim.ZeroRedundancyOptimizer)
    for batch in DataLoader(Rank()):
        output, labels = ctx.forward(batch)
        ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
    ctx.dump_checkpoint(f"{sys.argv[1]}/ckpt")  # ZeRO shards consolidated on rank 0
    ctx.load_checkpoint(f"{sys.argv[1]}/ckpt")  # each rank keeps its shard of the whole state
    assert all(int(s["step"]) == 6 for s in ctx.dense_optimizer.optim.state.values())
    info = {"scale": ctx.grad_scaler.get_scale(), "steps": ctx.update_times,
            "state": sum(v.numel() for s in ctx.dense_optimizer.optim.state.values() for v in s.values() if v.dim())}
torch.save(model.state_dict(), f"{sys.argv[1]}/rank{get_rank()}.pt")
json.dump(info, open(f"{sys.argv[1]}/rank{get_rank()}.json", "w"))
"""


@pytest.mark.slow
def test_two_ranks_with_zero_and_amp_keep_identical_dense_parameters(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"epl-{uuid.uuid4().hex[:8]}"}
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    with job_services(env, tmp_path / "svc"):
        proc = launch_two_ranks(script, tmp_path, env, timeout_s=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    torch.manual_seed(0)
    from tests.nn_helpers import SmallModel

    initial = SmallModel().state_dict()
    for name in rank0:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0)
        assert not torch.equal(rank0[name], initial[name])
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(i["scale"] == 64.0 and i["steps"] == 6 for i in infos)
    total = sum(p.numel() for p in rank0.values()) * 2  # Adam: two moments per parameter
    assert sum(i["state"] for i in infos) == total and all(0 < i["state"] < total for i in infos)
    saved = torch.load(tmp_path / "ckpt" / "opt.pt", weights_only=True)
    assert sorted(saved["state"]) == [0, 1] and all(s["step"] == 6 for s in saved["state"].values())
