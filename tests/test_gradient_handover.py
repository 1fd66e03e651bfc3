"""When a CPU step's embedding gradients reach the NN worker's loop: as the next backward
starts (autograd has released the GIL then), or as soon as the training thread would wait on
the loop (the next batch, the gradients themselves), never later."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import Adagrad
from pyrsia.services.embedded.job import reset_embedded_job
from pyrsia.services.nn_worker.backward import BackwardEngine
from pyrsia.services.nn_worker.embedding_client import EmbeddingWorkerClient
from pyrsia.services.nn_worker.inflight import InflightLimits
from pyrsia.shared.constants import ENV_EMBEDDED, ENV_EMBEDDING_CONFIG
from pyrsia.shared.errors import GradientSendError
from pyrsia.shared.runtime import Runtime
from tests.nn_helpers import EMBEDDING_CONFIG, SmallModel, environ, make_batch
from tests.redis_server import free_port


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=len(batches))
        self.batches = batches

    def __iter__(self):
        yield from self.batches


@pytest.fixture
def embedded(tmp_path: Path):
    config = tmp_path / "embedding_config.yml"
    config.write_text(EMBEDDING_CONFIG)
    reset_embedded_job()
    with environ(
        **{ENV_EMBEDDED: "1", ENV_EMBEDDING_CONFIG: str(config)},
        RANK=None,
        WORLD_SIZE=None,
        LOCAL_RANK=None,
    ):
        yield
    reset_embedded_job()


def _batches(n: int) -> list:
    return [make_batch([100 + (i * 3 + j) % 13 for j in range(6)], seed=i) for i in range(n)]


def _ctx(model: torch.nn.Module) -> TrainCtx:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return TrainCtx(Adagrad(lr=0.05), optimizer, model=model, mixed_precision=False)


def test_a_cpu_steps_gradients_reach_the_loop_as_the_next_backward_starts(embedded):
    torch.manual_seed(0)
    model = SmallModel()
    during, after, permits = [], [], []
    with _ctx(model) as ctx:
        engine = ctx.training_step.gradients
        for batch in DataLoader(ListDataset(_batches(4)), embedding_staleness=8):
            permits.append(batch.permit)
            output, labels = ctx.forward(batch)
            output.register_hook(lambda g: during.append(engine.handed_over))  # in autograd
            ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            after.append((engine.handed_over, engine.holding))
        ctx.wait_for_gradients()
        assert (engine.handed_over, engine.sent, engine.holding) == (4, 4, False)
    assert during == [0, 1, 2, 3]  # step k's backward runs after steps 0..k-1 were handed over
    assert after == [(0, True), (1, True), (2, True), (3, True)]  # its own is held
    # each permit knows how long it was held, which the lookahead's window leaves out
    assert all(p is not None and p.held_s > 0 for p in permits), [p.held_s for p in permits]


def test_a_loop_waiting_for_its_next_batch_hands_over_what_it_holds(embedded):
    """With embedding_staleness=1 the next lookup needs the held batch's permit back: the
    DataLoader hands it over before it waits, so every batch trains (no 10 s timeout)."""
    torch.manual_seed(0)
    model = SmallModel()
    trained = 0
    with _ctx(model) as ctx:
        loader = DataLoader(ListDataset(_batches(5)), embedding_staleness=1, timeout_ms=10_000)
        for batch in loader:
            output, labels = ctx.forward(batch)
            ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            trained += 1
        assert ctx.training_step.gradients.sent == 5
    assert trained == 5


@pytest.fixture
def runtime():
    rt = Runtime().start()
    yield rt
    rt.stop()


def test_held_batches_go_out_in_step_order_and_their_failures_surface(runtime):
    client = EmbeddingWorkerClient(runtime.client, addresses=[f"127.0.0.1:{free_port()}"])
    client.http.retries = 0  # nobody listens: every send fails
    engine = BackwardEngine(runtime, client, InflightLimits(backward_buffer=4, backward_workers=1))
    done: list[int] = []
    grads = [("a", np.zeros((2, 4), np.float32))]
    engine.hold(0, 1, 1.0, grads, on_done=lambda: done.append(1))
    assert engine.holding and engine.handed_over == 0
    engine.hold(0, 2, 1.0, grads, on_done=lambda: done.append(2))  # hands 1 over, holds 2
    assert engine.handed_over == 1
    with pytest.raises(GradientSendError, match="not applied"):
        engine.flush()  # hands 2 over and waits for both
    assert done == [1, 2] and not engine.holding and engine.handed_over == 2


def test_a_batch_held_when_the_runtime_stopped_is_reported_not_lost(runtime):
    client = EmbeddingWorkerClient(runtime.client, addresses=[f"127.0.0.1:{free_port()}"])
    engine = BackwardEngine(runtime, client, InflightLimits(backward_buffer=2))
    engine.hold(0, 1, 1.0, [("a", np.zeros((2, 4), np.float32))])
    runtime.stop()
    with pytest.raises(GradientSendError, match="runtime stopped"):
        engine.flush()
    assert not engine.holding
