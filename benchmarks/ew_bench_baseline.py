"""The embedding worker benchmark's yardstick (``ew_bench.py``): one PyTorch process training
the same Criteo-shaped batches (``ew_workload.py``) with a summed ``EmbeddingBag`` (sparse
Adagrad) and an MLP (Adam), at 1 and at torch's default thread count.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from _common import summarize
from ew_workload import DIM, N_DENSE, SLOTS, make_ids
from torch import nn


class CriteoModel(nn.Module):
    """One summed EmbeddingBag table (slot-offset rows) + MLP 512-256-1 on dense + pooled."""

    def __init__(self, rows_per_slot: int) -> None:
        super().__init__()
        self.rows_per_slot = rows_per_slot
        self.bag = nn.EmbeddingBag(rows_per_slot * SLOTS, DIM, mode="sum", sparse=True)
        nn.init.uniform_(self.bag.weight, -0.01, 0.01)
        self.mlp = nn.Sequential(
            nn.Linear(N_DENSE + SLOTS * DIM, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
        )

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        """(batch, SLOTS) ids -> flat row indices: id mod rows_per_slot, offset per slot."""
        base = np.arange(SLOTS, dtype=np.int64) * self.rows_per_slot
        return torch.from_numpy(
            ((ids % np.uint64(self.rows_per_slot)).astype(np.int64) + base).reshape(-1)
        )

    def forward(self, rows: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        batch = dense.shape[0]
        offsets = torch.arange(0, batch * SLOTS, dtype=torch.int64)  # one id per bag
        pooled = self.bag(rows, offsets).reshape(batch, SLOTS * DIM)
        return self.mlp(torch.cat([dense, pooled], dim=1))


def run_baseline(batch: int, n_batches: int, repeats: int, rows_per_slot: int) -> dict[str, Any]:
    """Per-batch step time of the PyTorch model over ``repeats`` passes (after 3 warm-up
    steps), and the samples/s it gives."""
    torch.manual_seed(0)
    model = CriteoModel(rows_per_slot)
    emb_opt = torch.optim.Adagrad(model.bag.parameters(), lr=1e-2, initial_accumulator_value=1e-2)
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(2)
    data = [
        (
            ids,
            rng.normal(size=(batch, N_DENSE)).astype(np.float32),
            rng.integers(0, 2, (batch, 1)).astype(np.float32),
        )
        for ids in make_ids(batch, n_batches, seed=0)
    ]

    def step(ids: np.ndarray, dense: np.ndarray, label: np.ndarray) -> None:
        logits = model(model.rows(ids), torch.from_numpy(dense))
        loss = loss_fn(logits, torch.from_numpy(label))
        emb_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        emb_opt.step()
        dense_opt.step()

    times = []
    with torch.sparse.check_sparse_tensor_invariants(enable=False):
        for b in data[: min(3, n_batches)]:
            step(*b)  # warm-up
        for _ in range(repeats):
            for b in data:
                t0 = time.perf_counter()
                step(*b)
                times.append(time.perf_counter() - t0)
    per_batch = summarize(times)
    return {
        "torch_threads": torch.get_num_threads(),
        "rows_per_slot": rows_per_slot,
        "step_s": per_batch,
        "samples_per_s": batch / per_batch["median_s"],
        "samples_per_s_best": batch / per_batch["min_s"],
    }


def best_baseline(
    batch: int, n_batches: int, repeats: int, rows: int, quick: bool
) -> dict[str, Any]:
    """The PyTorch step at 1 and at torch's default thread count (1 only with ``quick``);
    the faster one is the yardstick, with every count's samples/s under ``by_threads``."""
    print("pytorch single-process step:", flush=True)
    default_threads = torch.get_num_threads()
    candidates = []
    for threads in sorted({1, default_threads} if not quick else {1}):
        torch.set_num_threads(threads)
        candidates.append(run_baseline(batch, n_batches, repeats, rows))
    torch.set_num_threads(default_threads)
    base = max(candidates, key=lambda b: b["samples_per_s"])  # the faster one is the yardstick
    base["by_threads"] = {c["torch_threads"]: c["samples_per_s"] for c in candidates}
    return base
