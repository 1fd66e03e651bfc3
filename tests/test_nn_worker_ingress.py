"""The NN worker's batch ingress: bounded queue, ordering, end of stream, registry, HTTP codes."""

from __future__ import annotations

import asyncio
import threading
import uuid

import numpy as np
import pytest
import torch

from persia.ctx import TrainCtx
from persia.data import DataLoader, StreamingDataset
from persia.embedding.optim import SGD
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.errors import BackPressureError, ConflictError, InvalidInputError
from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.ingress import IngressBatch
from tests.nn_helpers import SmallModel, environ, job_services, make_batch


def _item(batch_id: int, loader: int = 0) -> IngressBatch:
    return IngressBatch(loader=loader, batch_id=batch_id, worker=0, dense=None)  # type: ignore[arg-type]


async def test_fifo_back_pressure_duplicates_and_end_of_stream():
    queue = BatchQueue(2, rank=0, world_size=1, room_wait_s=0.01)
    await queue.put(_item(0))
    await queue.put(_item(1))
    with pytest.raises(BackPressureError):
        await queue.put(_item(2))
    with pytest.raises(ConflictError):
        await queue.put(_item(1))
    assert (await queue.get()).batch_id == 0
    await queue.put(_item(2))
    await queue.done(0, 1, 3)
    assert [(await queue.get()).batch_id for _ in range(2)] == [1, 2]
    assert await queue.get() is None
    with pytest.raises(ConflictError):
        await queue.put(_item(9))


async def test_a_failed_stream_raises_its_error_to_a_waiting_and_a_later_get():
    queue = BatchQueue(4, rank=0, world_size=1)
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    await queue.fail(RuntimeError("no such data file"))
    with pytest.raises(RuntimeError, match="no such data file"):
        await asyncio.wait_for(waiting, 5)
    await queue.put(_item(0))  # a batch queued after the failure is not handed out
    with pytest.raises(RuntimeError, match="no such data file"):
        await queue.get()


async def test_full_queue_holds_a_batch_until_the_loop_takes_one():
    queue = BatchQueue(1, rank=0, world_size=1, room_wait_s=5.0)
    await queue.put(_item(0))
    held = asyncio.create_task(queue.put(_item(1)))
    await asyncio.sleep(0.05)
    assert not held.done()  # no 429 while the loop may still make room
    assert (await queue.get()).batch_id == 0
    await asyncio.wait_for(held, 1.0)
    assert (await queue.get()).batch_id == 1
    assert len(queue) == 0


async def test_full_queue_answers_back_pressure_after_the_room_wait():
    queue = BatchQueue(1, rank=0, world_size=1, room_wait_s=0.05)
    await queue.put(_item(0))
    started = asyncio.get_running_loop().time()
    with pytest.raises(BackPressureError):
        await queue.put(_item(1))
    assert asyncio.get_running_loop().time() - started >= 0.05
    assert len(queue) == 1 and (await queue.get()).batch_id == 0  # nothing stored was lost


async def test_stream_waits_for_every_loader_then_ends():
    queue = BatchQueue(4, rank=0, world_size=1)
    getter = asyncio.create_task(queue.get())
    await queue.done(0, 2, 0)
    await asyncio.sleep(0.01)
    assert not getter.done()  # loader 1 has not said done yet
    await queue.put(_item(1, loader=1))
    assert (await getter).batch_id == 1
    await queue.done(1, 2, 1)
    assert await queue.get() is None


async def test_reproducible_order_skips_ids_of_finished_loaders():
    # rank 1 of 2, two loaders: loader l sends ids k * 2 + l; rank 1 gets the odd ones.
    queue = BatchQueue(2, rank=1, world_size=2, reproducible=True, room_wait_s=0.01)
    with pytest.raises(InvalidInputError):
        await queue.put(_item(4))
    await queue.put(_item(5, loader=1))
    await queue.put(_item(3, loader=1))
    with pytest.raises(BackPressureError):
        await queue.put(_item(7, loader=1))  # full, and not the next expected id
    await queue.put(_item(1, loader=1))  # the expected id is always taken
    assert [(await queue.get()).batch_id for _ in range(3)] == [1, 3, 5]
    await queue.put(_item(9, loader=1))
    await queue.done(0, 2, 0)
    await queue.done(1, 2, 4)
    assert (await queue.get()).batch_id == 9  # 7 never comes: its loader is done
    assert await queue.get() is None


