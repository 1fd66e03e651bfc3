"""Shared pieces of the EPL tests: models, inputs, a TrainCtx that is built but not entered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from persia.ctx import TrainCtx
from persia.embedding.optim import SGD
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]


class Block(nn.Module):
    """A residual MLP block (the "repeated block" gradient checkpoint looks for)."""

    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class DeepModel(nn.Module):
    """``model(non_id, embeddings)``: dense (b, 4) + two slots (b, 6) -> 4 blocks -> a logit."""

    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.inp = nn.Linear(4 + 2 * 6, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.out = nn.Linear(width, 1)

    def forward(self, non_id, embeddings):
        x = torch.cat([non_id[0], *embeddings], dim=1)
        return self.out(self.blocks(self.inp(x)))


def inputs(batch: int = 12, seed: int = 0):
    """``(non_id, embeddings, labels)``; embeddings require grad, like TrainCtx's."""
    gen = torch.Generator().manual_seed(seed)
    non_id = [torch.randn(batch, 4, generator=gen)]
    embeddings = [torch.randn(batch, 6, generator=gen).requires_grad_() for _ in range(2)]
    labels = torch.randint(0, 2, (batch, 1), generator=gen).float()
    return non_id, embeddings, labels


def make_ctx(model: nn.Module, config=None, optimizer=None, **kwargs) -> TrainCtx:
    """A TrainCtx with the EPL plan installed (entering it would connect to the servers)."""
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainCtx(
        SGD(lr=0.1), optimizer, model=model, mixed_precision=False, epl_config=config, **kwargs
    )


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


@contextmanager
def saved_activation_meter():
    """Peak bytes of tensors autograd holds for backward (live, freed when the graph goes)."""
    meter = {"live": 0, "peak": 0}

    def release(nbytes):
        meter["live"] -= nbytes

    def pack(t):
        nbytes = t.numel() * t.element_size()
        meter["live"] += nbytes
        meter["peak"] = max(meter["peak"], meter["live"])
        held = _Held(t)
        weakref.finalize(held, release, nbytes)
        return held

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda held: held.tensor):
        yield meter


def peak_temporary_bytes(fn) -> int:
    """Peak bytes allocated and not yet freed while ``fn()`` runs (torch profiler, CPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def run_two_gloo_ranks(job_module: str, out: Path) -> list[dict]:
    """Run ``python -m job_module out`` as ranks 0 and 1 (gloo, a free port); return rank*.json.

    A rank left in a collective after its peer failed is killed, so a failure is reported
    with both ranks' log tails instead of hanging the suite.
    """
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", job_module, str(out)],
            cwd=REPO,
            env={
                **os.environ,
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_PORT": str(port),
                "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=100)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
