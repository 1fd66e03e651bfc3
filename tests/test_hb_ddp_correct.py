"""HybridBackend data parallelism is correct on two gloo ranks, or refused.

Each multi-rank test starts two ranks directly (``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` / ``MASTER_PORT`` in their environment, as torch's launcher sets
them), each with a different seed and different batches, and compares what they
wrote. Written the way HybridBackend's docs show it: a model and a built-in
``torch.optim.SGD`` made inside ``hb.scope``; an ``hb.function`` returning
``(model, optimizer)``; ``grad_lazy_sync``; ``hb.wraps(optimizer)`` alone.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from persia.hb._parallel import bucket_caps_mb
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
STEPS = 3
LR = 0.1

COMMON = """
import torch

class Net(torch.nn.Module):
    "Small layers first, a large one in the middle: a shape whose buckets depend on direction."
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)  # a buffer (running stats) besides the parameters
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 64)
        self.c = torch.nn.Linear(64, 64)
        self.d = torch.nn.Linear(64, 1)

    def forward(self, x):
        h = torch.relu(self.a(self.norm(x)))
        return self.d(torch.relu(self.c(torch.relu(self.b(h)))))

def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)

def train(model, optimizer, rank, steps):
    for step in range(steps):
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

def params(model):
    model = getattr(model, "module", model)
    return {k: v.tolist() for k, v in model.named_parameters()}

def buffers(model):
    model = getattr(model, "module", model)
    return {k: v.tolist() for k, v in model.named_buffers()}
"""

HEADER = (
    COMMON
    + """
import json, sys
import persia.hb as hb
out, steps, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rank = hb.context.rank
result = {}
"""
)

FOOTER = """
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(result, f)
hb.context.destroy_process_group()
"""

SCOPE_SCRIPT = (
    HEADER
    + """
torch.manual_seed(rank)  # a different start on each rank: rank 0's must win
with hb.scope(grad_nbuckets=2):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # torch's own, not hb.wraps
train(model, optimizer, rank, steps)
result["scope"] = params(model)

@hb.function(grad_nbuckets=2)
def build():
    torch.manual_seed(100 + rank)
    model = Net()
    return model, torch.optim.SGD(model.parameters(), lr=lr)

