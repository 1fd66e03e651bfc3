"""The data loader's sender in embedded mode: batches handed to the training loop in process.

:class:`InProcessBatchTransport` is embedded mode's
:class:`~pyrsia.shared.batch_sender.BatchTransport`, and :class:`EmbeddedSender` the data
loader's sender (``pyrsia.shared.batch_sender``, the code services mode runs over HTTP) over
it, which ``persia.ctx.DataCtx`` drives. ``prepare`` readies the batch's id half on the
caller's thread (the embedding worker's preprocessing: hash stack, prefix, dedup; its kernels
release the GIL, so the training thread keeps running); ``deliver``, on the runtime's loop,
buffers it in the in-process worker's forward buffer and queues the dense half for the
training loop, as ``/batch`` and ``/ingress`` would. The bounds are the services': the
sender's ``max_inflight`` sends under way, the forward buffer per loader
(``forward_buffer_size``: a full one is retried with back-off, as a 429 is), and the training
loop's queue (``StreamingDataset(buffer_size)``: a full one makes the send wait).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from pyrsia.services.embedded.job import get_embedded_job
from pyrsia.services.embedding_worker.replica import IDHalf
from pyrsia.services.nn_worker.ingress import BatchQueue
from pyrsia.shared import batch_sender
from pyrsia.shared.constants import (
    BACKPRESSURE_BACKOFF_MAX_S,
    BACKPRESSURE_BACKOFF_S,
    ENV_EMBEDDED,
)
from pyrsia.shared.errors import BackPressureError, ConfigError
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.batch import DensePart
from pyrsia.shared.wire.ingress import IngressBatch

log = logging.getLogger(__name__)


class SplittableBatch(IDHalf, Protocol):
    """What the sender needs of a batch (``persia.embedding.data.PersiaBatch`` is one: its
    constructor checked every field). The worker preprocesses its id features as they are:
    ``id_part()``'s conversion of each feature to the wire type is what HTTP needs."""

    def dense_part(self) -> DensePart: ...


class InProcessBatchTransport:
    """The one data loader's batches to the training loop of this process."""

    def __init__(self, replica_index: int, replica_size: int, settings: Settings):
        if replica_size != 1 or replica_index != 0:
            raise ConfigError(
                f"embedded mode (${ENV_EMBEDDED}=1) runs one data loader, replica 0 of 1; got "
                f"replica {replica_index} of {replica_size}"
            )
        self.replica_index = replica_index
        self.replica_size = replica_size
        self._queue: BatchQueue | None = None
        self._order: asyncio.Lock | None = None  # made on the loop
        self._job = get_embedded_job(settings)

    def open(self, wait_timeout_s: float) -> tuple[int, int]:
        """Wait for the training loop's queue: one embedding worker, one rank."""
        self._queue = self._job.wait_queue(wait_timeout_s)
        log.info("data loader: embedded mode, batches go to this process's training loop")
        return 1, 1

    def prepare(self, batch: SplittableBatch) -> tuple[Any, DensePart]:
        """The id half preprocessed here (kernels release the GIL), and the dense half."""
        return self._job.client.worker.prepare(batch), batch.dense_part()

    async def deliver(
        self,
        prepared: tuple[Any, DensePart],
        batch_id: int,
        worker: int,
        rank: int,
        timeout_s: float,
    ) -> None:
        """Buffer the id half (backing off while the loader's forward buffer is full), then
        queue the dense half (waiting while the training loop's queue is full).

        One delivery at a time, in batch order (the lock is fair): a later batch taking the
        forward buffer's last place while an earlier one backs off would leave a reproducible
        loop waiting for the earlier one for ever."""
        if self._order is None:
            self._order = asyncio.Lock()
        pending, dense = prepared
        async with self._order:
            await self._buffer(batch_id, pending, timeout_s)
            queue = self._queue
            assert queue is not None
            await queue.put(IngressBatch(self.replica_index, batch_id, worker, dense))

    async def _buffer(self, batch_id: int, pending: Any, timeout_s: float) -> None:
        forward = self._job.client.worker.forward
        until = time.monotonic() + timeout_s
        delay = BACKPRESSURE_BACKOFF_S
        while True:
            try:
                forward.put(batch_id, self.replica_index, pending)
                return
            except BackPressureError:
                if time.monotonic() + delay > until:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKPRESSURE_BACKOFF_MAX_S)

    async def done(self, sent_to_rank: Mapping[int, int]) -> None:
        """Tell the training loop how many batches it got."""
        queue = self._queue
        assert queue is not None
        await queue.done(self.replica_index, self.replica_size, sent_to_rank.get(0, 0))

    def close(self) -> None:
        self._queue = None


class EmbeddedSender(batch_sender.BatchSender):
    """Sends the one data loader's batches to the training loop of this process."""

    transport: InProcessBatchTransport
    transport_type = InProcessBatchTransport
