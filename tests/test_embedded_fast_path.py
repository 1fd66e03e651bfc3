"""Embedded mode's fast path (pyrsia/services/embedded/fast_path.py) against its general path.

Two in-process engines built from the same files, one with the fast path and one without,
take the same batches, lookups and gradients: the answers, the tensors built from them and
the stores' rows (embeddings and optimizer state) must be the same, bit for bit; batches
the fast path does not take must reach the general path, with its answers and its errors.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from persia.ctx import DataCtx, TrainCtx
from persia.data import DataLoader, StreamingDataset
from persia.embedding.data import (
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
    PersiaBatch,
)
from persia.embedding.optim import Adagrad
from pyrsia.services.embedded.client import EmbeddedClient
from pyrsia.services.embedded.fast_kernels import gather_block
from pyrsia.services.embedded.job import get_embedded_job, reset_embedded_job
from pyrsia.services.nn_worker.features import build_tensors, gradient_payload
from pyrsia.shared import scatter
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.constants import ENV_DATALOADER_ENTRY, ENV_EMBEDDED, ENV_EMBEDDING_CONFIG
from pyrsia.shared.errors import NotFoundError
from pyrsia.shared.settings import Settings
from pyrsia.shared.warming import warming_in_progress
from tests.nn_helpers import environ

SLOTS = ("a", "b", "c", "d")
ADAGRAD = {"type": "adagrad", "lr": 0.1, "initial_accumulator_value": 0.01, "eps": 1e-10}
HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 0.2}


@pytest.fixture
def clients(tmp_path):
    """(fast, general): two engines of the same four single-id dim-4 slots and one bag slot."""
    emb = tmp_path / "embedding_config.yml"
    emb.write_text(
        "slots_config:\n"
        + "".join(f"  {name}: {{dim: 4}}\n" for name in SLOTS)
        + "  bag: {dim: 4}\n"
    )
    glob = tmp_path / "global_config.yml"
    glob.write_text(
        "embedding_parameter_server_config:\n  capacity: 1000\n  num_hashmap_internal_shards: 3\n"
    )
    made = [
        EmbeddedClient(load_embedding_config(emb), load_global_config(glob), fast_path=fast)
        for fast in (True, False)
    ]
    yield made
    for client in made:
        client.close()


def single_ids(seed: int, n: int = 16) -> PersiaBatch:
    rng = np.random.default_rng(seed)
    return PersiaBatch(
        [IDTypeFeatureWithSingleID(s, rng.integers(0, 12, n, dtype=np.uint64)) for s in SLOTS],
        labels=[Label(np.zeros((n, 1), np.float32))],
    )


def with_bag(seed: int, n: int = 8) -> PersiaBatch:
    """A batch the fast path leaves to the general one (a slot of several ids per sample)."""
    rng = np.random.default_rng(seed)
    bags = [rng.integers(0, 12, size=k, dtype=np.uint64) for k in rng.integers(0, 3, size=n)]
    return PersiaBatch(
        [IDTypeFeatureWithSingleID("a", rng.integers(0, 12, n, dtype=np.uint64))]
        + [IDTypeFeature("bag", bags)],
        labels=[Label(np.zeros((n, 1), np.float32))],
    )


async def step(client: EmbeddedClient, batch: PersiaBatch, batch_id: int, scale: float):
    """Buffer, look up (gathered), build the tensors, backward a fixed function of them,
    send the gradients; the answer, the tensors and what the worker answered."""
    worker = client.worker
    worker.forward.put(batch_id, 0, worker.prepare(batch))
    answer, trainable = await client.lookup(0, batch_id, True, batch.batch_size, gathered=True)
    assert trainable
    tensors = build_tensors([], [], answer.embeddings, requires_grad=True)
    slots = [t for _, t in tensors.embeddings]
    weights = torch.linspace(-2.0, 3.0, sum(s.shape[1] for s in slots))
    (torch.cat(slots, dim=1).sin() * weights * scale).sum().backward()
    payload = gradient_payload(tensors.embeddings, answer.embeddings.tables)
    applied = await client.gradients(
        0,
        batch_id,
        scale,
        payload.slots,
        tables=payload.tables,
        skipped_slots=payload.skipped_slots,
    )
    return answer, tensors, applied


async def setup(clients) -> None:
    for client in clients:
        await client.configure(HYPER)
        await client.register_optimizer(ADAGRAD)


def rows(client: EmbeddedClient) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every stored entry's id and row (embedding and Adagrad state), sorted by id."""
    out = {}
    for dim, (ids, data) in client.store.export_entries().items():
        order = np.argsort(ids)
        out[dim] = (ids[order], data[order])
    return out


