"""One rank of the EPL multi-rank checks (2 gloo ranks; run by tests/test_epl_ranks.py).

``python -m tests.epl_ranks_job OUT_DIR`` with RANK, WORLD_SIZE and MASTER_PORT set.
Each scenario builds TrainCtx's EPL plan (the context is not entered: no servers),
converts the model for data parallelism the way ``TrainCtx._make_distributed`` does,
and runs the steps the way ``TrainCtx.backward`` does. Results go to OUT_DIR/rankN.json.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

import persia.epl as epl
from persia.distributed import DDPOption
from persia.epl import state
from tests.epl_helpers import DeepModel, inputs, make_ctx

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
PORT = int(os.environ["MASTER_PORT"])
bce = torch.nn.functional.binary_cross_entropy_with_logits


def distributed(config: dict | None, model: torch.nn.Module, optimizer=None):
    """The TrainCtx of ``config`` with its model and optimizer made data parallel."""
    option = DDPOption(backend="gloo", master_addr="127.0.0.1", master_port=PORT)
    epl_config = None if config is None else epl.Config(config, environ={})
    ctx = make_ctx(model, epl_config, optimizer=optimizer, distributed_option=option)
    ctx.model, opt = ctx.distributed_option.convert2distributed_model(
        ctx.model, WORLD, RANK, None, None, ctx.dense_optimizer
    )
    ctx.dense_optimizer = opt or ctx.dense_optimizer
    return ctx


def step(ctx, seed: int, batch: int = 12, scale_loss: float = 1.0) -> None:
    non_id, emb, labels = inputs(batch, seed=seed)
    scaled, _ = ctx._precision.scale(bce(ctx.model(non_id, emb), labels) * scale_loss)
    scaled.backward()


def apply(ctx) -> None:
    ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    ctx.dense_optimizer.zero_grad(set_to_none=True)


def model(seed: int = 0, **kw) -> DeepModel:
    torch.manual_seed(seed)
    return DeepModel(**kw)


def grads(m) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in m.parameters()])


def params(m) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def state_numel(optimizer) -> int:
    return sum(
        v.numel()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim()
    )


def zero() -> dict:
    base = model()
    plain_model, zero_model = copy.deepcopy(base), copy.deepcopy(base)
    plain = distributed(None, plain_model, torch.optim.Adam(plain_model.parameters(), lr=0.01))
    sharded = distributed(
        {"zero.level": "v1"}, zero_model, torch.optim.Adam(zero_model.parameters(), lr=0.01)
    )
    for k in range(5):
        for ctx in (plain, sharded):
            step(ctx, seed=100 * RANK + k)
            apply(ctx)
    return {
        "zero_max_param_diff": float((params(plain_model) - params(zero_model)).abs().max()),
        "zero_moved": float((params(base) - params(zero_model)).abs().max()),
        "zero_state_numel": state_numel(sharded.dense_optimizer.optim),
        "plain_state_numel": state_numel(plain.dense_optimizer),
        "zero_is_zero": isinstance(sharded.dense_optimizer, ZeroRedundancyOptimizer),
    }


def zero_scheduler() -> dict:
    """A LambdaLR on the user's optimizer: lr x1, x0.5, x1 (after a state-dict round trip), then 0."""
    factors = [1.0, 0.5, 1.0, 0.0, 0.0, 0.0]
    base = model()
    runs = {}
    for name, config in (("plain", None), ("zero", {"zero.level": "v1"})):
        m = copy.deepcopy(base)
        user_opt = torch.optim.Adam(m.parameters(), lr=0.01)
        ctx = distributed(config, m, user_opt)
        sched = torch.optim.lr_scheduler.LambdaLR(user_opt, lambda e: factors[min(e, 5)])
        trail = [params(m)]
        for k in range(6):
            if k == 2:  # a checkpoint round trip of the optimizer state, as load_checkpoint does
                opt = ctx.dense_optimizer
                if hasattr(opt, "consolidate_state_dict"):
                    opt.consolidate_state_dict(to=0)
                box = [opt.state_dict() if RANK == 0 else None]
                torch.distributed.broadcast_object_list(box, src=0)
                opt.load_state_dict(box[0])
            step(ctx, seed=100 * RANK + k)
            apply(ctx)
            sched.step()
            trail.append(params(m))
        runs[name] = trail
    moved = [
        float((b - a).abs().max()) for a, b in zip(runs["zero"], runs["zero"][1:], strict=False)
    ]
    return {
        "zero_sched_moved": moved,
        "zero_sched_vs_plain": max(
            float((a - b).abs().max()) for a, b in zip(runs["zero"], runs["plain"], strict=True)
        ),
    }


def zero_existing_state() -> dict:
    """Adam state from a step taken before TrainCtx (a restored checkpoint): ZeRO keeps it."""
    base = model()
    out = {}
    for name, config in (("plain", None), ("zero", {"zero.level": "v1"})):
        m = copy.deepcopy(base)
        user_opt = torch.optim.Adam(m.parameters(), lr=0.01)
        non_id, emb, labels = inputs(12, seed=7)  # the same local step on both ranks
        bce(m(non_id, emb), labels).backward()
        user_opt.step()
        user_opt.zero_grad()
        ctx = distributed(config, m, user_opt)
        for k in range(2):
            step(ctx, seed=100 * RANK + k)
            apply(ctx)
        out[name] = params(m)
    return {"zero_kept_state_diff": float((out["plain"] - out["zero"]).abs().max())}


