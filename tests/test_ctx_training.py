"""TrainCtx / eval_ctx / DataLoader against a real PS and embedding worker over loopback."""

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

from persia.ctx import PreprocessMode, TrainCtx, cnt_ctx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding import EmbeddingConfig
from persia.embedding.optim import SGD, Adagrad
from tests.nn_helpers import PooledModel, SmallModel, environ, job_services, make_batch


@pytest.fixture(scope="module")
def job(redis_server, tmp_path_factory):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"ctx-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
        with job_services(env, tmp_path_factory.mktemp("svc")) as procs:
            yield procs


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _clear():
    """Empty the servers so the next TrainCtx may register another optimizer."""
    with eval_ctx() as ctx:
        ctx.clear_embeddings()
        assert ctx.get_embedding_size() == [0]


def _one_step(optimizer, ids):
    """One training step of PooledModel with loss = sum(output); returns e before, grad, e after."""
    model = PooledModel()
    batch = make_batch(ids)
    _clear()
    with TrainCtx(
        optimizer, torch.optim.SGD(model.parameters(), lr=0.0), model=model, mixed_precision=False
    ) as ctx:
        loader = DataLoader(ListDataset([batch]), embedding_staleness=1)
        for training_batch in loader:
            before = np.array(training_batch.embeddings[0][1])
            output, labels = ctx.forward(training_batch)
            assert labels[0].shape == (len(ids), 1) and labels[0].dtype == torch.float32
            ctx.backward(output.sum())
        with eval_ctx(model=model) as ectx:
            assert cnt_ctx() is ectx and ectx.preprocess_mode is PreprocessMode.EVAL
            after = ectx.get_embedding_from_data(make_batch(ids, requires_grad=False)).embeddings[
                0
            ][1]
    grad = np.broadcast_to(model.w.detach().numpy(), before.shape)  # d sum(e * w) / d e
    return before, grad, np.array(after)


def test_sgd_step_is_exact(job):
    before, grad, after = _one_step(SGD(lr=0.5), [101, 102, 103])
    np.testing.assert_allclose(after, before - 0.5 * grad, rtol=1e-6, atol=1e-7)


def test_adagrad_step_is_exact(job):
    before, grad, after = _one_step(Adagrad(lr=0.1, initial_accumulator_value=0.5), [201, 202, 203])
    expected = before - 0.1 * grad / np.sqrt(0.5 + 1e-10)
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-7)


def test_eval_ctx_nested_keeps_hyperparameters(job):
    model = PooledModel()
    _clear()
    config = EmbeddingConfig(emb_initialization=(0.5, 0.6), weight_bound=3)
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        embedding_config=config,
        mixed_precision=False,
    ) as ctx:
        with eval_ctx(model=model):
            pass
        batch = ctx.get_embedding_from_data(make_batch([301, 302]))
        values = batch.embeddings[0][1]
        assert ((values >= 0.5) & (values <= 0.6)).all()  # still the TrainCtx's initialization
        ctx.prepare_features(batch)
        ctx.backward(ctx.forward(batch)[0].sum())


def _train_losses(ids_per_batch, seed=3):
    torch.manual_seed(seed)
    model = SmallModel()
    losses = []
    _clear()
    with TrainCtx(
        SGD(lr=0.2), torch.optim.SGD(model.parameters(), lr=0.1), model=model, mixed_precision=False
    ) as ctx:
        batches = [make_batch(ids, seed=i) for i, ids in enumerate(ids_per_batch)]
        for batch in DataLoader(
            ListDataset(batches), reproducible=True, embedding_staleness=1, num_workers=4
        ):
            output, labels = ctx.forward(batch)
            loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
            ctx.backward(loss)
            losses.append(float(loss.detach()))
    return losses


def test_reproducible_runs_give_identical_losses(job):
    rng = np.random.default_rng(0)
    ids = [rng.integers(1000, 1030, size=8) for _ in range(12)]  # overlapping ids: order matters
    first, second = _train_losses(ids), _train_losses(ids)
    assert first == second
    assert len(first) == 12


def test_checkpoint_round_trip_with_fresh_services(redis_server, tmp_path):
    ckpt = tmp_path / "ckpt"
    eval_batch = make_batch([1000 + i for i in range(6)], requires_grad=False)

    def run(job_id, *, train: bool):
        env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": job_id}
        torch.manual_seed(1)
        model = SmallModel()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with (
            environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None),
            job_services(env, tmp_path / job_id),
        ):
            with TrainCtx(Adagrad(lr=0.05), opt, model=model, mixed_precision=False) as ctx:
                if train:
                    batches = [
                        make_batch([1000 + (i * 3 + j) % 9 for j in range(6)], seed=i)
                        for i in range(5)
                    ]
                    for batch in DataLoader(ListDataset(batches)):
                        output, labels = ctx.forward(batch)
                        ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
                    ctx.dump_checkpoint(str(ckpt))
                else:
                    ctx.load_checkpoint(str(ckpt))
                with eval_ctx(model=model) as ectx:
                    output, _ = ectx.forward(ectx.get_embedding_from_data(eval_batch))
        return output.detach().numpy(), opt.state_dict()

    trained_out, trained_opt = run(f"ck-a-{uuid.uuid4().hex[:6]}", train=True)
    loaded_out, loaded_opt = run(f"ck-b-{uuid.uuid4().hex[:6]}", train=False)
    np.testing.assert_array_equal(trained_out, loaded_out)
    assert loaded_opt["state"][0]["step"] == trained_opt["state"][0]["step"] == 5
    torch.testing.assert_close(
        loaded_opt["state"][0]["exp_avg"], trained_opt["state"][0]["exp_avg"]
    )


def test_mixed_precision_on_cpu_uses_bf16_autocast(job, caplog):
    model = SmallModel()
    _clear()
    with caplog.at_level("INFO"):
        ctx = TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    assert "bf16 autocast" in caplog.text and ctx.grad_scaler is None
    with ctx:
        for batch in DataLoader(ListDataset([make_batch([1, 2, 3]), make_batch([4, 5, 6])])):
            output, labels = ctx.forward(batch)
            assert output.dtype == torch.float32
            loss = ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            assert torch.isfinite(loss)


WARMING_SCRIPT = """
import json, sys, threading
import torch
from pyrsia.shared.allocator import keep_freed_memory
from pyrsia.shared.runtime import get_runtime
from persia.ctx import TrainCtx
from persia.embedding.optim import SGD
from pyrsia.shared import scatter
from tests.nn_helpers import PooledModel

async def nothing():
    return None

get_runtime().run(nothing())  # the runtime alone, as a data loader uses it
alone = {"numba": "numba" in sys.modules, "warming": scatter._warming is not None,
         "malloc": keep_freed_memory.cache_info().currsize}
model = PooledModel()
with TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.0), model=model,
              mixed_precision=False):
    entered = {"warming": scatter._warming is not None,
               "malloc": keep_freed_memory.cache_info().currsize}
print(json.dumps({"alone": alone, "entered": entered}))
"""


def test_only_a_training_context_warms_the_gradient_kernel(job):
    """A process that only uses the runtime (a data loader) does not compile the NN worker's
    gradient kernel (~0.5-0.9 s of CPU it would take from training); TrainCtx starts it, and
    tunes the process's malloc (pyrsia/shared/allocator.py) as it enters."""
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", WARMING_SCRIPT],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["alone"] == {"numba": False, "warming": False, "malloc": 0}
    assert seen["entered"] == {"warming": True, "malloc": 1}
