"""EPL keys that act inside one NN-worker process: each test proves one key's effect."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import persia.epl as epl
from persia.epl import state
from persia.epl.amp import FixedLossScaler
from persia.epl.microbatch import EplModel
from persia.epl.optimizer import GroupedApplyOptimizer
from pyrsia.shared.errors import ConfigError
from tests.epl_helpers import (
    DeepModel,
    grads,
    inputs,
    make_ctx,
    peak_temporary_bytes,
    saved_activation_meter,
)

bce = nn.functional.binary_cross_entropy_with_logits


@pytest.fixture(autouse=True)
def _fresh_state():
    state.reset()
    yield
    state.reset()


def _backward(model, non_id, embeddings, labels, meter=None):
    out = model(non_id, embeddings)
    loss = bce(out, labels)
    loss.backward()
    return out.detach(), loss.detach()


# --- pipeline.num_micro_batch --------------------------------------------------------------
@pytest.mark.parametrize(("micro", "batch"), [(4, 12), (4, 10), (3, 2)])
def test_micro_batch_gradients_equal_whole_batch(micro, batch):
    torch.manual_seed(0)
    plain = DeepModel()
    model = copy.deepcopy(plain)
    ctx = make_ctx(model, epl.Config({"pipeline.num_micro_batch": micro}, environ={}))
    assert isinstance(ctx.model, EplModel) and ctx.model.module is model
    non_id, emb, labels = inputs(batch)
    emb_plain = [e.detach().clone().requires_grad_() for e in emb]
    out_micro, loss_micro = _backward(ctx.model, non_id, emb, labels)
    out_plain, loss_plain = _backward(plain, non_id, emb_plain, labels)
    torch.testing.assert_close(out_micro, out_plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(loss_micro, loss_plain, rtol=0, atol=1e-6)
    for name, g in grads(plain).items():
        torch.testing.assert_close(grads(model)[name], g, rtol=0, atol=1e-6)
    for e, ep in zip(emb, emb_plain, strict=True):  # embedding gradients go back to the PS
        torch.testing.assert_close(e.grad, ep.grad, rtol=0, atol=1e-6)


def test_micro_batch_keeps_one_micro_batch_of_activations():
    torch.manual_seed(0)
    peaks = {}
    for micro in (1, 4):
        model = DeepModel(width=32)
        ctx = make_ctx(model, epl.Config({"pipeline.num_micro_batch": micro}, environ={}))
        non_id, emb, labels = inputs(64)
        with saved_activation_meter() as meter:
            _backward(ctx.model, non_id, emb, labels)
        peaks[micro] = meter["peak"]
    assert peaks[4] < 0.5 * peaks[1], peaks


def test_micro_batch_eval_runs_plain_forward():
    model = DeepModel()
    ctx = make_ctx(model, epl.Config({"pipeline.num_micro_batch": 4}, environ={}))
    non_id, emb, _ = inputs(8)
    with torch.no_grad():
        torch.testing.assert_close(ctx.model(non_id, emb), model(non_id, emb), rtol=0, atol=0)


# --- gradient_checkpoint.* ------------------------------------------------------------------
def _gc_run(config_dict, width=32, batch=64):
    torch.manual_seed(0)
    model = DeepModel(width=width)
    ctx = make_ctx(model, epl.Config(config_dict, environ={}))
    non_id, emb, labels = inputs(batch)
    with saved_activation_meter() as meter:
        _backward(ctx.model, non_id, emb, labels)
    return ctx, meter["peak"], grads(model)


def test_gradient_checkpoint_auto_lowers_activation_memory_same_gradients():
    _, plain_peak, plain_grads = _gc_run({})
    ctx, gc_peak, gc_grads = _gc_run({"gradient_checkpoint.type": "auto"})
    assert len(ctx.epl_plan.checkpointed) == 4  # the 4 repeated Blocks
    assert gc_peak < 0.5 * plain_peak, (gc_peak, plain_peak)
    for name, g in plain_grads.items():
        torch.testing.assert_close(gc_grads[name], g, rtol=0, atol=1e-6)


def test_gradient_checkpoint_end_taskgraph_limits_the_blocks():
    _, all_peak, _ = _gc_run({"gradient_checkpoint.type": "auto"})
    _, plain_peak, _ = _gc_run({})
    ctx, two_peak, _ = _gc_run(
        {"gradient_checkpoint.type": "auto", "gradient_checkpoint.end_taskgraph": 1}
    )
    assert len(ctx.epl_plan.checkpointed) == 2
    assert all_peak < two_peak < plain_peak


def test_gradient_checkpoint_collection_uses_marked_modules():
    torch.manual_seed(0)
    model = DeepModel()
    epl.add_to_collection(model.blocks[2])
    ctx = make_ctx(model, epl.Config({"gradient_checkpoint.type": "collection"}, environ={}))
    assert ctx.epl_plan.checkpointed == [model.blocks[2]]
    with pytest.raises(ConfigError, match="add_to_collection"):
        make_ctx(DeepModel(), epl.Config({"gradient_checkpoint.type": "collection"}, environ={}))


def test_gradient_checkpoint_check_gradients_reports_max_difference(caplog):
    model = DeepModel()
    config = epl.Config(
        {"gradient_checkpoint.type": "auto", "gradient_checkpoint.check_gradients": True},
        environ={},
    )
    ctx = make_ctx(model, config)
    non_id, emb, labels = inputs(8)
    with caplog.at_level(logging.INFO, logger="persia.epl.recompute"):
        _backward(ctx.model, non_id, emb, labels)
        _backward(ctx.model, non_id, emb, labels)
    check = ctx.epl_plan.gradient_check
    assert check.max_diff is not None and check.max_diff < 1e-6
    assert caplog.text.count("max |checkpointed - plain| gradient") == 1  # once


# --- optimizer.num_apply_group --------------------------------------------------------------
def test_num_apply_group_result_identical():
    torch.manual_seed(0)
    plain = DeepModel()
    model = copy.deepcopy(plain)
    opt_plain = torch.optim.Adam(plain.parameters(), lr=0.01)
    ctx = make_ctx(
        model,
        epl.Config({"optimizer.num_apply_group": 3}, environ={}),
        optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
    )
    assert isinstance(ctx.dense_optimizer, GroupedApplyOptimizer)
    for step in range(3):
        for m, opt, prec in (
            (plain, opt_plain, None),
            (ctx.model, ctx.dense_optimizer, ctx._precision),
        ):
            non_id, emb, labels = inputs(8, seed=step)
            _backward(m, non_id, emb, labels)
            opt.step() if prec is None else prec.step(opt, True, 4.0)
            opt.zero_grad()
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert len(ctx.dense_optimizer.state) == len(list(model.parameters()))


def test_num_apply_group_steps_groups_one_at_a_time():
    model = DeepModel()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ctx = make_ctx(model, epl.Config({"optimizer.num_apply_group": 4}, environ={}), optimizer=opt)
    seen = []
    opt.register_step_pre_hook(
        lambda o, a, k: seen.append(
            sum(p.grad is not None for g in o.param_groups for p in g["params"])
        )
    )
    _backward(ctx.model, *inputs(8))
    ctx.dense_optimizer.step()
    n = len(list(model.parameters()))
    assert len(seen) == 4 and sum(seen) == n and max(seen) < n  # each step saw one group
    assert all(p.grad is not None for p in model.parameters())  # gradients restored


def test_num_apply_group_lowers_peak_temporary_memory():
    peaks = {}
    for groups in (1, 4):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(256, 256)) for _ in range(8)]
        opt = torch.optim.Adam(params, lr=0.01, foreach=True)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()  # the state exists: the next step allocates only temporaries
        ctx = make_ctx(
            nn.ParameterList(params),
            epl.Config({"optimizer.num_apply_group": groups}, environ={}),
            optimizer=opt,
        )
        peaks[groups] = peak_temporary_bytes(ctx.dense_optimizer.step)
    assert 0 < peaks[4] < 0.4 * peaks[1], peaks


# --- amp.* ----------------------------------------------------------------------------------
def test_amp_o1_autocasts_bf16_on_cpu():
    model = DeepModel()
    ctx = make_ctx(model, epl.Config({"amp.level": "O1"}, environ={}))
    non_id, emb, _ = inputs(4)
    with ctx._precision.autocast():
        hidden = model.inp(torch.cat([non_id[0], *emb], dim=1))
    assert hidden.dtype == torch.bfloat16 and ctx.grad_scaler is None


def test_amp_fixed_loss_scale_never_changes_and_skips_overflow():
    model = DeepModel()
    ctx = make_ctx(model, epl.Config({"amp.level": "O1", "amp.loss_scale": 128}, environ={}))
    scaler = ctx.grad_scaler
    assert isinstance(scaler, FixedLossScaler) and scaler.get_scale() == 128.0
    before = [p.detach().clone() for p in model.parameters()]
    for finite in (True, False):
        scaled, scale = ctx._precision.scale(bce(model(*inputs(4)[:2]), inputs(4)[2]))
        assert scale == 128.0
        scaled.backward()
        ctx._precision.step(
            ctx.dense_optimizer, finite, 4.0
        )  # non-finite: would shrink a dynamic scale
        ctx.dense_optimizer.zero_grad()
        assert scaler.get_scale() == 128.0
    next(model.parameters()).grad = None
    model.out.bias.grad = torch.tensor([float("inf")])  # overflow: the step is skipped
    snapshot = [p.detach().clone() for p in model.parameters()]
    ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    assert scaler.get_scale() == 128.0
    assert all(torch.equal(a, b) for a, b in zip(snapshot, model.parameters(), strict=True))
    assert not all(
        torch.equal(a, b) for a, b in zip(before, snapshot, strict=True)
    )  # it trained before


def test_amp_dynamic_loss_scale_backs_off_where_fixed_does_not():
    dynamic = torch.amp.GradScaler("cpu", init_scale=128.0)
    fixed = FixedLossScaler("cpu", 128.0)
    for scaler in (dynamic, fixed):
        scaler.scale(torch.ones(1))
        scaler.update(32.0)  # what TrainCtx asks on non-finite embedding gradients
    assert dynamic.get_scale() == 32.0 and fixed.get_scale() == 128.0


def test_amp_debug_log_reports_every_step(caplog):
    model = DeepModel()
    ctx = make_ctx(
        model,
        epl.Config({"amp.level": "O1", "amp.loss_scale": 8, "amp.debug_log": True}, environ={}),
    )
    with caplog.at_level(logging.INFO, logger="persia.epl.amp"):
        for _ in range(2):
            scaled, _ = ctx._precision.scale(bce(model(*inputs(4)[:2]), inputs(4)[2]))
            scaled.backward()
            ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    assert caplog.text.count("amp debug: step") == 2 and "loss scale 8 -> 8" in caplog.text
    quiet = make_ctx(DeepModel(), epl.Config({"amp.level": "O1"}, environ={}))
    assert quiet._precision.debug is False


# --- communication.* on one rank ------------------------------------------------------------
def test_sparse_as_dense_gives_dense_embedding_gradients():
    class WithEmbedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(10, 4, sparse=True)

        def forward(self, non_id, embeddings):
            return self.table(non_id[0]).sum(dim=1, keepdim=True)

    ids = [torch.tensor([1, 2, 3])]
    sparse = WithEmbedding()
    sparse(ids, []).sum().backward()
    assert sparse.table.weight.grad.is_sparse
    model = WithEmbedding()
    make_ctx(model, epl.Config({"communication.sparse_as_dense": True}, environ={}))
    model(ids, []).sum().backward()
    assert not model.table.weight.grad.is_sparse
    torch.testing.assert_close(model.table.weight.grad, sparse.table.weight.grad.to_dense())


def test_clip_by_global_norm_clips_the_dense_step():
    torch.manual_seed(0)
    model = DeepModel()
    epl.clip_by_global_norm(0.01)
    ctx = make_ctx(
        model,
        epl.Config({"communication.clip_after_allreduce": True}, environ={}),
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
    )
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    _backward(ctx.model, *inputs(8))
    ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert float((before - after).norm()) == pytest.approx(0.01, rel=1e-4)


# --- offload.level --------------------------------------------------------------------------
def test_offload_without_cuda_is_a_logged_noop(caplog):
    model = DeepModel()
    with caplog.at_level(logging.INFO, logger="persia.epl.offload"):
        ctx = make_ctx(model, epl.Config({"offload.level": "v0"}, environ={}))
    assert ctx.epl_plan.offloaded is False and "no-op" in caplog.text


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="offload moves weights between CPU and a CUDA device"
)
def test_offload_keeps_weights_in_cpu_memory_with_cuda():
    torch.manual_seed(0)
    plain = DeepModel().cuda(0)
    model = copy.deepcopy(plain)
    ctx = make_ctx(model, epl.Config({"offload.level": "v0"}, environ={}), device_id=0)
    assert ctx.epl_plan.offloaded
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    non_id, emb, labels = inputs(8)
    non_id = [t.cuda(0) for t in non_id]
    emb = [e.detach().cuda(0).requires_grad_() for e in emb]
    out = ctx.model(non_id, emb)
    assert out.device.type == "cuda"
    bce(out, labels.cuda(0)).backward()
    bce(plain(non_id, [e.detach().requires_grad_() for e in emb]), labels.cuda(0)).backward()
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        assert q.grad.device.type == "cpu"
        torch.testing.assert_close(q.grad, p.grad.cpu(), rtol=1e-5, atol=1e-6, msg=name)


# --- zero / pipeline restrictions, plan selection --------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"pipeline.num_micro_batch": 2}, "gradient accumulation"),
        ({"pipeline.num_stages": 2}, "data parallelism"),
        ({"optimizer.num_apply_group": 2}, "num_apply_group"),
    ],
)
def test_zero_restrictions_are_clear_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        make_ctx(DeepModel(), epl.Config({"zero.level": "v1", **extra}, environ={}))


def test_init_config_reaches_trainctx_and_epl_config_wins():
    config = epl.init(epl.Config({"optimizer.num_apply_group": 2}, environ={}))
    ctx = make_ctx(DeepModel())
    assert ctx.epl_plan.config is config and isinstance(ctx.dense_optimizer, GroupedApplyOptimizer)
    other = epl.Config({"amp.level": "O1"}, environ={})
    assert make_ctx(DeepModel(), other).epl_plan.config is other
    state.reset()
    assert make_ctx(DeepModel()).epl_plan is None  # no EPL: TrainCtx unchanged


def test_communication_keys_on_one_rank_are_logged_as_no_effect(caplog):
    with caplog.at_level(logging.INFO, logger="persia.epl.plan"):
        make_ctx(
            DeepModel(),
            epl.Config({"communication.fp16": True, "communication.max_splits": 2}, environ={}),
        )
    assert "communication.fp16, communication.max_splits: one NN-worker rank" in caplog.text
