"""The data loader's sender in embedded mode: batches handed to the training loop in process.

:class:`EmbeddedSender` has the interface of the services mode's ``BatchSender``
(``pyrsia/services/data_loader/sender.py``: ``open``, ``send``, ``finish``, ``abort``,
``close``, ``count``, ``skipped``), which ``persia.ctx.DataCtx`` drives. ``send`` prepares the
batch's id half on the caller's thread (the embedding worker's preprocessing: hash stack,
prefix, dedup; its kernels release the GIL, so the training thread keeps running), then, on
the runtime's loop, buffers it in the in-process worker's forward buffer and queues the dense
half for the training loop, as ``/batch`` and ``/ingress`` would. The bounds are the
services': ``max_inflight`` sends under way, the forward buffer per loader
(``forward_buffer_size``: a full one is retried with back-off, as a 429 is), and the training
loop's queue (``StreamingDataset(buffer_size)``: a full one makes the send wait).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from pyrsia.services.embedded.job import get_embedded_job
from pyrsia.services.embedding_worker.replica import IDHalf
from pyrsia.services.nn_worker.ingress import BatchQueue
from pyrsia.shared import job_checkpoint
from pyrsia.shared.constants import (
    BACKPRESSURE_BACKOFF_MAX_S,
    BACKPRESSURE_BACKOFF_S,
    ENV_EMBEDDED,
)
from pyrsia.shared.errors import BackPressureError, ConfigError
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.send_window import SendWindow
from pyrsia.shared.validate import positive_int
from pyrsia.shared.wire.batch import DensePart
from pyrsia.shared.wire.ingress import IngressBatch

log = logging.getLogger(__name__)


class SplittableBatch(IDHalf, Protocol):
    """What the sender needs of a batch (``persia.embedding.data.PersiaBatch`` is one: its
    constructor checked every field). The worker preprocesses its id features as they are:
    ``id_part()``'s conversion of each feature to the wire type is what HTTP needs."""

    def dense_part(self) -> DensePart: ...


class EmbeddedSender:
    """Sends one data loader's batches to the training loop of this process."""

    def __init__(
        self,
        replica_index: int,
        replica_size: int,
        *,
        wait_timeout_s: float,
        send_timeout_s: float,
        max_inflight: int,
    ):
        if replica_size != 1 or replica_index != 0:
            raise ConfigError(
                f"embedded mode (${ENV_EMBEDDED}=1) runs one data loader, replica 0 of 1; got "
                f"replica {replica_index} of {replica_size}"
            )
        self.replica_index = replica_index
        self.replica_size = replica_size
        self.wait_timeout_s = wait_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_inflight = positive_int(max_inflight, "max_inflight")
        self.count = 0
        """Batches handed to :meth:`send` so far (skipped ones included)."""
        self.skipped = 0
        """Batches :meth:`send` dropped because the resumed checkpoint trained them."""
        self._sent = 0
        self._window = SendWindow(max_inflight)
        self._skip: frozenset[int] = frozenset()
        self._queue: BatchQueue | None = None
        self._order: asyncio.Lock | None = None  # made on the loop
        self._job = get_embedded_job()

    # --- lifecycle ---------------------------------------------------------------------
    def open(self) -> None:
        """Read the resume point (``--resume``) and wait for the training loop's queue."""
        if job_checkpoint.resume_requested():
            self._skip = job_checkpoint.resumed_batch_ids(self.replica_index, self.replica_size)
        self._queue = self._job.wait_queue(self.wait_timeout_s)
        log.info("data loader: embedded mode, batches go to this process's training loop")

    def finish(self) -> None:
        """Wait for every send, then tell the training loop how many batches it got."""
        self._window.drain()
        queue = self._queue
        assert queue is not None
        get_runtime().run(queue.done(self.replica_index, self.replica_size, self._sent))
        log.info(
            "data loader: sent %d batches (%d skipped on resume); end of stream announced",
            self._sent,
            self.skipped,
        )

    def abort(self) -> None:
        """Cancel the sends under way."""
        self._window.cancel()

    def close(self) -> None:
        self._queue = None

    # --- sending -----------------------------------------------------------------------
    def send(self, batch: SplittableBatch) -> None:
        """Prepare one batch here and hand it over (blocking while ``max_inflight`` are under
        way); an error of an earlier send is raised here."""
        batch_id = self.count  # replica 0 of 1: batch k has id k
        self.count += 1
        if batch_id in self._skip:
            self.skipped += 1
            return
        self._window.make_room()
        worker = self._job.client.worker
        pending = worker.prepare(batch)  # on this thread; kernels release the GIL
        item = IngressBatch(self.replica_index, batch_id, 0, batch.dense_part())
        self._sent += 1
        self._window.add(get_runtime().submit(self._hand_over(batch_id, pending, item)))

    async def _hand_over(self, batch_id: int, pending, item: IngressBatch) -> None:
        """Buffer the id half (backing off while the loader's forward buffer is full), then
        queue the dense half (waiting while the training loop's queue is full).

        One hand-over at a time, in batch order (the lock is fair): a later batch taking the
        forward buffer's last place while an earlier one backs off would leave a reproducible
        loop waiting for the earlier one for ever."""
        if self._order is None:
            self._order = asyncio.Lock()
        async with self._order:
            await self._hand_over_now(batch_id, pending, item)

    async def _hand_over_now(self, batch_id: int, pending, item: IngressBatch) -> None:
        forward = self._job.client.worker.forward
        until = time.monotonic() + self.send_timeout_s
        delay = BACKPRESSURE_BACKOFF_S
        while True:
            try:
                forward.put(batch_id, self.replica_index, pending)
                break
            except BackPressureError:
                if time.monotonic() + delay > until:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKPRESSURE_BACKOFF_MAX_S)
        queue = self._queue
        assert queue is not None
        await queue.put(item)