async def test_ingress_registers_answers_http_and_deregisters(registry_settings):
    queue = BatchQueue(1, rank=1, world_size=3)
    ingress = Ingress(queue, registry_settings=registry_settings)
    address = await ingress.start()
    registry = Registry(registry_settings)
    client = HttpClient(retries=0)
    try:
        record = (await registry.discover(ROLE_NN_WORKER))[1]
        assert record.address == address and record.replica_size == 3
        dense = make_batch([1, 2]).dense_part().to_wire()
        body = {"loader": 0, "batch_id": 4, "worker": 0, "dense": dense}
        assert await client.call(f"http://{address}/ingress", body) == {}
        with pytest.raises(ConflictError):
            await client.call(f"http://{address}/ingress", body)
        with pytest.raises(BackPressureError):
            await client.call(f"http://{address}/ingress", {**body, "batch_id": 7})
        with pytest.raises(RemoteBadRequestError) as info:
            await client.call(
                f"http://{address}/ingress", {**body, "batch_id": 10, "dense": {"batch_size": "x"}}
            )
        assert info.value.field == "dense.batch_size"
        item = await queue.get()
        assert item.dense.labels[0].data.shape == (2, 1)
    finally:
        await client.close()
        await ingress.stop()
    assert 1 not in await registry.discover(ROLE_NN_WORKER)
    await registry.close()


async def _feed(n_batches: int) -> None:
    """A fake data loader: ``n_batches`` id parts to the embedding worker, their dense parts to
    rank 0's ingress, then ``/done``."""
    registry = Registry(RegistrySettings.from_env(Settings.from_env()))
    client = HttpClient()
    try:
        worker = (await registry.wait_for(ROLE_EMBEDDING_WORKER, timeout_s=30))[0]
        rank0 = (await registry.wait_for(ROLE_NN_WORKER, timeout_s=30))[0]
        for k in range(n_batches):
            batch = make_batch([5000 + k, 5001 + k], seed=k)
            await client.call(
                f"{worker.url}/batch",
                {"loader": 0, "batch_id": k, "batch": batch.id_part().to_wire()},
            )
            await client.call(
                f"{rank0.url}/ingress",
                {"loader": 0, "batch_id": k, "worker": 0, "dense": batch.dense_part().to_wire()},
                until=1e12,
            )
        await client.call(f"{rank0.url}/done", {"loader": 0, "loader_count": 1, "sent": n_batches})
    finally:
        await client.close()
        await registry.close()


def test_streaming_dataset_ends_when_the_loaders_are_done(redis_server, tmp_path):
    """A fake data loader pushes id parts to the embedding worker and dense parts to the ingress."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"stream-{uuid.uuid4().hex[:8]}"}
    n_batches = 6

    errors: list[BaseException] = []

    def loader_thread() -> None:
        try:
            asyncio.run(_feed(n_batches))
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    with environ(**env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"), job_services(env, tmp_path):
        from persia import env as persia_env

        persia_env.reload_env()
        model = SmallModel()
        seen = []
        feeder = threading.Thread(target=loader_thread)
        with TrainCtx(
            SGD(lr=0.1),
            torch.optim.SGD(model.parameters(), lr=0.1),
            model=model,
            mixed_precision=False,
        ) as ctx:
            feeder.start()
            for batch in DataLoader(
                StreamingDataset(buffer_size=2), embedding_staleness=2, timeout_ms=90000
            ):
                output, labels = ctx.forward(batch)
                ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
                seen.append(batch.batch_id)
        feeder.join()
        persia_env.reload_env()
    assert not errors, errors
    assert seen == list(range(n_batches))
    assert np.isfinite(seen).all()
