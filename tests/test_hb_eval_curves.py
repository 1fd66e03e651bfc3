"""hb.train's evaluations land in TensorBoard (issue 29): ``eval/<name>`` at each evaluation's
step, in the job's run directory, read back with TensorBoard's own reader."""

from __future__ import annotations

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import persia.hb as hb


@pytest.fixture
def tensorboard_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PERSIA_TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("PERSIA_JOB_ID", "hb-curves")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "tb" / "hb-curves" / "rank_0"


def test_every_evaluation_is_a_point_of_eval_curves(tensorboard_env):
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8])  # AUC 0.75

    def eval_fn():
        auc = hb.metrics.AUC()
        auc.update(labels, scores)
        return {"auc": auc, "calls": float(len(calls))}

    calls: list[int] = []
    history = hb.train.train_and_evaluate(
        calls.append, range(7), eval_fn=eval_fn, eval_every_n_iter=3
    )
    assert [step for step, _ in history] == [3, 6, 7]
    acc = EventAccumulator(str(tensorboard_env))
    acc.Reload()
    auc = [(e.step, round(e.value, 6)) for e in acc.Scalars("eval/auc")]
    assert auc == [(3, 0.75), (6, 0.75), (7, 0.75)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/calls")] == [(3, 3.0), (6, 6.0), (7, 7.0)]


def test_no_directory_without_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("PERSIA_TENSORBOARD_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    hb.train.train_and_evaluate(lambda batch: None, range(2), eval_fn=lambda: {"x": 1.0})
    assert list(tmp_path.iterdir()) == []
