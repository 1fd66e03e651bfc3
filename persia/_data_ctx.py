"""``DataCtx``: how a data loader hands its batches to the running job.

For batch k of data-loader replica i (of n), the global batch id is k·n + i. Its id
features go to embedding worker k mod W, which buffers them; then its dense part
(non-id features, labels, meta) and the reference go to NN-worker rank
batch_id mod world_size. Both peers answer 429 when their bounded queue is full,
and the loader backs off and retries. Sends run on a background event loop, a
bounded number at a time, so building the next batch overlaps sending this one;
an error from a send surfaces at the next ``send_data`` or at exit. On a clean
exit every NN-worker rank is told how many batches this loader sent it, which is
what ends the ranks' ``StreamingDataset``.

With ``persia-launcher data-loader --resume`` the loader skips the batches the newest
complete job checkpoint lists as trained (:mod:`persia._runtime.checkpointer`): the
script builds every batch as before (so batch ids stay the same, which needs a script
that yields the same batches in the same order), and ``send_data`` drops those already
trained, so the resumed job trains every batch of the epoch exactly once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import weakref
from collections import Counter
from typing import Any

from persia._runtime import job_checkpoint
from persia._runtime.runtime import get_runtime
from persia.embedding.data import PersiaBatch
from persia.env import get_replica_index, get_replica_size
from pyrsia.shared.constants import (
    DATA_SEND_TIMEOUT_S,
    DEFAULT_WAIT_TIMEOUT_S,
    ROLE_EMBEDDING_WORKER,
    ROLE_NN_WORKER,
)
from pyrsia.shared.errors import DataCtxError
from pyrsia.shared.registry import Registry, RegistrySettings, ServiceRecord
from pyrsia.shared.validate import positive_int
from pyrsia.shared.wire.ingress import IngressBatch, LoaderDone
from pyrsia.shared.wire.worker import PutBatch

log = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 4


class DataCtx:
    """Context for ``data_loader.py``: ``with DataCtx() as ctx: ctx.send_data(batch)``.

    No network work happens in ``__init__``. ``__enter__`` waits up to
    ``wait_timeout_s`` for at least one embedding worker and for every NN-worker
    rank, naming what is missing if they do not show up. ``threadpool_worker_size``
    and ``device_id`` are accepted for PERSIA compatibility and have no effect (sends go
    through one event-loop thread; ``max_inflight`` bounds them).
    """

    def __init__(
        self,
        threadpool_worker_size: int = 10,
        device_id: int | None = None,
        *,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
        send_timeout_s: float = DATA_SEND_TIMEOUT_S,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ):
        max_inflight = positive_int(max_inflight, "max_inflight")
        self.wait_timeout_s = wait_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_inflight = max_inflight
        self.replica_index = 0
        self.replica_size = 1
        self._workers: list[ServiceRecord] = []
        self._ranks: list[ServiceRecord] = []
        self._registry: Registry | None = None
        self._entered = False
        self._count = 0
        self._sent_to_rank: Counter[int] = Counter()
        self._inflight: list[concurrent.futures.Future] = []
        self._sent_batches: weakref.WeakSet[PersiaBatch] = weakref.WeakSet()
        self._skip: frozenset[int] = frozenset()
        self.skipped = 0

    # --- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> DataCtx:
        self.replica_index, self.replica_size = get_replica_index(), get_replica_size()
        if job_checkpoint.resume_requested():
            self._skip = self._trained_batches()
        runtime = get_runtime()
        self._registry = Registry(RegistrySettings.from_env())
        try:
            self._workers, self._ranks = runtime.run(self._discover())
        except BaseException:
            runtime.run(self._registry.close())
            self._registry = None
            raise
        self._entered = True
        log.info(
            "data loader %d/%d: %d embedding worker(s), %d NN-worker rank(s)",
            self.replica_index,
            self.replica_size,
            len(self._workers),
            len(self._ranks),
        )
        return self

    def _trained_batches(self) -> frozenset[int]:
        """Batch ids of this replica already trained into the newest complete checkpoint."""
        config = job_checkpoint.checkpointing_config()
        directory = (
            job_checkpoint.latest_complete(config.checkpoint_dir) if config.checkpoint_dir else None
        )
        if directory is None:
            log.warning("--resume: no complete checkpoint found; sending every batch")
            return frozenset()
        ids = job_checkpoint.trained_batch_ids(directory)
        mine = ids[ids % self.replica_size == self.replica_index]
        log.info(
            "--resume from %s: skipping %d batches of this replica already trained",
            directory,
            len(mine),
        )
        return frozenset(int(i) for i in mine)

    async def _discover(self) -> tuple[list[ServiceRecord], list[ServiceRecord]]:
        assert self._registry is not None
        workers = await self._registry.wait_for_any(
            ROLE_EMBEDDING_WORKER, timeout_s=self.wait_timeout_s
        )
        ranks = await self._registry.wait_for(ROLE_NN_WORKER, timeout_s=self.wait_timeout_s)
        return workers, ranks

    def __exit__(self, exc_type, exc, tb) -> None:
        runtime = get_runtime()
        try:
            if exc_type is None:
                self._drain()
                runtime.run(self._announce_done())
            else:
                # failing or stopped (SIGTERM): do not wait out back-pressure retries
                for future in self._inflight:
                    future.cancel()
                self._inflight = []
                stopped = exc_type is SystemExit or exc_type is KeyboardInterrupt
                (log.info if stopped else log.error)(
                    "data loader stopped; not announcing end of stream: %r", exc
                )
        finally:
            self._entered = False
            if self._registry is not None:
                runtime.run(self._registry.close())
                self._registry = None

    async def _announce_done(self) -> None:
        client = get_runtime().client
        await asyncio.gather(
            *(
                client.call(
                    f"{rank.url}/done",
                    LoaderDone(
                        self.replica_index,
                        self.replica_size,
                        self._sent_to_rank[rank.replica_index],
                    ).to_wire(),
                    idempotent=True,
                )
                for rank in self._ranks
            )
        )
        log.info(
            "data loader %d: sent %d batches (%d skipped on resume); end of stream announced",
            self.replica_index,
            self._count - self.skipped,
            self.skipped,
        )

    # --- sending -----------------------------------------------------------------------
    def send_data(self, persia_batch: PersiaBatch) -> None:
        """Send one batch (blocking only while ``max_inflight`` sends are under way).

        The send itself runs later, on the runtime's event-loop thread; that is safe with
        a data loader that refills the same numpy buffers for every batch, because a
        ``PersiaBatch`` copies its arrays when it is built: the batch sent is the one the
        caller built, whatever happens to the caller's arrays afterwards.
        """
        if not self._entered:
            raise DataCtxError("send_data() called outside `with DataCtx() as ctx:`")
        if not isinstance(persia_batch, PersiaBatch):
            raise TypeError(f"send_data expects a PersiaBatch, got {type(persia_batch).__name__}")
        if persia_batch in self._sent_batches:
            raise DataCtxError("this PersiaBatch was already sent; build a new batch for new data")
        self._sent_batches.add(persia_batch)
        k = self._count
        self._count += 1
        batch_id = k * self.replica_size + self.replica_index
        if batch_id in self._skip:  # trained before the checkpoint this job resumed from
            self.skipped += 1
            return
        self._reap(block=len(self._inflight) >= self.max_inflight)
        worker = self._workers[k % len(self._workers)]
        rank = self._ranks[batch_id % len(self._ranks)]
        self._sent_to_rank[rank.replica_index] += 1
        coro = self._send(persia_batch, batch_id, worker, rank)
        self._inflight.append(get_runtime().submit(coro))

    async def _send(
        self, batch: PersiaBatch, batch_id: int, worker: ServiceRecord, rank: ServiceRecord
    ) -> None:
        client = get_runtime().client
        until = time.monotonic() + self.send_timeout_s
        loader = self.replica_index
        await client.call(
            f"{worker.url}/batch",
            PutBatch(loader, batch_id, batch.id_part()).to_wire(),
            until=until,
            idempotent=True,
        )
        dense = IngressBatch(loader, batch_id, worker.replica_index, batch.dense_part())
        await client.call(f"{rank.url}/ingress", dense.to_wire(), until=until, idempotent=True)

    def _reap(self, *, block: bool) -> None:
        """Collect finished sends (waiting for one when ``block``); re-raise the first error."""
        if block and self._inflight:
            concurrent.futures.wait(self._inflight, return_when=concurrent.futures.FIRST_COMPLETED)
        still = []
        for future in self._inflight:
            if future.done():
                future.result()
            else:
                still.append(future)
        self._inflight = still

    def _drain(self) -> None:
        while self._inflight:
            self._reap(block=True)

    @property
    def sent(self) -> int:
        """Batches handed to ``send_data`` so far."""
        return self._count

    def __repr__(self) -> str:
        state: Any = "entered" if self._entered else "idle"
        return f"DataCtx(replica {self.replica_index}/{self.replica_size}, {state}, sent={self._count})"
