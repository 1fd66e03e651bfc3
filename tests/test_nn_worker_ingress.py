"""The NN worker's batch ingress: bounded queue, ordering, end of stream, registry, HTTP codes."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import aiohttp
import pytest
import torch

from persia.data import DataLoader, StreamingDataset
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.errors import BackPressureError, ConflictError, InvalidInputError
from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.ingress import IngressBatch
from tests.nn_helpers import SmallModel, environ, job_services, make_batch, small_train_ctx


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


def _train_from_a_fake_loader(
    redis_server, tmp_path, n_batches: int, *, after_training=None, **extra_env: str
) -> list[int]:
    """One rank trains on what :func:`_feed` sends; ``after_training(env)`` runs in the
    ``with TrainCtx`` block once the stream ended. The batch ids seen, in order."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"stream-{uuid.uuid4().hex[:8]}"}
    errors: list[BaseException] = []

    def loader_thread() -> None:
        try:
            asyncio.run(_feed(n_batches))
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    with (
        environ(**env, **extra_env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"),
        job_services(env, tmp_path),
    ):
        from persia import env as persia_env

        persia_env.reload_env()
        model = SmallModel()
        seen = []
        feeder = threading.Thread(target=loader_thread)
        try:
            with small_train_ctx(model) as ctx:
                feeder.start()
                for batch in DataLoader(
                    StreamingDataset(buffer_size=2), embedding_staleness=2, timeout_ms=90000
                ):
                    output, labels = ctx.forward(batch)
                    ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
                    seen.append(batch.batch_id)
                if after_training is not None:
                    after_training(env)
        finally:
            feeder.join()
            persia_env.reload_env()
    assert not errors, errors
    return seen


def test_streaming_dataset_ends_when_the_loaders_are_done(redis_server, tmp_path):
    """A fake data loader pushes id parts to the embedding worker and dense parts to the ingress."""
    assert _train_from_a_fake_loader(redis_server, tmp_path, 6) == list(range(6))


def _scrape_rank0_later(env: dict[str, str], delay_s: float, scrapes: list) -> threading.Thread:
    """A thread that scrapes rank 0's ``/metrics`` ``delay_s`` after it starts: (steps, when)."""

    async def scrape() -> None:
        await asyncio.sleep(delay_s)
        registry = Registry(RegistrySettings(env["PERSIA_REDIS_URL"], env["PERSIA_JOB_ID"]))
        try:
            rank0 = (await registry.discover(ROLE_NN_WORKER))[0]
        finally:
            await registry.close()
        scrapes.append((await _steps_scraped(rank0.address), time.monotonic()))

    thread = threading.Thread(target=asyncio.run, args=(scrape(),))
    thread.start()
    return thread


def test_a_job_that_ends_waits_for_its_final_scrape(redis_server, tmp_path):
    """PYRSIA_FINAL_SCRAPE_S through TrainCtx: leaving the block at the end of the job waits
    for the next scrape, which reads every step; the rank then leaves."""
    scrapes: list[tuple[float, float]] = []
    threads: list[threading.Thread] = []

    def scrape_after_a_while(env: dict[str, str]) -> None:
        threads.append(_scrape_rank0_later(env, 1.0, scrapes))

    seen = _train_from_a_fake_loader(
        redis_server, tmp_path, 5, after_training=scrape_after_a_while, PYRSIA_FINAL_SCRAPE_S="60"
    )
    left = time.monotonic()
    threads[0].join()
    assert seen == list(range(5))
    assert scrapes and scrapes[0][0] == 5  # the final counters
    assert scrapes[0][1] <= left < scrapes[0][1] + 10  # the block ended after that scrape


def test_a_job_that_fails_does_not_wait_for_a_scrape(redis_server, tmp_path):
    raised_at: list[float] = []

    def fail(env: dict[str, str]) -> None:
        raised_at.append(time.monotonic())
        raise RuntimeError("the user's loop failed")

    with pytest.raises(RuntimeError, match="loop failed"):
        _train_from_a_fake_loader(
            redis_server, tmp_path, 2, after_training=fail, PYRSIA_FINAL_SCRAPE_S="60"
        )
    assert time.monotonic() - raised_at[0] < 30  # services stopped too; no 60 s wait


def _final_scrape_settings(registry_settings: RegistrySettings, value: str) -> RegistrySettings:
    environment = Settings.from_env({"PYRSIA_FINAL_SCRAPE_S": value})
    return RegistrySettings(
        redis_url=registry_settings.redis_url,
        job_id=registry_settings.job_id,
        environment=environment,
    )


async def _steps_scraped(address: str) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{address}/metrics") as response:
            text = await response.text()
    line = next(x for x in text.splitlines() if x.startswith("pyrsia_nn_worker_steps"))
    return float(line.split()[-1])


async def test_stop_waits_for_a_final_scrape_that_sees_the_last_step(registry_settings):
    """PYRSIA_FINAL_SCRAPE_S: a job shorter than a few scrape intervals still reaches
    Prometheus with its final counters; the rank stays registered until that scrape."""
    settings = _final_scrape_settings(registry_settings, "30")
    ingress = Ingress(BatchQueue(1, rank=0, world_size=1), registry_settings=settings)
    address = await ingress.start()
    registry = Registry(registry_settings)
    try:
        ingress.stats.steps = 7
        stopping = asyncio.create_task(ingress.stop(final_scrape=True))
        await asyncio.sleep(0.3)
        assert not stopping.done()  # serving, registered, waiting for its scrape
        assert 0 in await registry.discover(ROLE_NN_WORKER)
        assert await _steps_scraped(address) == 7
        await asyncio.wait_for(stopping, 5)
        assert 0 not in await registry.discover(ROLE_NN_WORKER)
    finally:
        await ingress.stop()
        await registry.close()


async def test_stop_gives_up_on_the_final_scrape_after_its_limit(registry_settings):
    settings = _final_scrape_settings(registry_settings, "0.3")
    ingress = Ingress(BatchQueue(1, rank=0, world_size=1), registry_settings=settings)
    await ingress.start()
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(ingress.stop(final_scrape=True), 5)
    assert 0.3 <= asyncio.get_running_loop().time() - started < 3


async def test_stop_waits_for_no_scrape_unset_or_after_a_failure(registry_settings):
    unset = Ingress(BatchQueue(1, rank=0, world_size=1), registry_settings=registry_settings)
    await unset.start()
    started = asyncio.get_running_loop().time()
    await unset.stop(final_scrape=True)
    assert asyncio.get_running_loop().time() - started < 0.3
    settings = _final_scrape_settings(registry_settings, "30")
    failed = Ingress(BatchQueue(1, rank=0, world_size=1), registry_settings=settings)
    await failed.start()
    started = asyncio.get_running_loop().time()
    await failed.stop()  # a job that failed, or got SIGTERM: its supervisor's grace is short
    assert asyncio.get_running_loop().time() - started < 0.3


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_final_scrape_setting_names_the_variable(value):
    from pyrsia.shared.errors import ConfigError

    with pytest.raises(ConfigError, match=f"PYRSIA_FINAL_SCRAPE_S.*{value}"):
        _ = Settings.from_env({"PYRSIA_FINAL_SCRAPE_S": value}).final_scrape_s
