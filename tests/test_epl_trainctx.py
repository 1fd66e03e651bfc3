"""TrainCtx with EPL options against a real PS and embedding worker over loopback."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

import persia.epl as epl
from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import SGD
from persia.epl import state
from persia.epl.microbatch import EplModel
from pyrsia.shared.errors import ConfigError
from tests.nn_helpers import PooledModel, SmallModel, environ, job_services, make_batch


@pytest.fixture(scope="module")
def job(redis_server, tmp_path_factory):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"epl-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
        with job_services(env, tmp_path_factory.mktemp("svc")) as procs:
            yield procs


@pytest.fixture(autouse=True)
def _fresh_state():
    state.reset()
    yield
    state.reset()


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _clear():
    with eval_ctx() as ctx:
        ctx.clear_embeddings()


def _one_step(ids, epl_config):
    """One SGD step of PooledModel (loss = sum(output)); embeddings before and after."""
    model = PooledModel()
    _clear()
    with TrainCtx(
        SGD(lr=0.5),
        torch.optim.SGD(model.parameters(), lr=0.0),
        model=model,
        mixed_precision=False,
        epl_config=epl_config,
    ) as ctx:
        for batch in DataLoader(ListDataset([make_batch(ids)]), embedding_staleness=1):
            before = np.array(batch.embeddings[0][1])
            output, _ = ctx.forward(batch)
            ctx.backward(output.sum())
        with eval_ctx(model=model) as ectx:
            after = ectx.get_embedding_from_data(make_batch(ids, requires_grad=False)).embeddings[
                0
            ][1]
    return before, np.broadcast_to(model.w.detach().numpy(), before.shape), np.array(after), ctx


@pytest.mark.parametrize(
    "config",
    [
        {"pipeline.num_micro_batch": 3},
        {
            "amp.level": "O1",
            "amp.loss_scale": 128,
        },  # the scale travels with the embedding gradients
        {"pipeline.num_micro_batch": 2, "optimizer.num_apply_group": 2, "communication.fp16": True},
    ],
)
def test_embedding_updates_are_exact_under_epl(job, config):
    ids = [901, 902, 903, 904, 905, 906]
    before, grad, after, ctx = _one_step(ids, epl.Config(config, environ={}))
    assert ctx.epl_plan is not None
    np.testing.assert_allclose(after, before - 0.5 * grad, rtol=1e-6, atol=1e-7)


def test_epl_init_job_trains_and_checkpoints_the_plain_model(job, tmp_path):
    torch.manual_seed(0)
    model = SmallModel()
    epl.init(
        epl.Config(
            {
                "pipeline.num_micro_batch": 2,
                "amp.level": "O1",
                "amp.loss_scale": 64,
                "optimizer.num_apply_group": 2,
            },
            environ={},
        )
    )
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _clear()
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.Adam(model.parameters(), lr=0.05),
        model=model,
        mixed_precision=False,
    ) as ctx:
        assert isinstance(ctx.model, EplModel)
        batches = [make_batch([10 + i, 20 + i, 30 + i, 40 + i], seed=i) for i in range(4)]
        losses = []
        for batch in DataLoader(ListDataset(batches), embedding_staleness=1):
            output, labels = ctx.forward(batch)
            loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
            ctx.backward(loss)
            losses.append(float(loss.detach()))
        assert ctx.grad_scaler.get_scale() == 64.0 and ctx.update_times == 4
        ctx.dump_checkpoint(str(tmp_path / "ckpt"))
    saved = torch.load(tmp_path / "ckpt" / "dense.pt", weights_only=True)
    assert saved.keys() == start.keys()  # the user's model, not the EPL wrapper
    assert any(not torch.equal(saved[k], start[k]) for k in start)
    assert all(np.isfinite(losses))


def test_clip_by_global_norm_inside_a_trainctx_without_epl_is_refused(job):
    model = PooledModel()
    with TrainCtx(
        SGD(lr=0.5), torch.optim.SGD(model.parameters(), lr=0.1), model=model, mixed_precision=False
    ) as ctx:
        assert ctx.epl_plan is None  # no EPL config, no norm: no clipping step
        with pytest.raises(ConfigError, match=r"clip_by_global_norm.*before TrainCtx"):
            epl.clip_by_global_norm(1.0)
    assert state.current_clip_norm() is None
