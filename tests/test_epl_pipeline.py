"""pipeline.num_stages / pipeline.strategy / auto.auto_parallel: stages on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from persia.epl.pipeline import _balanced_cut, partition
from pyrsia.shared.errors import ConfigError
from tests.epl_helpers import run_two_gloo_ranks

REPO = Path(__file__).resolve().parents[1]


def test_partition_balances_parameter_count():
    model = nn.Sequential(
        nn.Linear(64, 64), nn.Linear(64, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 64)
    )
    stages = partition(model, 2)
    assert [len(s) for s in stages] == [1, 4]  # 4160 params vs 520 + 72 + 72 + 576
    assert [m for s in stages for m in s] == list(model)
    assert _balanced_cut([1, 1, 1, 1, 1, 1], 3) == [0, 2, 4]
    assert _balanced_cut([5, 1, 1, 1, 1, 1], 2) == [0, 1]


def test_partition_by_measured_time_covers_every_layer():
    model = nn.Sequential(
        nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )
    stages = partition(model, 3, sample_input=torch.randn(32, 16))
    assert len(stages) == 3 and all(len(s) for s in stages)
    assert [m for s in stages for m in s] == list(model)
    with pytest.raises(ConfigError, match="layers to split"):
        partition(model, 6)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_two_gloo_ranks("tests.epl_pipeline_job", tmp_path_factory.mktemp("epl_pipe"))


@pytest.mark.parametrize(
    ("run", "schedule"),
    [
        ("1f1b_auto", "Schedule1F1B"),
        ("gpipe_auto", "ScheduleGPipe"),
        ("gpipe_given", "ScheduleGPipe"),
    ],
)
def test_pipeline_stage_gradients_equal_whole_model(ranks, run, schedule):
    for r in ranks:
        assert r[run]["schedule"] == schedule
        assert r[run]["max_grad_diff"] < 1e-6
    # together the two stages hold every parameter (3 Linear layers: 6 tensors)
    assert ranks[0][run]["n_params_with_grad"] + ranks[1][run]["n_params_with_grad"] == 6
    assert ranks[0][run]["loss"] is None
    assert ranks[1][run]["loss"] == pytest.approx(ranks[1]["whole_loss"], rel=1e-5)
