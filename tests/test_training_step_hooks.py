"""The training step's public hooks (pyrsia/services/nn_worker/step.py), through TrainCtx,
against a real PS and embedding worker over loopback."""

from __future__ import annotations

import uuid

import pytest
import torch

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import SGD
from pyrsia.services.nn_worker.precision import Precision
from pyrsia.services.nn_worker.step import HOOK_POINTS, StepEvent, TrainingStep
from pyrsia.shared.errors import InvalidInputError
from tests.nn_helpers import SmallModel, environ, job_services, make_batch


@pytest.fixture(scope="module")
def job(redis_server, tmp_path_factory):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"hooks-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
        with job_services(env, tmp_path_factory.mktemp("svc")) as procs:
            yield procs


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _train(steps: int, add_hooks) -> TrainCtx:
    with eval_ctx() as ctx:
        ctx.clear_embeddings()
    model = SmallModel()
    ctx = TrainCtx(
        SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model, mixed_precision=False
    )
    add_hooks(ctx)
    batches = [make_batch([10 * i + 1, 10 * i + 2, 10 * i + 3], seed=i) for i in range(steps)]
    with ctx:
        for batch in DataLoader(ListDataset(batches), embedding_staleness=1):
            output, labels = ctx.forward(batch)
            ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
    return ctx


def test_hooks_run_at_their_points_in_order_with_the_step_state(job):
    seen: list[tuple[str, int, bool]] = []
    weights: dict[str, torch.Tensor] = {}

    def hook(point):
        def record(event: StepEvent) -> None:
            seen.append((point, event.step, event.loss is not None))
            if point == "after_backward":  # the dense gradients exist; the step has not run
                assert all(p.grad is not None for p in event.optimizer.param_groups[0]["params"])
            if point in ("before_dense_step", "after_dense_step"):
                weights[point] = ctx_ref[0].model.linear.weight.detach().clone()

        return record

    ctx_ref: list[TrainCtx] = []

    def add(ctx: TrainCtx) -> None:
        ctx_ref.append(ctx)
        for point in HOOK_POINTS:
            ctx.training_step.add_hook(point, hook(point))

    ctx = _train(2, add)
    expected = [(p, s, p != "before_forward") for s in (1, 2) for p in HOOK_POINTS]
    assert seen == expected
    assert ctx.update_times == 2
    # the optimizer step runs between before_dense_step and after_dense_step
    assert not torch.equal(weights["before_dense_step"], weights["after_dense_step"])


def test_a_removed_hook_stops_running_and_the_contexts_own_hooks_leave_with_it(job):
    calls: list[int] = []
    handles = []

    def mine(event: StepEvent) -> None:
        calls.append(event.step)

    def add(ctx: TrainCtx) -> None:
        handles.append(ctx.training_step.add_hook("step_boundary", mine))

    ctx = _train(2, add)
    assert calls == [1, 2]
    # inside `with` the context adds the checkpointer's and the statistics' hooks; they go at exit
    assert ctx.training_step.hooks("step_boundary") == (mine,)
    handles[0].remove()
    handles[0].remove()  # a second remove is a no-op
    assert ctx.training_step.hooks("step_boundary") == ()


def test_a_step_boundary_hook_sees_a_skipped_embedding_update(job):
    events: list[StepEvent] = []

    def add(ctx: TrainCtx) -> None:
        ctx.training_step.add_hook("step_boundary", events.append)

        def nan_loss(event: StepEvent) -> None:  # poisons the embedding gradients
            for _, tensor in ctx._current_embeddings:
                tensor.register_hook(lambda g: g * float("nan"))

        ctx.training_step.add_hook("before_forward", nan_loss)

    _train(1, add)
    assert [e.finite for e in events] == [False]


def test_unknown_hook_point_and_non_callable_are_refused_naming_the_field():
    step = TrainingStep(Precision(False, None), grad_scalar_update_factor=4.0)
    with pytest.raises(InvalidInputError, match="point.*before_forward"):
        step.add_hook("before_forwards", lambda e: None)
    with pytest.raises(InvalidInputError, match="hook"):
        step.add_hook("after_backward", "not callable")


def test_a_shadow_step_is_marked_for_the_hooks():
    step = TrainingStep(Precision(False, None), grad_scalar_update_factor=4.0)
    marks: list[bool] = []
    step.add_hook("before_forward", lambda e: marks.append(e.shadow))
    step.before_forward(batch=None)  # type: ignore[arg-type]
    with step.shadow():
        assert step.shadowing
        step.before_forward(batch=None)  # type: ignore[arg-type]
    assert not step.shadowing
    assert marks == [False, True]


def test_epl_replaces_the_steps_precision_through_the_public_attribute():
    from persia.epl import Config

    model = SmallModel()
    config = Config({"amp.level": "O1", "amp.loss_scale": 128})
    ctx = TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        epl_config=config,
    )
    assert type(ctx.training_step.precision).__name__ == "EplPrecision"
    assert ctx.grad_scaler is ctx.training_step.precision.scaler
    assert float(ctx.grad_scaler.get_scale()) == 128.0
