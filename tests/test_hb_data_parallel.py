"""hb.function(grad_nbuckets=N) / hb.wraps: data-parallel dense steps on two gloo ranks.

The ranks are started by `python -m persia.hb.run`. A DDP comm hook counts the
all-reduce buckets of every step; the trained parameters must equal a one-process
run on the union of the ranks' batches (the mean of the per-rank gradients).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from persia.hb._parallel import bucket_caps_mb, bucket_partition
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
STEPS = 4
LR = 0.1

COMMON = """
import torch

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
            torch.nn.Linear(16, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    def forward(self, x):
        return self.layers(x)

class PlainSGD(torch.optim.Optimizer):
    "A user's own optimizer class (not a torch.optim.SGD subclass)."
    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])

def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)

def initial_model():
    torch.manual_seed(0)
    return MLP()
"""

RANK_SCRIPT = (
    COMMON
    + """
import json, sys
import persia.hb as hb
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

out, steps, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rank = hb.context.rank
result = {}
for nbuckets in (1, 2, 3):
    @hb.function(grad_nbuckets=nbuckets)
    def build():
        torch.manual_seed(rank)  # different on each rank: DDP must broadcast rank 0's
        model = MLP()
        model.load_state_dict(initial_model().state_dict()) if rank == 0 else None
        return model

    model = build()
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
    calls = [0]
    def counting_hook(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)
    model.register_comm_hook(None, counting_hook)
    opt = hb.wraps(PlainSGD)(model.parameters(), lr=lr)
    per_step = []
    for step in range(steps):
        x, y = batch(rank, step)
        calls[0] = 0
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step(); opt.zero_grad()
        per_step.append(calls[0])
    result[f"ddp{nbuckets}"] = {"calls": per_step, "optimizer_allreduces": opt.allreduce_calls,
                                "params": [p.tolist() for p in model.module.parameters()]}

for nbuckets in (2, 3):  # grad_lazy_sync: no DDP, the wrapped optimizer all-reduces in step()
    with hb.scope(grad_nbuckets=nbuckets, grad_lazy_sync=True):
        model = hb.wraps(initial_model())
        assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)
        opt = hb.wraps(PlainSGD(model.parameters(), lr=lr))  # an instance works too
        per_step = []
        for step in range(steps):
            before = opt.allreduce_calls
            x, y = batch(rank, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step(); opt.zero_grad()
            per_step.append(opt.allreduce_calls - before)
    result[f"lazy{nbuckets}"] = {"calls": per_step, "params": [p.tolist() for p in model.parameters()]}

with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(result, f)
"""
)


def _reference_params() -> list[torch.Tensor]:
    namespace: dict = {}
    exec(COMMON, namespace)  # noqa: S102 - the same model and batches the ranks use
    model = namespace["initial_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        losses = []
        for rank in (0, 1):
            x, y = namespace["batch"](rank, step)
            losses.append(torch.nn.functional.mse_loss(model(x), y))
        (sum(losses) / 2).backward()  # the mean of the two ranks' gradients
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize(
    ("sizes", "n", "runs"),
    [
        ([4] * 8, 2, [4, 4]),
        ([4] * 8, 3, [3, 3, 2]),
        ([100, 4, 4, 4], 2, [1, 3]),
        ([4, 4], 5, [1, 1]),
        ([], 2, []),
    ],
)
def test_bucket_partition_cuts_contiguous_runs_of_near_equal_bytes(sizes, n, runs):
    assert bucket_partition(sizes, n) == runs


def test_bucket_caps_close_each_ddp_bucket_on_its_last_parameter():
    params = [torch.zeros(10), torch.zeros(5), torch.zeros(5)]  # 40, 20, 20 bytes
    caps = bucket_caps_mb(params, 2)
    # first bucket: 40 bytes both ways ([40] | [20, 20], reversed [20, 20] | [40]); the
    # last cap is the total, so the remainder stays one bucket
    assert [c * 1024 * 1024 for c in caps] == [40, 80]


@pytest.mark.slow
def test_grad_nbuckets_sets_the_all_reduce_buckets_of_two_gloo_ranks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.hb.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            sys.executable,
            str(script),
            str(tmp_path),
            str(STEPS),
            str(LR),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    reference = _reference_params()
    for nbuckets in (1, 2, 3):
        for rank in ranks:
            run = rank[f"ddp{nbuckets}"]
            assert run["calls"] == [nbuckets] * STEPS  # every step, before and after DDP's rebuild
            assert run["optimizer_allreduces"] == 0  # DDP reduced everything already
            for got, want in zip(run["params"], reference, strict=True):
                torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)
    for nbuckets in (2, 3):
        for rank in ranks:
            run = rank[f"lazy{nbuckets}"]
            assert run["calls"] == [nbuckets] * STEPS
            for got, want in zip(run["params"], reference, strict=True):
                torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)