def reduce_method() -> dict:
    out = {}
    for method in ("mean", "sum"):
        m = model()
        ctx = distributed({"communication.gradients_reduce_method": method}, m)
        step(ctx, seed=RANK)
        out[method] = grads(m)
    return {
        "sum_minus_2mean": float((out["sum"] - 2 * out["mean"]).abs().max()),
        "mean_norm": float(out["mean"].norm()),
    }


def fp16() -> dict:
    out = {}
    for name, cfg, scale_loss in (
        ("fp32", {}, 1.0),
        ("fp16", {"communication.fp16": True}, 1.0),
        ("tiny_scale1", {"communication.fp16": True, "communication.fp16_scale": 1}, 1e-9),
        ("tiny_scale_big", {"communication.fp16": True, "communication.fp16_scale": 2**20}, 1e-9),
        ("tiny_fp32", {}, 1e-9),
    ):
        m = model()
        ctx = distributed(cfg, m)
        step(ctx, seed=RANK, scale_loss=scale_loss)
        out[name] = grads(m)
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    return {
        "fp16_rel_err": rel(out["fp16"], out["fp32"]),
        "fp16_bit_equal": bool(torch.equal(out["fp16"], out["fp32"])),
        "tiny_nonzero_scale1": float((out["tiny_scale1"] != 0).float().mean()),
        "tiny_nonzero_scale_big": float((out["tiny_scale_big"] != 0).float().mean()),
        "tiny_rel_err_scale_big": rel(out["tiny_scale_big"], out["tiny_fp32"]),
    }


def buckets() -> dict:
    out = {}
    for splits, comms in ((1, 2), (4, 2), (6, 3)):
        m = model(width=32)
        ctx = distributed(
            {"communication.max_splits": splits, "communication.num_communicators": comms}, m
        )
        reduce_state = ctx.epl_plan.reduce_state
        step(ctx, seed=RANK)  # the first step rebuilds DDP's buckets by gradient order
        apply(ctx)
        seen = reduce_state.buckets_seen
        reduce_state.groups_used.clear()
        step(ctx, seed=RANK + 10)
        out[f"buckets_{splits}"] = reduce_state.buckets_seen - seen
        out[f"groups_used_{splits}_{comms}"] = sorted(reduce_state.groups_used)
        out[f"pool_size_{splits}_{comms}"] = len(reduce_state.groups)
    return out


def clip() -> dict:
    out = {}
    for after in (True, False):
        m = model()
        ctx = distributed(
            {"communication.clip_after_allreduce": after},
            m,
            torch.optim.SGD(m.parameters(), lr=1.0),
        )
        epl.clip_by_global_norm(0.05)  # registered after the TrainCtx is built
        before = params(m)
        step(ctx, seed=RANK, scale_loss=10.0 * (RANK + 1))  # rank 1's gradients are twice rank 0's
        apply(ctx)
        state.reset()
        out[after] = before - params(m)
        # local, unclipped gradients of this rank, for the expected values
        ref = model()
        non_id, emb, labels = inputs(12, seed=RANK)
        (bce(ref(non_id, emb), labels) * 10.0 * (RANK + 1)).backward()
        local = grads(ref)
    gathered = [torch.zeros_like(local) for _ in range(WORLD)]
    torch.distributed.all_gather(gathered, local)
    mean = sum(gathered) / WORLD
    after_expected = mean * min(1.0, 0.05 / float(mean.norm()))
    before_expected = sum(g * min(1.0, 0.05 / float(g.norm())) for g in gathered) / WORLD
    return {
        "clip_after_err": float((out[True] - after_expected).abs().max()),
        "clip_before_err": float((out[False] - before_expected).abs().max()),
        "clip_modes_differ": float((out[True] - out[False]).abs().max()),
    }


def micro() -> dict:
    base = model()
    whole_model, micro_model = copy.deepcopy(base), copy.deepcopy(base)
    whole = distributed(None, whole_model)
    micro_ctx = distributed({"pipeline.num_micro_batch": 3}, micro_model)
    for ctx in (whole, micro_ctx):
        step(ctx, seed=RANK)
    return {"micro_ddp_grad_diff": float((grads(whole_model) - grads(micro_model)).abs().max())}


def sparse_as_dense() -> dict:
    class WithEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 4, sparse=True)

        def forward(self, non_id, embeddings):
            return self.table(non_id[0]).sum(dim=1, keepdim=True)

    torch.manual_seed(0)
    m = WithEmbedding()
    ctx = distributed({"communication.sparse_as_dense": True}, m)
    ids = torch.tensor([RANK, 5])
    ctx.model([ids], []).sum().backward()
    grad = m.table.weight.grad
    return {"sparse_grad_is_sparse": bool(grad.is_sparse), "sparse_rows": grad.sum(dim=1).tolist()}


def main() -> None:
    results: dict = {}
    for scenario in (
        zero,
        zero_scheduler,
        zero_existing_state,
        reduce_method,
        fp16,
        buckets,
        clip,
        micro,
        sparse_as_dense,
    ):
        results.update(scenario())
    with open(os.path.join(sys.argv[1], f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
