"""The single-process baseline takes another embedding module (the TorchRec peer's path):
a module that updates itself in backward gets no optimizer from the loop
(benchmarks/baseline.py, benchmarks/torchrec_peer.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from benchmarks.baseline import FlatEmbeddings, array_batches, train_single_process

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from torchrec_peer import torchrec_missing  # noqa: E402

SLOTS, DIM, ROWS = (5, 7, 11), 4, 512


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.top = nn.Linear(len(SLOTS) * DIM + 2, 1)

    def forward(self, dense: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        return self.top(torch.cat([*embeddings, dense[0]], dim=1))


class FusedButFrozen(FlatEmbeddings):
    """Claims to update itself inside backward, and does not: nothing may step it."""

    fused_optimizer = True


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    cat = np.stack([rng.integers(0, s, ROWS) for s in SLOTS], axis=1).astype(np.uint64)
    dense = rng.normal(size=(ROWS, 2)).astype(np.float32)
    label = (cat[:, 0] % 2).astype(np.float32).reshape(-1, 1)
    return cat, dense, label


def train(factory):
    cat, dense, label = data()
    made: list[nn.Module] = []

    def build():
        made.append(factory())
        return made[0]

    result = train_single_process(
        array_batches(cat, dense, label, 64),
        array_batches(cat, dense, label, 256),
        SLOTS,
        DIM,
        Model,
        embedding_lr=0.5,
        embedding_factory=build,
    )
    return result, made[0]


def test_a_fused_module_gets_no_optimizer_from_the_loop():
    torch.manual_seed(0)
    result, module = train(lambda: FusedButFrozen(SLOTS, DIM, (-0.01, 0.01)))
    assert result["steps"] == ROWS // 64
    torch.manual_seed(0)  # train_single_process seeds torch (seed=0) before building it
    fresh = FlatEmbeddings(SLOTS, DIM, (-0.01, 0.01))
    assert torch.equal(module.table.weight, fresh.table.weight)  # never stepped


def test_a_plain_module_from_the_factory_is_trained_by_adagrad():
    result, module = train(lambda: FlatEmbeddings(SLOTS, DIM, (-0.01, 0.01)))
    torch.manual_seed(0)
    fresh = FlatEmbeddings(SLOTS, DIM, (-0.01, 0.01))
    assert result["steps"] == ROWS // 64
    assert not torch.equal(module.table.weight, fresh.table.weight)


@pytest.mark.skipif(torchrec_missing() is not None, reason="TorchRec is installed by hand")
def test_torchrec_peer_trains_its_tables_inside_backward():
    from torchrec_peer import TorchRecEmbeddings

    def build():
        peer = TorchRecEmbeddings(
            SLOTS, DIM, (-0.01, 0.01), lr=0.5, eps=1e-10, initial_accumulator_value=0.25
        )
        states = [
            state
            for m in peer.collection._emb_modules
            for table in m._emb_module.split_optimizer_states()
            for state in table
        ]
        assert states and all(bool((s == 0.25).all()) for s in states)  # as torch's Adagrad
        return peer

    result, module = train(build)
    weights = [w.detach().clone() for w in module.collection.parameters()]
    assert result["steps"] == ROWS // 64
    assert np.mean(result["losses"][-2:]) < np.mean(result["losses"][:2])
    assert all(w.abs().max() > 0.01 for w in weights)  # moved beyond the init range


@pytest.mark.skipif(torchrec_missing() is None, reason="TorchRec is installed here")
def test_e2e_bench_torchrec_flag_without_torchrec_says_how_to_install():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "e2e_bench.py"), "--quick", "--torchrec"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        "--torchrec" in done.stderr and "pip install" in done.stderr and "torchrec" in done.stderr
    )
