"""DataCtx against real services: an embedding worker and PS as subprocesses, and an
NN-worker ingress with a tiny queue hosted in this process."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from persia._data_ctx import DataCtx, DataCtxError
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.services.nn_worker.runtime import get_runtime
from pyrsia.shared.errors import RegistryError
from pyrsia.shared.registry import RegistrySettings
from tests.nn_helpers import environ, job_services, make_batch


@pytest.fixture
def job(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"dctx-{uuid.uuid4().hex[:8]}"}
    with environ(**env, REPLICA_INDEX="1", REPLICA_SIZE="2"), job_services(env, tmp_path):
        from persia.env import reload_env

        reload_env()
        yield env
    reload_env()


def start_ingress(env: dict[str, str], capacity: int) -> tuple[Ingress, BatchQueue]:
    queue = BatchQueue(capacity, rank=0, world_size=1)
    settings = RegistrySettings(redis_url=env["PERSIA_REDIS_URL"], job_id=env["PERSIA_JOB_ID"])
    ingress = Ingress(queue, registry_settings=settings)
    get_runtime().run(ingress.start())
    return ingress, queue


def test_sends_with_back_pressure_refuses_duplicates_and_ends_the_stream(job):
    ingress, queue = start_ingress(job, capacity=2)
    received: list[int] = []

    async def slow_consumer() -> None:
        while True:
            await asyncio.sleep(0.1)  # slower than the loader: the queue fills, sends get 429
            item = await queue.get()
            if item is None:
                return
            received.append(item.batch_id)

    try:
        ctx = DataCtx(max_inflight=2)
        with pytest.raises(DataCtxError, match="outside"):
            ctx.send_data(make_batch([1, 2]))
        consumer = get_runtime().submit(slow_consumer())
        with ctx:
            batches = [make_batch([10 * k, 10 * k + 1], seed=k) for k in range(6)]
            for batch in batches:
                ctx.send_data(batch)
            with pytest.raises(DataCtxError, match="already sent"):
                ctx.send_data(batches[0])
        # replica 1 of 2: global batch ids k * 2 + 1, all delivered despite the full queue
        for _ in range(100):
            if len(received) == 6:
                break
            get_runtime().run(asyncio.sleep(0.05))
        assert sorted(received) == [1, 3, 5, 7, 9, 11]
        assert not consumer.done()  # loader 0 of 2 has not said it is done yet
        client = get_runtime().client
        get_runtime().run(
            client.call(
                f"http://{ingress.address}/done", {"loader": 0, "loader_count": 2, "sent": 0}
            )
        )
        consumer.result(timeout=30)  # now the stream ends by itself
        assert queue.finished()
    finally:
        get_runtime().run(ingress.stop())


def test_missing_nn_workers_are_named(job):
    with pytest.raises(RegistryError, match="nn_worker"):
        with DataCtx(wait_timeout_s=0.5):
            pass