def test_the_fast_path_answers_and_updates_as_the_general_path_does(clients):
    fast, general = clients

    async def run() -> None:
        await setup(clients)
        for batch_id in range(8):
            batch = single_ids(batch_id % 5)
            scale = 2.0 if batch_id % 2 else 1.0
            got = [await step(c, batch, batch_id, scale) for c in clients]
            (answer, tensors, applied), (answer2, tensors2, applied2) = got
            assert answer.batch_id == answer2.batch_id == batch_id
            table, table2 = answer.embeddings.tables[0], answer2.embeddings.tables[0]
            assert table.slots == table2.slots == SLOTS
            np.testing.assert_array_equal(table.data, table2.data)
            np.testing.assert_array_equal(table.index, table2.index)
            assert table.index.dtype == table2.index.dtype == np.int32
            assert table2.block is None  # the general path answers the table only
            for (name, t), (name2, t2) in zip(tensors.embeddings, tensors2.embeddings, strict=True):
                assert name == name2
                assert torch.equal(t, t2)
            for (_, a), (_, a2) in zip(answer.embeddings, answer2.embeddings, strict=True):
                np.testing.assert_array_equal(a, a2)
            assert applied == applied2
            assert applied.totals.applied == table.rows
        assert fast.fast.lookups == fast.fast.updates == 8
        assert general.fast.lookups == general.fast.updates == 0
        assert fast.ps.applied_updates == general.ps.applied_updates > 0
        assert len(fast.worker.awaiting) == len(general.worker.awaiting) == 0
        mine, theirs = rows(fast), rows(general)
        assert mine.keys() == theirs.keys() == {4}
        np.testing.assert_array_equal(mine[4][0], theirs[4][0])
        np.testing.assert_array_equal(mine[4][1], theirs[4][1])  # bit for bit, state too

    asyncio.run(run())


def test_other_batches_and_refused_gradients_take_the_general_path(clients):
    fast, general = clients

    async def run() -> None:
        await setup(clients)
        for client in clients:  # a slot of several ids per sample: the general path
            await step(client, with_bag(1), 0, 1.0)
        assert fast.fast.lookups == fast.fast.updates == 0
        np.testing.assert_array_equal(rows(fast)[4][1], rows(general)[4][1])
        # a NaN in the table: the general path skips every slot of it, and says so
        batch = single_ids(3)
        for client in clients:
            worker = client.worker
            worker.forward.put(1, 0, worker.prepare(batch))
            answer, _ = await client.lookup(0, 1, True, batch.batch_size, gathered=True)
            table = answer.embeddings.tables[0]
            grad = np.ones((table.rows, 4), np.float32)
            grad[0, 1] = np.nan
            applied = await client.gradients(0, 1, 1.0, [], tables=[(4, grad)])
            assert applied.skipped_slots == SLOTS and applied.totals.applied == 0
        assert fast.fast.lookups == 1 and fast.fast.updates == 0
        # an unknown batch: the general path's error on both routes
        for client in clients:
            with pytest.raises(NotFoundError, match="batch 7"):
                await client.lookup(0, 7, True, 16, gathered=True)
            with pytest.raises(NotFoundError, match="7"):
                await client.gradients(0, 7, 1.0, [], tables=[(4, np.ones((3, 4), np.float32))])

    asyncio.run(run())


