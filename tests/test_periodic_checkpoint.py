"""Periodic checkpoints from global_config.yml and ``--resume`` (PERSIA_RESUME=1), against a
real PS and embedding worker: the checkpoint of step 4 holds exactly the state after step 4
(step 5's updates are not in it), and resuming restores embeddings, dense model, optimizer
and the step count."""

from __future__ import annotations

import json
import uuid

import numpy as np
import torch

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import Adagrad
from pyrsia.shared import job_checkpoint as jc
from tests.nn_helpers import SmallModel, environ, job_services, make_batch

EVAL_IDS = [1000 + i for i in range(9)]


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=2)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _embeddings(model) -> np.ndarray:
    with eval_ctx(model=model) as ectx:
        batch = ectx.get_embedding_from_data(make_batch(EVAL_IDS, requires_grad=False))
    return np.concatenate(
        [np.asarray(e[1]).reshape(len(EVAL_IDS), -1) for e in batch.embeddings], 1
    )


def test_checkpoint_every_n_steps_is_point_in_time_and_resume_restores_it(redis_server, tmp_path):
    ckpt = tmp_path / "ckpt"
    config = tmp_path / "global_config.yml"
    config.write_text(
        "common_config:\n  checkpointing_config:\n"
        f"    checkpoint_dir: {ckpt}\n    checkpoint_every_n_steps: 2\n    keep_checkpoints: 2\n"
    )
    batches = [make_batch([1000 + (i * 3 + j) % 9 for j in range(6)], seed=i) for i in range(5)]

    def services(name):
        job_id = f"pc-{name}-{uuid.uuid4().hex[:6]}"
        env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": job_id}
        return env, job_services(env, tmp_path / job_id)

    torch.manual_seed(1)
    model = SmallModel()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    env, svc = services("a")
    with environ(**env, PERSIA_GLOBAL_CONFIG=str(config), PERSIA_RESUME=None, RANK=None), svc:
        with TrainCtx(Adagrad(lr=0.05), opt, model=model, mixed_precision=False) as ctx:
            for step, batch in enumerate(
                DataLoader(ListDataset(batches), embedding_staleness=2), 1
            ):
                output, labels = ctx.forward(batch)
                ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
                if step == 4:  # the checkpoint of step 4 was written inside backward()
                    at_4 = (
                        _embeddings(model),
                        {k: v.clone() for k, v in model.state_dict().items()},
                    )
            after_5 = _embeddings(model)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_0000000002", "step_0000000004"]
    manifest = json.loads((ckpt / "step_0000000004" / jc.MANIFEST).read_text())
    assert manifest["step"] == 4 and manifest["trained_batches"] == 0  # no data-loader batches
    assert manifest["updates_applied_total"] > 0
    assert not np.array_equal(at_4[0], after_5)  # step 5 changed embeddings after the checkpoint

    torch.manual_seed(2)
    fresh = SmallModel()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    env, svc = services("b")
    with environ(**env, PERSIA_GLOBAL_CONFIG=str(config), PERSIA_RESUME="1", RANK=None), svc:
        with TrainCtx(Adagrad(lr=0.05), fresh_opt, model=fresh, mixed_precision=False) as ctx:
            assert ctx.update_times == 4
            np.testing.assert_array_equal(_embeddings(fresh), at_4[0])
            for key, value in fresh.state_dict().items():
                torch.testing.assert_close(value, at_4[1][key], rtol=0, atol=0)
            assert fresh_opt.state_dict()["state"][0]["step"] == 4
