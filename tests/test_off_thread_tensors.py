"""The training thread does dense compute only (issue 10): a batch's tensors are built on
the runtime's event-loop thread, embedding gradients become arrays there too, and a ready
batch is handed over without a round trip to the loop."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from persia.ctx import EmbeddingCtx, PreprocessMode
from pyrsia.services.nn_worker.backward import BackwardEngine
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.embedding_client import EmbeddingWorkerClient
from pyrsia.services.nn_worker.inflight import InflightLimits
from pyrsia.services.nn_worker.prefetch import Prefetcher
from pyrsia.shared.errors import GradientSendError, RuntimeClosedError
from pyrsia.shared.runtime import Runtime
from pyrsia.shared.wire.batch import DenseArray, DensePart
from tests.redis_server import free_port


@pytest.fixture
def runtime():
    rt = Runtime().start()
    yield rt
    rt.stop()


class FunctionSource:
    """A prefetch.BatchSource over two coroutine functions (the test's items and lookup)."""

    def __init__(self, fetch_next, lookup):
        self.fetch_next, self.lookup_fn = fetch_next, lookup

    async def next(self):
        return await self.fetch_next()

    async def lookup(self, item):
        return await self.lookup_fn(item)

    def close(self, runtime) -> None:
        pass


def _batch(batch_id: int = 7) -> PersiaTrainingBatch:
    rng = np.random.default_rng(batch_id)
    dense = DensePart(
        4,
        (DenseArray(None, rng.random((4, 3), dtype=np.float32)),),
        (DenseArray(None, np.ones((4, 1), np.float32)),),
        None,
    )
    embeddings = [(f"s{i}", rng.random((4, 2), dtype=np.float32)) for i in range(3)]
    for _, array in embeddings:
        array.flags.writeable = False  # as the wire decodes them
    return PersiaTrainingBatch(dense, embeddings, True, worker=0, batch_id=batch_id)


def test_prepare_features_takes_the_tensors_built_on_the_loop(runtime):
    batch = _batch()
    built_on: list[str] = []

    async def build() -> None:  # what the DataLoader's lookup does after the answer arrived
        built_on.append(threading.current_thread().name)
        batch.build_tensors(requires_grad=True)

    runtime.run(build())
    prebuilt = batch._tensors
    assert built_on == ["pyrsia-runtime"] and prebuilt is not None
    ctx = EmbeddingCtx(PreprocessMode.TRAIN)
    non_id, embeddings, labels = ctx.prepare_features(batch)
    # the very tensors built on the loop: the training thread copied nothing
    assert all(a is b for a, (_, b) in zip(embeddings, prebuilt.embeddings, strict=True))
    assert non_id[0] is prebuilt.non_id[0] and labels[0] is prebuilt.labels[0]
    for tensor, (_, array) in zip(embeddings, batch.embeddings, strict=True):
        assert tensor.is_leaf and tensor.requires_grad
        np.testing.assert_array_equal(tensor.detach().numpy(), array)
    np.testing.assert_array_equal(non_id[0].numpy(), batch.non_id_type_features[0])
    # a second forward of the same batch gets fresh leaves (gradients must not add up)
    _, again, _ = ctx.prepare_features(batch)
    assert all(a is not b for a, b in zip(again, embeddings, strict=True))
    np.testing.assert_array_equal(again[0].detach().numpy(), embeddings[0].detach().numpy())


def test_prebuilt_tensors_are_not_used_in_another_mode(runtime):
    batch = _batch()
    batch.build_tensors(requires_grad=True)
    prebuilt = batch._tensors
    assert prebuilt is not None
    _, embeddings, labels = EmbeddingCtx(PreprocessMode.INFERENCE).prepare_features(batch)
    assert labels is None
    assert not embeddings[0].requires_grad and embeddings[0] is not prebuilt.embeddings[0][1]


def test_gradient_arrays_are_made_on_the_loop_not_the_training_thread(runtime):
    client = EmbeddingWorkerClient(runtime.client, addresses=[f"127.0.0.1:{free_port()}"])
    client.http.retries = 0
    engine = BackwardEngine(runtime, client, InflightLimits(backward_buffer=2))
    leaf = torch.ones(4, 2, requires_grad=True)
    (leaf * 3).sum().backward()
    made_on: list[str] = []

    def grads():
        made_on.append(threading.current_thread().name)
        return [("s", leaf.grad.numpy())]

    engine.submit(0, 1, 1.0, grads)
    with pytest.raises(GradientSendError):  # nobody listens on that port
        engine.flush()
    assert made_on == ["pyrsia-runtime"]


def _prefetcher(runtime: Runtime, lookup) -> Prefetcher:
    items = iter(range(5))

    async def fetch_next():
        return next(items, None)

    return Prefetcher(
        runtime,
        FunctionSource(fetch_next, lookup),
        num_workers=2,
        buffer_size=2,
        staleness=None,
    ).start()


def test_a_failed_lookup_is_raised_once_at_its_batch(runtime):
    async def lookup(i: int) -> PersiaTrainingBatch:
        if i == 1:
            raise ValueError("lookup 1 failed")
        return _batch(i)

    prefetcher = _prefetcher(runtime, lookup)
    try:
        assert prefetcher.next(5.0).batch_id == 0
        with pytest.raises(ValueError, match="lookup 1 failed"):
            prefetcher.next(5.0)
        assert [prefetcher.next(5.0).batch_id for _ in range(3)] == [2, 3, 4]
        assert prefetcher.next(5.0) is None
        assert prefetcher.next(5.0) is None  # the end stays the end
    finally:
        prefetcher.close()


def test_waiting_for_a_batch_ends_when_the_runtime_stops():
    runtime = Runtime().start()

    async def lookup(i: int) -> PersiaTrainingBatch:
        await asyncio.sleep(60)
        return _batch(i)

    prefetcher = _prefetcher(runtime, lookup)
    threading.Timer(0.2, runtime.stop).start()
    started = time.monotonic()
    with pytest.raises(RuntimeClosedError):
        prefetcher.next(30.0)
    assert time.monotonic() - started < 5.0  # not the 30 s timeout
    prefetcher.close()
    with pytest.raises(TimeoutError):
        _prefetcher_timeout()


def _prefetcher_timeout() -> None:
    runtime = Runtime().start()

    async def lookup(i: int) -> PersiaTrainingBatch:
        await asyncio.sleep(60)
        return _batch(i)

    prefetcher = _prefetcher(runtime, lookup)
    try:
        prefetcher.next(0.2)
    finally:
        prefetcher.close()
        runtime.stop()