def test_gather_block_writes_the_index_and_the_rows_and_refuses_rows_out_of_range():
    vectors = np.arange(12, dtype=np.float32).reshape(4, 3)
    inverse = np.array([3, 0, 1, 1, 2, 3], np.int64)
    index, block = np.empty((2, 3), np.int32), np.empty((3, 2, 3), np.float32)  # 2 slots, 3 samples
    assert gather_block(vectors, inverse, index, block)
    np.testing.assert_array_equal(index, inverse.reshape(2, 3))
    # sample-major: sample i's slots side by side
    np.testing.assert_array_equal(block, vectors[inverse].reshape(2, 3, 3).transpose(1, 0, 2))
    assert not gather_block(vectors, np.array([0, 4, 1, 1, 2, 3], np.int64), index, block)
    assert not gather_block(vectors, np.array([0, -1, 1, 1, 2, 3], np.int64), index, block)


class TwoSlotModel(torch.nn.Module):
    """A tiny dense network over two single-id slots and the dense columns."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2 + 4 + 4, 1)

    def forward(self, non_id, embeddings):
        return torch.sigmoid(self.linear(torch.cat([non_id[0], *embeddings], dim=1)))


def _loader(errors: list) -> None:
    try:
        with DataCtx() as ctx:
            for i in range(12):
                rng = np.random.default_rng(i)
                ctx.send_data(
                    PersiaBatch(
                        [
                            IDTypeFeatureWithSingleID(s, rng.integers(0, 9, 8, dtype=np.uint64))
                            for s in ("a", "b")
                        ],
                        non_id_type_features=[
                            NonIDTypeFeature(rng.normal(size=(8, 2)).astype(np.float32))
                        ],
                        labels=[Label(rng.integers(0, 2, (8, 1)).astype(np.float32))],
                    )
                )
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _wait_for_warm_kernels(timeout_s: float = 120.0) -> None:
    """Start the warm-up TrainCtx starts on entering (once per process) and wait until every
    warm-up this process started has finished."""
    scatter.warm_in_background()
    deadline = time.monotonic() + timeout_s
    while warming_in_progress():
        assert time.monotonic() < deadline, "the kernel warm-up did not finish"
        time.sleep(0.01)


def _train_streamed(tmp_path, *, fast: bool) -> tuple[list[float], int, dict]:
    """12 single-id batches from an in-process DataCtx through TrainCtx and a
    StreamingDataset in embedded mode; the losses, the fast path's lookups and the rows."""
    config = tmp_path / "embedding_config.yml"
    config.write_text("slots_config:\n  a: {dim: 4}\n  b: {dim: 4}\n")
    env = {ENV_EMBEDDED: "1", ENV_EMBEDDING_CONFIG: str(config), ENV_DATALOADER_ENTRY: None}
    reset_embedded_job()
    try:
        with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
            client = get_embedded_job(Settings.from_env()).client
            client.fast.enabled = fast
            _wait_for_warm_kernels()  # while one runs, batches take the general path, by design
            torch.manual_seed(3)
            model = TwoSlotModel()
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            errors: list = []
            loader = threading.Thread(target=_loader, args=(errors,))
            losses = []
            with TrainCtx(Adagrad(lr=0.05), opt, model=model, mixed_precision=False) as ctx:
                loader.start()
                stream = StreamingDataset(buffer_size=4)
                for batch in DataLoader(stream, reproducible=True, embedding_staleness=1):
                    output, labels = ctx.forward(batch)
                    loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
                    ctx.backward(loss)
                    losses.append(float(loss.detach()))
            loader.join(30)
            assert not errors
            return losses, client.fast.lookups + client.fast.updates, rows(client)
    finally:
        reset_embedded_job()


def test_a_streamed_training_loop_takes_the_fast_path_and_trains_as_the_general_path(tmp_path):
    losses, fast_calls, fast_rows = _train_streamed(tmp_path, fast=True)
    losses2, general_calls, general_rows = _train_streamed(tmp_path, fast=False)
    assert len(losses) == 12 and fast_calls == 24 and general_calls == 0
    assert losses == losses2
    np.testing.assert_array_equal(fast_rows[4][1], general_rows[4][1])
