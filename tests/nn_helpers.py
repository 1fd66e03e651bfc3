"""Shared pieces of the NN-worker / context tests: a job with real services, batches, models."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from persia.embedding.data import (
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
    PersiaBatch,
)
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from tests.service_procs import ServiceProc

EMBEDDING_CONFIG = """\
slots_config:
  a:
    dim: 4
  r:
    dim: 3
    embedding_summation: false
    sample_fixed_size: 2
"""


@contextmanager
def job_services(
    env: dict[str, str],
    workdir: Path,
    ps_replicas: int = 1,
    embedding_config: str = EMBEDDING_CONFIG,
):
    """PS replicas and one embedding worker for ``env``'s job; every process must exit 0."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "embedding_config.yml"
    config.write_text(embedding_config)
    procs: list[ServiceProc] = []
    try:
        for i in range(ps_replicas):
            procs.append(
                ServiceProc.start(
                    "pyrsia.services.embedding_ps",
                    ["--port", "0", "--replica-index", str(i), "--replica-size", str(ps_replicas)],
                    env,
                    role=ROLE_EMBEDDING_PS,
                    replica_index=i,
                    wait_ready=False,
                    log_dir=workdir,
                )
            )
        procs.append(
            ServiceProc.start(
                "pyrsia.services.embedding_worker",
                ["--port", "0", "--embedding-config", str(config)],
                env,
                role=ROLE_EMBEDDING_WORKER,
                wait_ready=True,
                log_dir=workdir,
            )
        )
        yield procs
    finally:
        codes = [(p.role, p.stop()) for p in reversed(procs)]
        assert all(code == 0 for _, code in codes), codes


@contextmanager
def environ(**values: str | None):
    """Set (or unset, with None) environment variables for a block."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_batch(
    ids, *, requires_grad: bool = True, labels: bool = True, seed: int = 0
) -> PersiaBatch:
    """Slot ``a``: one id per sample; slot ``r`` (raw): ids ``i`` and ``i + 1``; 2 dense columns."""
    ids = np.asarray(ids, dtype=np.uint64)
    rng = np.random.default_rng(seed)
    n = len(ids)
    return PersiaBatch(
        [
            IDTypeFeatureWithSingleID("a", ids),
            IDTypeFeature("r", [np.array([i, i + 1], np.uint64) for i in ids]),
        ],
        non_id_type_features=[NonIDTypeFeature(rng.normal(size=(n, 2)).astype(np.float32))],
        labels=[Label(rng.integers(0, 2, size=(n, 1)).astype(np.float32))] if labels else None,
        requires_grad=requires_grad,
    )


class PooledModel(torch.nn.Module):
    """Returns slot ``a``'s pooled embedding times a weight vector: easy gradients by hand."""

    def __init__(self, dim: int = 4):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(1.0, dim + 1.0))

    def forward(self, non_id, embeddings):
        return embeddings[0] * self.w


class SmallModel(torch.nn.Module):
    """A tiny dense network over both slots and the dense columns."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2 + 4 + 2 * 4, 1)

    def forward(self, non_id, embeddings):
        raw = embeddings[1].reshape(embeddings[1].shape[0], -1)
        return torch.sigmoid(self.linear(torch.cat([non_id[0], embeddings[0], raw], dim=1)))


def small_train_ctx(model: torch.nn.Module):
    """A ``TrainCtx`` training ``model`` with plain SGD on both sides (lr 0.1), in fp32."""
    from persia.ctx import TrainCtx
    from persia.embedding.optim import SGD

    return TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
    )
