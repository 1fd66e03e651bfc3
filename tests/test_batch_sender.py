"""The data loader's sender (pyrsia/shared/batch_sender.py), one code over two batch transports.

Over HTTP the batches go to a real embedding worker and PS (loopback, real Redis) and an
NN-worker ingress hosted in this process; in process they go to embedded mode's engines and
its training loop's queue. Both streams carry the same batches (the in-process one in batch
order; over HTTP two sends under way may arrive swapped), and the embeddings the one
embedding client looks up for them are the same.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyrsia.services.data_loader.sender import BatchSender
from pyrsia.services.embedded.job import EmbeddedSession, reset_embedded_job
from pyrsia.services.embedded.sender import EmbeddedSender
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient, EmbeddingWorkerClient
from pyrsia.services.nn_worker.ingress import BatchQueue
from pyrsia.shared import batch_sender
from pyrsia.shared.constants import ENV_EMBEDDED, ENV_EMBEDDING_CONFIG, ENV_GLOBAL_CONFIG
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.registry import Registry
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.settings import Settings
from tests.test_data_ctx import start_ingress
from tests.test_embedded_client import HYPER, arrays, batch
from tests.test_embedding_worker_service import configs, start_cluster

__all__ = ["configs"]  # the fixture, re-used

BATCHES = 5


def send_and_read(sender: batch_sender.BatchSender, queue: BatchQueue, client: EmbeddingClient):
    """Send the batches, finish, then read the stream to its end and look each batch up."""
    runtime = get_runtime()
    runtime.run(client.configure(HYPER))
    sender.open()
    for k in range(BATCHES):
        sender.send(batch(k))
    sender.finish()
    sender.close()

    async def read() -> list[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]:
        seen = []
        while (item := await queue.get()) is not None:
            rows = item.dense.batch_size
            found, _ = await client.lookup(item.worker, item.batch_id, False, rows)
            labels = np.asarray(item.dense.labels[0].data)
            seen.append((item.batch_id, item.worker, labels, arrays(found)))
        return seen

    return runtime.run(read(), timeout_s=60)


def test_one_sender_over_both_transports_delivers_the_same_stream(
    services, configs, registry_settings, monkeypatch
):
    flags = configs()
    start_cluster(services, flags, n_ps=1)
    env = {
        "PERSIA_REDIS_URL": registry_settings.redis_url,
        "PERSIA_JOB_ID": registry_settings.job_id,
    }
    ingress, queue = start_ingress(env, capacity=16)
    registry = Registry(registry_settings)
    runtime = get_runtime()
    try:
        client = EmbeddingWorkerClient(runtime.client, registry=registry)
        runtime.run(client.connect())
        sender = BatchSender(
            0,
            1,
            wait_timeout_s=30,
            send_timeout_s=30,
            max_inflight=2,
            settings=Settings.from_env(env),
        )
        want = send_and_read(sender, queue, client)
    finally:
        runtime.run(ingress.stop())
        runtime.run(registry.close())
    embedded = {ENV_EMBEDDED: "1", ENV_EMBEDDING_CONFIG: flags[1], ENV_GLOBAL_CONFIG: flags[3]}
    for key, value in embedded.items():
        monkeypatch.setenv(key, value)
    reset_embedded_job()
    session = EmbeddedSession.open(Settings.from_env())
    try:
        queue = session.ingress(rank=0, world_size=1, capacity=16, reproducible=True)
        sender = EmbeddedSender(
            0, 1, wait_timeout_s=30, send_timeout_s=30, max_inflight=2, settings=Settings.from_env()
        )
        got = send_and_read(sender, queue, session.client)
    finally:
        session.close()
        reset_embedded_job()
    assert [b for b, _, _, _ in got] == list(range(BATCHES))  # in order: one hand-over at a time
    want.sort(key=lambda seen: seen[0])  # over HTTP, two sends under way may swap
    assert [(b, w) for b, w, _, _ in got] == [(b, w) for b, w, _, _ in want]
    for (b, _, labels, found), (_, _, labels_want, found_want) in zip(got, want, strict=True):
        np.testing.assert_array_equal(labels, labels_want, err_msg=str(b))
        assert found.keys() == found_want.keys()
        for name in found:
            np.testing.assert_allclose(found[name], found_want[name], rtol=1e-6, err_msg=name)


def test_a_sender_with_no_transport_says_so():
    with pytest.raises(MisuseError, match="BatchSender needs a transport"):
        batch_sender.BatchSender(
            0, 1, wait_timeout_s=1, send_timeout_s=1, max_inflight=1, settings=Settings.from_env({})
        )
