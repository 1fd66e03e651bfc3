"""A data loader's sender, written once against the batch transport protocol.

For batch k of data-loader replica i (of n), the global batch id is k·n + i. Its id
features go to embedding worker k mod W, which buffers them; then its dense part
(non-id features, labels, meta) and the reference go to NN-worker rank
batch_id mod world_size. Sends run on the process's event-loop thread
(:class:`~pyrsia.shared.runtime.Runtime`), at most ``max_inflight`` at a time, so building the
next batch overlaps sending this one; an error from a send surfaces at the next
:meth:`BatchSender.send` or at :meth:`BatchSender.finish`. On a clean finish every NN-worker
rank is told how many batches this loader sent it, which is what ends the ranks'
``StreamingDataset``.

With ``--resume`` the sender skips the batches the newest complete job checkpoint lists as
trained (:mod:`pyrsia.shared.job_checkpoint`): the script builds every batch as before (so
batch ids stay the same), and :meth:`BatchSender.send` drops those already trained, so the
resumed job trains every batch of the epoch exactly once.

How a batch travels is a :class:`BatchTransport`'s business, as an embedding call is an
embedding transport's (:mod:`pyrsia.shared.embedding_transport`)::

    BatchSender.send ── prepare (caller's thread) ── deliver (loop) ─┬─▶ HttpBatchTransport
                                                                     │   (data_loader/sender.py):
                                                                     │   POST /batch, /ingress
                                                                     └─▶ InProcessBatchTransport
                                                                         (embedded/sender.py):
                                                                         the worker's buffer and
                                                                         the training loop's queue
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from pyrsia.shared import job_checkpoint
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.send_window import SendWindow
from pyrsia.shared.settings import Settings
from pyrsia.shared.validate import positive_int

log = logging.getLogger(__name__)


class BatchTransport(Protocol):
    """How one data loader's batches reach the embedding workers and the NN-worker ranks."""

    def open(self, wait_timeout_s: float) -> tuple[int, int]:
        """Find the peers (waiting up to ``wait_timeout_s``, naming what is missing); the
        number of embedding workers and of NN-worker ranks."""
        ...

    def prepare(self, batch: Any) -> Any:
        """On the caller's thread: what :meth:`deliver` sends of ``batch``."""
        ...

    async def deliver(
        self, prepared: Any, batch_id: int, worker: int, rank: int, timeout_s: float
    ) -> None:
        """On the loop: the id half to ``worker``, then the dense half to ``rank``, backing off
        while a bounded queue is full, for at most ``timeout_s``."""
        ...

    async def done(self, sent_to_rank: Mapping[int, int]) -> None:
        """Tell every rank how many batches this loader sent it (the end of its stream)."""
        ...

    def close(self) -> None:
        """Release what :meth:`open` took."""
        ...


class BatchSender:
    """Sends one data-loader replica's batches: open, send, send, ..., finish (or abort).

    Over ``transport``, or else over a new ``transport_type(replica_index, replica_size,
    settings)`` (each mode's sender names its transport type there). ``settings``: the
    process's, from the ``DataCtx`` that sends (``--resume``, the registry, the token).
    """

    transport_type: ClassVar[Callable[[int, int, Settings], BatchTransport] | None] = None

    def __init__(
        self,
        replica_index: int,
        replica_size: int,
        *,
        wait_timeout_s: float,
        send_timeout_s: float,
        max_inflight: int,
        settings: Settings,
        transport: BatchTransport | None = None,
    ):
        if transport is None:
            if self.transport_type is None:
                raise MisuseError(f"{type(self).__name__} needs a transport (a BatchTransport)")
            transport = self.transport_type(replica_index, replica_size, settings)
        self.transport = transport
        self.settings = settings
        self.replica_index = replica_index
        self.replica_size = replica_size
        self.wait_timeout_s = wait_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_inflight = positive_int(max_inflight, "max_inflight")
        self.count = 0
        """Batches handed to :meth:`send` so far (skipped ones included)."""
        self.skipped = 0
        """Batches :meth:`send` dropped because the resumed checkpoint trained them."""
        self._workers = self._ranks = 0
        self._sent_to_rank: Counter[int] = Counter()
        self._window = SendWindow(max_inflight)
        self._skip: frozenset[int] = frozenset()

    # --- lifecycle ---------------------------------------------------------------------
    def open(self) -> None:
        """Read the resume point (``--resume``) and find the peers."""
        if job_checkpoint.resume_requested(self.settings):
            self._skip = job_checkpoint.resumed_batch_ids(
                self.replica_index, self.replica_size, self.settings
            )
        self._workers, self._ranks = self.transport.open(self.wait_timeout_s)

    def finish(self) -> None:
        """Wait for every send, then tell every NN-worker rank how many batches it got."""
        self._window.drain()
        get_runtime().run(self.transport.done(self._sent_to_rank))
        log.info(
            "data loader %d: sent %d batches (%d skipped on resume); end of stream announced",
            self.replica_index,
            self.count - self.skipped,
            self.skipped,
        )

    def abort(self) -> None:
        """Cancel the sends under way (failing or stopped: no back-pressure retries)."""
        self._window.cancel()

    def close(self) -> None:
        """Release the peers (after :meth:`finish` or :meth:`abort`)."""
        self.transport.close()

    # --- sending -----------------------------------------------------------------------
    def send(self, batch: Any) -> None:
        """Queue one batch (blocking only while ``max_inflight`` sends are under way); an
        error of an earlier send is raised here.

        The caller's batch must not change afterwards (a ``PersiaBatch`` owns copies of its
        arrays): the transport may read it later, on the event-loop thread.
        """
        k = self.count
        self.count += 1
        batch_id = k * self.replica_size + self.replica_index
        if batch_id in self._skip:  # trained before the checkpoint this job resumed from
            self.skipped += 1
            return
        self._window.make_room()
        worker = k % self._workers
        rank = batch_id % self._ranks
        prepared = self.transport.prepare(batch)
        self._sent_to_rank[rank] += 1
        coro = self.transport.deliver(prepared, batch_id, worker, rank, self.send_timeout_s)
        self._window.add(get_runtime().submit(coro))
