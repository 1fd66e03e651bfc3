"""TrainCtx(embedding_grad_reduction=): the ranks' embedding gradients summed (PERSIA's) or averaged.

Two gloo NN-worker ranks against a real PS and embedding worker: both ranks look up the
same ids (a barrier makes both lookups precede either update), each sends the gradient
of ``sum(e * w)``, ``w`` per row, and the PS applies SGD(lr). With ``"sum"`` a row moves
by ``lr * 2 * w``; with ``"mean"`` by exactly half of that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from persia.ctx import TrainCtx, eval_ctx
from persia.embedding.optim import SGD
from pyrsia.shared.errors import InvalidInputError
from tests.nn_helpers import PooledModel, environ, job_services, make_batch
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
LR = 0.5
IDS = {"sum": [11, 12, 13], "mean": [21, 22, 23]}

RANK_SCRIPT = """
import json, sys
import numpy as np, torch
from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.distributed import DDPOption
from persia.embedding.optim import SGD
from persia.env import get_rank
from tests.nn_helpers import PooledModel, make_batch

class One(IterableDataset):
    def __init__(self, ids):
        super().__init__(buffer_size=4)
        self.ids = ids

    def __iter__(self):
        yield make_batch(self.ids)

out, lr, jobs = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
result = {}
for reduction, ids, port in jobs:
    model = PooledModel()
    with TrainCtx(SGD(lr=lr), torch.optim.SGD(model.parameters(), lr=0.0), model=model,
                  mixed_precision=False, embedding_grad_reduction=reduction,
                  distributed_option=DDPOption(backend="gloo", master_port=port)) as ctx:
        for batch in DataLoader(One(ids), embedding_staleness=1):
            before = np.array(batch.embeddings[0][1])
            output, _ = ctx.forward(batch)
            torch.distributed.barrier()  # both ranks looked up before either update lands
            ctx.backward(output.sum())
    result[reduction] = before.tolist()
with open(f"{out}/rank{get_rank()}.json", "w") as f:
    json.dump(result, f)
"""


def _trainctx(**kwargs) -> TrainCtx:
    model = torch.nn.Linear(2, 1)
    return TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        **kwargs,
    )


@pytest.mark.parametrize("bad", ["avg", "SUM", 2, None])
def test_a_bad_embedding_grad_reduction_is_refused_naming_the_choices(bad):
    with pytest.raises(
        InvalidInputError, match=r"embedding_grad_reduction: expected 'sum' or 'mean'"
    ):
        _trainctx(embedding_grad_reduction=bad)


def test_embedding_grad_reduction_defaults_to_persias_sum():
    ctx = _trainctx()
    assert ctx.embedding_grad_reduction == "sum" and ctx.embedding_grad_divisor == 1.0


def test_mean_halves_the_gradient_two_ranks_apply_on_the_ps(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"egr-{uuid.uuid4().hex[:8]}"}
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    jobs = json.dumps([[name, ids, free_port()] for name, ids in IDS.items()])
    base = {**os.environ, **env, "PYTHONPATH": str(REPO), "WORLD_SIZE": "2"}
    with job_services(env, tmp_path / "svc"):
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path), str(LR), jobs],
                cwd=REPO,
                env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in (0, 1)
        ]
        try:
            errors = [proc.communicate(timeout=90)[1] for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for proc, err in zip(procs, errors, strict=True):
            assert proc.returncode == 0, err[-4000:]
        with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
            with eval_ctx() as ctx:
                after = {
                    name: np.array(
                        ctx.get_embedding_from_data(
                            make_batch(ids, requires_grad=False)
                        ).embeddings[0][1]
                    )
                    for name, ids in IDS.items()
                }
    before = json.loads((tmp_path / "rank0.json").read_text())
    assert before == json.loads((tmp_path / "rank1.json").read_text())  # the same rows
    w = PooledModel().w.detach().numpy()  # d sum(e * w) / d e, per row, on each rank
    moved = {name: np.array(before[name]) - after[name] for name in IDS}
    np.testing.assert_allclose(moved["sum"], np.broadcast_to(LR * 2 * w, (3, 4)), rtol=1e-5)
    np.testing.assert_allclose(moved["mean"], np.broadcast_to(LR * w, (3, 4)), rtol=1e-5)