model, optimizer = build()
train(model, optimizer, rank, steps)
result["function"] = params(model)
"""
    + FOOTER
)

BUCKETS_SCRIPT = (
    HEADER
    + """
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
for unused in (False, True):
    for n in (1, 2, 3, 4):
        with hb.scope(grad_nbuckets=n, find_unused_parameters=unused):
            model = hb.wraps(Net())
        calls = [0]
        def counting_hook(state, bucket):
            calls[0] += 1
            return default_hooks.allreduce_hook(state, bucket)
        model.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        per_step = []
        for step in range(steps):  # step 0: DDP's first buckets; then: after its rebuild
            calls[0] = 0
            x, y = batch(rank, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            per_step.append(calls[0])
        result[f"{n}-{unused}"] = per_step
"""
    + FOOTER
)

BROADCAST_SCRIPT = (
    HEADER
    + """
torch.manual_seed(rank)
with hb.scope(grad_lazy_sync=True):
    net = Net()
    net.norm.running_mean.fill_(float(rank))  # a buffer that differs too
    model = hb.wraps(net)  # no DDP: the optimizer all-reduces in step()
result["lazy_start"] = params(model)
result["lazy_start_buffers"] = buffers(model)
optimizer = hb.wraps(torch.optim.SGD)(model.parameters(), lr=lr)
train(model, optimizer, rank, steps)
result["lazy"] = params(model)

torch.manual_seed(10 + rank)
model = Net()  # made outside any scope
optimizer = hb.wraps(torch.optim.SGD(model.parameters(), lr=lr))  # the wrapped optimizer alone
result["wraps_start"] = params(model)
train(model, optimizer, rank, steps)
result["wraps"] = params(model)
"""
    + FOOTER
)


def _start_ranks(tmp_path: Path, script: str) -> list[tuple[int, str]]:
    """Run ``script`` on two gloo ranks; (exit code, stderr) of each."""
    path = tmp_path / "rank_script.py"
    path.write_text(script)
    port = str(free_port())
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "HB_COMM_DEFAULT": "gloo",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(path), str(tmp_path), str(STEPS), str(LR)],
            cwd=REPO,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=60))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [(proc.returncode, err) for proc, (_, err) in zip(procs, outputs, strict=True)]


def _run_ranks(tmp_path: Path, script: str) -> list[dict]:
    """Run ``script`` on two gloo ranks; returns what each rank wrote."""
    for code, err in _start_ranks(tmp_path, script):
        assert code == 0, err[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _net(seed: int):
    """The ranks' model as rank ``seed`` would make it, and the shared helpers."""
    namespace: dict = {}
    exec(COMMON, namespace)  # noqa: S102 - the model and batches the ranks use
    torch.manual_seed(seed)
    return namespace["Net"](), namespace


def _reference(seed: int) -> dict:
    """One process, rank 0's start, the mean of the two ranks' gradients each step."""
    model, namespace = _net(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        for rank in (0, 1):  # each rank's BatchNorm sees its own batch; its stats stay local
            x, y = namespace["batch"](rank, step)
            loss = torch.nn.functional.mse_loss(model(x), y) / 2
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.tolist() for k, v in model.named_parameters()}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(torch.tensor(a[name]), torch.tensor(b[name])), name


def _assert_params_close(got: dict, want: dict) -> None:
    for name, value in want.items():
        torch.testing.assert_close(
            torch.tensor(got[name]), torch.tensor(value), rtol=1e-5, atol=1e-6
        )


def test_model_and_torch_sgd_made_in_scope_or_returned_by_function_are_data_parallel(tmp_path):
    rank0, rank1 = _run_ranks(tmp_path, SCOPE_SCRIPT)
    for case, seed in (("scope", 0), ("function", 100)):
        _assert_same(rank0[case], rank1[case])  # bit-identical on both ranks
        _assert_params_close(rank0[case], _reference(seed))  # rank 0's start, mean gradients


def test_grad_nbuckets_gives_that_many_all_reduces_every_step(tmp_path):
    for rank in _run_ranks(tmp_path, BUCKETS_SCRIPT):
        for unused in (False, True):
            for n in (1, 2, 3, 4):
                assert rank[f"{n}-{unused}"] == [n] * STEPS, (n, unused)


def test_lazy_sync_and_a_wrapped_optimizer_start_from_rank_0s_parameters(tmp_path):
    rank0, rank1 = _run_ranks(tmp_path, BROADCAST_SCRIPT)
    for case in ("lazy_start", "lazy_start_buffers", "lazy", "wraps_start", "wraps"):
        _assert_same(rank0[case], rank1[case])
    start, _ = _net(0)
    _assert_same(rank1["lazy_start"], {k: v.tolist() for k, v in start.named_parameters()})
    assert rank1["lazy_start_buffers"]["norm.running_mean"] == [0.0] * 4  # rank 0's buffer
    wraps_start, _ = _net(10)
    _assert_same(rank1["wraps_start"], {k: v.tolist() for k, v in wraps_start.named_parameters()})
    _assert_params_close(rank0["lazy"], _reference(0))
    _assert_params_close(rank0["wraps"], _reference(10))


REBUILD_SCRIPT = (
    HEADER
    + """
class Shuffled(Net):
    "Net with the layer forward uses first declared last: backward's order is not the reverse."
    def __init__(self):
        super().__init__()
        del self.norm
        self.norm = torch.nn.BatchNorm1d(4)

for cls in (Net, Shuffled):
    print(f"model {cls.__name__}", file=sys.stderr, flush=True)
    with hb.scope(grad_nbuckets=4):
        model = hb.wraps(cls())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    train(model, optimizer, rank, 4)  # the check reads DDP before the 4th forward
"""
    + FOOTER
)


def test_a_bucket_count_changed_by_ddps_rebuild_is_reported(tmp_path):
    for code, err in _start_ranks(tmp_path, REBUILD_SCRIPT):
        assert code == 0, err[-4000:]
        declared_in_order, shuffled = err.split("model Shuffled")
        assert "after its one rebuild DDP makes" not in declared_in_order
        assert "grad_nbuckets=4: after its one rebuild DDP makes 3 all-reduces per step" in shuffled
        assert "declare them in the order forward uses them" in shuffled


MISMATCH_SCRIPT = (
    HEADER
    + """
from pyrsia.shared.errors import ConfigError
try:
    with hb.scope():
        model = torch.nn.Linear(4, 4 + rank)  # not the same model on both ranks
except ConfigError as exc:
    print(f"refused: {exc}", file=sys.stderr)
    sys.exit(3)
"""
    + FOOTER
)


def test_ranks_that_made_different_parameters_in_a_scope_are_refused_on_every_rank(tmp_path):
    for code, err in _start_ranks(tmp_path, MISMATCH_SCRIPT):
        assert code == 3, err[-4000:]
        assert (
            "refused: the parameters and buffers made in hb.scope: the ranks hold different" in err
        )
        assert "build the same model on every rank" in err


def _ddp_bucket_count(sizes: list[int], caps_mb: list[float]) -> int:
    """How DDP's ``_compute_bucket_assignment_by_size`` cuts ``sizes`` (one dtype): a bucket
    closes as soon as its bytes reach its cap, ``int(cap_mb * 2**20)``; the last cap repeats."""
    caps = [int(c * 1024 * 1024) for c in caps_mb]
    count, filled = 0, 0
    for size in sizes:
        filled += size
        if filled >= caps[min(count, len(caps) - 1)]:
            count, filled = count + 1, 0
    return count + (1 if filled else 0)


@pytest.mark.parametrize("seed", range(20))
def test_bucket_caps_give_n_buckets_in_registration_order_and_in_reverse(seed):
    """DDP cuts buckets in registration order first, and in backward's order (about the
    reverse) after its rebuild; the same caps must give ``n`` buckets both ways."""
    rng = random.Random(seed)
    for _ in range(50):
        sizes = [4 * rng.choice([1, 4, 16, 64, 256, 4096]) for _ in range(rng.randint(1, 12))]
        params = [torch.zeros(s // 4) for s in sizes]
        for n in range(1, 7):
            caps = bucket_caps_mb(params, n)
            want = min(n, len(sizes))
            assert _ddp_bucket_count(sizes, caps) == want, (sizes, n)
            assert _ddp_bucket_count(sizes[::-1], caps) == want, (sizes, n)
