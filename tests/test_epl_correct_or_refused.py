"""EPL options either do what their docstring says or refuse at once (issue 24).

Each test names one option and checks its effect (or its error) in one NN-worker
process: micro-batches and BatchNorm, the gradient-checkpoint check, pipeline stages
on one rank, io.* keys in the NN worker, and clipping registered after TrainCtx.
"""

from __future__ import annotations

import copy
import logging
import subprocess
import sys

import pytest
import torch
from torch import nn

import persia.epl as epl
from persia.epl import state
from pyrsia.shared.errors import ConfigError
from tests.epl_helpers import REPO, DeepModel, inputs, make_ctx

bce = nn.functional.binary_cross_entropy_with_logits


@pytest.fixture(autouse=True)
def _fresh_state():
    state.reset()
    yield
    state.reset()


def _config(values: dict) -> epl.Config:
    return epl.Config(values, environ={})


def _train_step(ctx, seed: int, batch: int = 12) -> None:
    """One step the way ``TrainCtx.backward`` runs it (forward, backward, dense step)."""
    non_id, emb, labels = inputs(batch, seed=seed)
    scaled, _ = ctx._precision.scale(bce(ctx.model(non_id, emb), labels))
    scaled.backward()
    ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    ctx.dense_optimizer.zero_grad(set_to_none=True)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


# --- pipeline.num_micro_batch: each sample through the model in training mode once ---------
class BNModel(nn.Module):
    """dense (b, 4) + two slots (b, 6) -> Linear -> BatchNorm -> a logit."""

    def __init__(self):
        super().__init__()
        self.inp, self.bn, self.out = nn.Linear(16, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)

    def forward(self, non_id, embeddings):
        x = torch.cat([non_id[0], *embeddings], dim=1)
        return self.out(torch.relu(self.bn(self.inp(x))))


def test_micro_batch_updates_batchnorm_once_per_micro_batch():
    torch.manual_seed(0)
    plain = BNModel()
    model = copy.deepcopy(plain)
    ctx = make_ctx(model, _config({"pipeline.num_micro_batch": 2}))
    for step in range(2):
        non_id, emb, labels = inputs(12, seed=step)
        bce(ctx.model(non_id, emb), labels).backward()
        with torch.no_grad():  # EPL's accumulation: each micro-batch is one training forward
            for part in (slice(0, 6), slice(6, 12)):
                plain([non_id[0][part]], [e[part] for e in emb])
    assert int(model.bn.num_batches_tracked) == 4 == int(plain.bn.num_batches_tracked)
    torch.testing.assert_close(model.bn.running_mean, plain.bn.running_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.bn.running_var, plain.bn.running_var, rtol=0, atol=1e-6)


def test_micro_batches_with_batchnorm_warn_once_naming_the_modules(caplog):
    """Issue 49: BatchNorm normalizes each micro-batch with its own statistics, so the
    gradients are not the whole batch's; the first micro-batched step says so, once."""
    model = BNModel()
    model.extra = nn.Sequential(nn.BatchNorm1d(8))  # a nested one is named by its path
    ctx = make_ctx(model, _config({"pipeline.num_micro_batch": 2}))
    with caplog.at_level(logging.WARNING, logger="persia"):
        for step in range(3):
            _train_step(ctx, seed=step)
    notes = [r.getMessage() for r in caplog.records if "BatchNorm" in r.getMessage()]
    assert len(notes) == 1, notes
    assert "bn" in notes[0] and "extra.0" in notes[0] and "pipeline.num_micro_batch=2" in notes[0]
    assert "not the whole batch's" in notes[0]


@pytest.mark.parametrize("micro", [1, 2])
def test_no_batchnorm_warning_without_batchnorm_or_micro_batches(caplog, micro):
    model = BNModel() if micro == 1 else DeepModel()
    ctx = make_ctx(model, _config({"pipeline.num_micro_batch": micro}))
    with caplog.at_level(logging.WARNING, logger="persia"):
        _train_step(ctx, seed=0)
    assert not [r for r in caplog.records if "BatchNorm" in r.getMessage()]


class BNBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin, self.bn = nn.Linear(width, width), nn.BatchNorm1d(width)

    def forward(self, x):
        return x + torch.relu(self.bn(self.lin(x)))


