"""DataCtx against real services: an embedding worker and PS as subprocesses, and an
NN-worker ingress with a tiny queue hosted in this process."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from persia._data_ctx import DataCtx, DataCtxError
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from pyrsia.shared.errors import RegistryError
from pyrsia.shared.registry import RegistrySettings
from pyrsia.shared.runtime import get_runtime
from tests.nn_helpers import EMBEDDING_CONFIG, environ, job_services, make_batch
from tests.service_procs import ServiceProc


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


def _embedding_worker(config, index: int, env: dict, tmp_path) -> ServiceProc:
    """Replica ``index`` of 2 embedding workers, started without waiting for it."""
    return ServiceProc.start(
        "pyrsia.services.embedding_worker",
        [
            "--port",
            "0",
            "--embedding-config",
            str(config),
            "--replica-index",
            str(index),
            "--replica-size",
            "2",
        ],
        env,
        role=ROLE_EMBEDDING_WORKER,
        replica_index=index,
        wait_ready=False,
        log_dir=tmp_path,
    )


def _send_four_batches(env: dict, late: threading.Thread) -> list:
    """A loader (replica 0 of 1) sends four batches, ``late`` started just before it; the
    four items the NN worker's ingress received."""
    from persia.env import reload_env

    with environ(**env, REPLICA_INDEX="0", REPLICA_SIZE="1"):
        reload_env()
        ingress, queue = start_ingress(env, capacity=8)
        try:
            late.start()
            with DataCtx() as ctx:
                for k in range(4):
                    ctx.send_data(make_batch([10 * k, 10 * k + 1], seed=k))
            items = [get_runtime().run(queue.get()) for _ in range(4)]
        finally:
            get_runtime().run(ingress.stop())
    reload_env()
    return items


def test_a_loader_deals_batches_to_every_embedding_worker_replica(redis_server, tmp_path):
    """Started while replica 1 of 2 embedding workers is still starting, the loader waits for
    it (as the NN worker does) instead of sending every batch to replica 0."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"dctx-{uuid.uuid4().hex[:8]}"}
    config = tmp_path / "embedding_config.yml"
    config.write_text(EMBEDDING_CONFIG)
    procs: list[ServiceProc] = []

    def worker(index: int) -> None:
        procs.append(_embedding_worker(config, index, env, tmp_path))

    late = threading.Thread(target=lambda: (time.sleep(0.5), worker(1)))
    try:
        procs.append(
            ServiceProc.start(
                "pyrsia.services.embedding_ps",
                ["--port", "0"],
                env,
                role=ROLE_EMBEDDING_PS,
                wait_ready=False,
                log_dir=tmp_path,
            )
        )
        worker(0)
        items = _send_four_batches(env, late)
        assert sorted((item.batch_id, item.worker) for item in items) == [
            (0, 0),
            (1, 1),
            (2, 0),
            (3, 1),
        ]
    finally:
        late.join()
        codes = [(p.role, p.stop()) for p in reversed(procs)]
        assert all(code == 0 for _, code in codes), codes
