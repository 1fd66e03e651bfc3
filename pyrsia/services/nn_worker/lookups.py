"""Where the training loop's batches come from, and how each one's embeddings are looked up.

A :class:`~pyrsia.services.nn_worker.prefetch.Prefetcher` reads one :class:`BatchSource`:

- :class:`StreamedLookups`: a ``StreamingDataset``'s batches, pushed by the data loaders
  to this rank's ingress queue (their ids already wait at an embedding worker); the lookup
  names the batch by its reference (worker, batch id). PERSIA's data-flow step 3.
- :class:`DirectLookups`: an ``IterableDataset``'s ``PersiaBatch`` es, read by one helper
  thread (:class:`IteratorReader`); the lookup sends
  the batch's ids to an embedding worker itself (the direct path).

Both build the batch's tensors on the event-loop thread, off the training thread.
``persia.data.DataLoader`` picks the source and hands it to the Prefetcher (both are
:class:`~pyrsia.services.nn_worker.prefetch.BatchSource` s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.services.nn_worker.ingress import BatchQueue
from pyrsia.shared.runtime import Runtime
from pyrsia.shared.wire.batch import DensePart, IDPart
from pyrsia.shared.wire.ingress import IngressBatch


class UserBatch(Protocol):
    """What a direct lookup needs of a batch (``persia.embedding.data.PersiaBatch`` is one)."""

    requires_grad: bool

    def id_part(self) -> IDPart: ...

    def dense_part(self) -> DensePart: ...


class StreamedLookups:
    """Batches from this rank's ingress queue, looked up at the worker holding their ids."""

    def __init__(
        self,
        queue: BatchQueue,
        client: EmbeddingClient,
        *,
        train: bool,
        device_id: int | None,
    ):
        self.queue = queue
        self.client = client
        self.train = train
        self.device_id = device_id

    async def next(self) -> IngressBatch | None:
        return await self.queue.get()

    async def lookup(self, item: IngressBatch) -> PersiaTrainingBatch:
        embeddings, trainable = await self.client.lookup(
            item.worker, item.batch_id, self.train, item.dense.batch_size, gathered=True, carry=True
        )
        batch = PersiaTrainingBatch(
            item.dense,
            embeddings.embeddings,
            trainable,
            worker=item.worker if trainable else None,
            batch_id=item.batch_id if trainable else None,
            device_id=self.device_id,
        )
        batch.build_tensors(requires_grad=self.train)  # here, off the training thread
        return batch

    def close(self, runtime: Runtime) -> None:
        """Nothing to release: the queue belongs to the rank's ingress."""


class DirectLookups:
    """A user's iterator of batches, read ahead by one helper thread and looked up directly."""

    def __init__(
        self,
        iterator: Iterator[Any],
        buffer_size: int,
        check: Callable[[Any], UserBatch],
        client: EmbeddingClient,
        *,
        train: bool,
        device_id: int | None,
    ):
        self.reader = IteratorReader(iterator, buffer_size, check)
        self.client = client
        self.train = train
        self.device_id = device_id

    async def next(self) -> UserBatch | None:
        return await self.reader.next()

    async def lookup(self, batch: UserBatch) -> PersiaTrainingBatch:
        answer, worker = await self.client.lookup_direct(
            batch.id_part(), self.train and batch.requires_grad, gathered=True
        )
        looked_up = PersiaTrainingBatch(
            batch.dense_part(),
            answer.embeddings,
            batch.requires_grad,
            worker=worker if answer.batch_id is not None else None,
            batch_id=answer.batch_id,
            device_id=self.device_id,
        )
        looked_up.build_tensors(requires_grad=self.train)  # here, off the training thread
        return looked_up

    def close(self, runtime: Runtime) -> None:
        """Stop the helper thread."""
        self.reader.close(runtime)


_READ_END = object()


class _ReadFailed:
    """The user's iterator raised: the reader's queue hands the error on."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class IteratorReader:
    """Reads a user's iterator of PersiaBatches in one helper thread, ``buffer_size`` ahead."""

    def __init__(self, iterator, buffer_size: int, check: Callable[[Any], Any]):
        self._iterator = iterator
        self._check = check
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyrsia-dataset")
        self._buffer_size = buffer_size
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    def _read_one(self) -> Any:
        try:
            return self._check(next(self._iterator))
        except StopIteration:
            return _READ_END

    async def _fill(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await loop.run_in_executor(self._executor, self._read_one)
                await self._queue.put(item)
                if item is _READ_END:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._queue.put(_ReadFailed(exc))

    async def next(self) -> Any:
        """The next checked item, or None when the iterator is exhausted."""
        if self._queue is None:
            self._queue = asyncio.Queue(maxsize=self._buffer_size)
            self._task = asyncio.create_task(self._fill())
        item = await self._queue.get()
        if item is _READ_END:
            self._queue.put_nowait(_READ_END)
            return None
        if isinstance(item, _ReadFailed):
            raise item.exc
        return item

    def close(self, runtime: Runtime) -> None:
        """Cancel the reader task and wait for the helper thread."""
        task = self._task

        async def stop() -> None:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        if task is not None and runtime.running:
            runtime.run(stop())
        self._executor.shutdown(wait=True, cancel_futures=True)