class BNBlocksModel(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.Sequential(*[BNBlock(width) for _ in range(3)])
        self.out = nn.Linear(width, 1)

    def forward(self, non_id, embeddings):
        return self.out(self.blocks(self.inp(torch.cat([non_id[0], *embeddings], dim=1))))


def test_gradient_checkpoint_and_its_check_update_batchnorm_once_per_step():
    torch.manual_seed(0)
    plain = BNBlocksModel()
    model = copy.deepcopy(plain)
    config = {"gradient_checkpoint.type": "auto", "gradient_checkpoint.check_gradients": True}
    ctx = make_ctx(model, _config(config))
    assert len(ctx.epl_plan.checkpointed) == 3
    for step in range(2):
        non_id, emb, labels = inputs(12, seed=step)
        bce(ctx.model(non_id, emb), labels).backward()
        bce(plain(non_id, [e.detach() for e in emb]), labels).backward()
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    for got, want in zip(model.blocks, plain.blocks, strict=True):
        assert int(got.bn.num_batches_tracked) == 2 == int(want.bn.num_batches_tracked)
        torch.testing.assert_close(got.bn.running_mean, want.bn.running_mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(got.bn.running_var, want.bn.running_var, rtol=0, atol=1e-6)


# --- gradient_checkpoint.check_gradients: a mismatch refuses before the step ---------------
class DriftingBlock(nn.Module):
    """A block whose output depends on how often it ran: recomputation changes it."""

    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) * self.calls


class DriftingModel(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.Sequential(DriftingBlock(width), DriftingBlock(width))
        self.out = nn.Linear(width, 1)

    def forward(self, non_id, embeddings):
        return self.out(self.blocks(self.inp(torch.cat([non_id[0], *embeddings], dim=1))))


def test_check_gradients_mismatch_raises_before_the_optimizer_step():
    torch.manual_seed(0)
    model = DriftingModel()
    config = {"gradient_checkpoint.type": "auto", "gradient_checkpoint.check_gradients": True}
    ctx = make_ctx(model, _config(config))
    before = _flat(model)
    with pytest.raises(ConfigError, match=r"gradient_checkpoint\.check_gradients") as info:
        _train_step(ctx, seed=0)
    message = str(info.value)
    assert "max difference" in message and "tolerance" in message
    assert ctx.epl_plan.gradient_check.max_diff > 1e-3
    assert torch.equal(_flat(model), before)  # no step was applied


def test_check_gradients_passes_on_a_deterministic_model():
    torch.manual_seed(0)
    model = DeepModel()
    config = {"gradient_checkpoint.type": "auto", "gradient_checkpoint.check_gradients": True}
    ctx = make_ctx(model, _config(config))
    _train_step(ctx, seed=0)
    assert ctx.epl_plan.gradient_check.max_diff < 1e-6


# --- pipeline.num_stages inside TrainCtx on one rank ----------------------------------------
def test_num_stages_inside_trainctx_on_one_rank_is_refused():
    with pytest.raises(ConfigError, match=r"pipeline\.num_stages=2.*PipelineRunner"):
        make_ctx(DeepModel(), _config({"pipeline.num_stages": 2, "pipeline.num_micro_batch": 2}))
    with pytest.raises(
        ConfigError, match=r"pipeline\.num_stages=3 \(from EPL_PIPELINE_NUM_STAGES\)"
    ):
        make_ctx(DeepModel(), epl.Config(environ={"EPL_PIPELINE_NUM_STAGES": "3"}))
    assert make_ctx(DeepModel(), _config({"pipeline.num_stages": 1})).epl_plan is not None


# --- io.*: read by data loaders only --------------------------------------------------------
def test_io_keys_in_trainctx_are_reported_as_read_by_data_loaders_only(caplog):
    with caplog.at_level(logging.WARNING, logger="persia.epl"):
        make_ctx(DeepModel(), _config({"io.slicing": True, "io.drop_last_files": True}))
    assert "io.drop_last_files, io.slicing" in caplog.text
    assert "slice_files" in caplog.text and "data loader" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="persia.epl"):
        make_ctx(DeepModel(), _config({}))
    assert "io." not in caplog.text


@pytest.mark.parametrize(
    ("key", "value", "switch"),
    [
        ("amp.loss_scale", 128, "amp.level"),
        ("gradient_checkpoint.end_taskgraph", 1, "gradient_checkpoint.type"),
        ("communication.fp16_scale", 1024, "communication.fp16"),
    ],
)
def test_a_key_whose_switch_is_off_is_reported(caplog, key, value, switch):
    with caplog.at_level(logging.WARNING, logger="persia.epl"):
        make_ctx(DeepModel(), _config({key: value}))
    assert f"{key}=" in caplog.text
    assert f"has no effect: it applies only when {switch}" in caplog.text


def _exit_log(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr


def test_io_keys_never_read_in_a_process_are_reported_at_exit():
    init = "import persia.epl as epl; epl.init(epl.Config({'io.slicing': True}, environ={}))"
    unused = _exit_log(init)
    assert "io.slicing set in persia.epl.init but never read" in unused
    assert "slice_files" in unused
    used = _exit_log(init + "; epl.slice_files(['a', 'b'], 0, 2)")
    assert "never read" not in used


# --- clip_by_global_norm registered after TrainCtx is built ---------------------------------
def _update_norm(ctx, model, seed: int) -> float:
    before = _flat(model)
    _train_step(ctx, seed=seed)
    return float((_flat(model) - before).norm())


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"communication.clip_after_allreduce": True},
        {"amp.level": "O1", "amp.loss_scale": 128},  # unscaled before clipping
    ],
)
def test_clip_by_global_norm_after_trainctx_is_built_applies_from_the_next_step(config):
    torch.manual_seed(0)
    model = DeepModel()
    ctx = make_ctx(model, _config(config), optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
    assert _update_norm(ctx, model, seed=0) > 0.1  # no clipping yet
    epl.clip_by_global_norm(0.01)
    assert _update_norm(ctx, model, seed=1) == pytest.approx(0.01, rel=1e-4)
    epl.clip_by_global_norm(None)
    assert _update_norm(ctx, model, seed=2) > 0.1


def test_clip_by_global_norm_without_epl_config_still_clips():
    torch.manual_seed(0)
    model = DeepModel()
    epl.clip_by_global_norm(0.01)
    ctx = make_ctx(model, None, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
    assert ctx.epl_plan is not None
    assert _update_norm(ctx, model, seed=0) == pytest.approx(0.01, rel=1e-4)
