"""The data loader's network side: where each batch goes, and how its two halves get there.

For batch k of data-loader replica i (of n), the global batch id is k·n + i. Its id
features go to embedding worker k mod W, which buffers them; then its dense part
(non-id features, labels, meta) and the reference go to NN-worker rank
batch_id mod world_size. Both peers answer 429 when their bounded queue is full,
and the sender backs off and retries. Sends run on the process's event-loop thread
(:class:`~pyrsia.shared.runtime.Runtime`), a bounded number at a time, so
building the next batch overlaps sending this one; an error from a send surfaces at the
next :meth:`BatchSender.send` or at :meth:`BatchSender.finish`. On a clean finish every
NN-worker rank is told how many batches this loader sent it, which is what ends the
ranks' ``StreamingDataset``.

With ``--resume`` the sender skips the batches the newest complete job checkpoint lists
as trained (:mod:`pyrsia.shared.job_checkpoint`): the script builds every
batch as before (so batch ids stay the same), and :meth:`BatchSender.send` drops those
already trained, so the resumed job trains every batch of the epoch exactly once.

``persia.ctx.DataCtx`` is the user-facing facade over one :class:`BatchSender`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Protocol

from pyrsia.shared import job_checkpoint
from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.errors import RemoteBadRequestError, ServiceUnavailableError
from pyrsia.shared.registry import Registry, RegistrySettings, ServiceRecord
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.send_window import SendWindow
from pyrsia.shared.validate import positive_int
from pyrsia.shared.wire.batch import DensePart, IDPart
from pyrsia.shared.wire.ingress import IngressBatch, LoaderDone
from pyrsia.shared.wire.worker import PutBatch

log = logging.getLogger(__name__)


class SplittableBatch(Protocol):
    """What the sender needs of a batch (``persia.embedding.data.PersiaBatch`` is one)."""

    def id_part(self) -> IDPart: ...

    def dense_part(self) -> DensePart: ...


class BatchSender:
    """Sends one data-loader replica's batches: open, send, send, ..., finish (or abort).

    ``open`` waits up to ``wait_timeout_s`` for at least one embedding worker and for
    every NN-worker rank, naming what is missing if they do not show up.
    """

    def __init__(
        self,
        replica_index: int,
        replica_size: int,
        *,
        wait_timeout_s: float,
        send_timeout_s: float,
        max_inflight: int,
    ):
        self.replica_index = replica_index
        self.replica_size = replica_size
        self.wait_timeout_s = wait_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_inflight = positive_int(max_inflight, "max_inflight")
        self.workers: list[ServiceRecord] = []
        self.ranks: list[ServiceRecord] = []
        self.count = 0
        """Batches handed to :meth:`send` so far (skipped ones included)."""
        self.skipped = 0
        """Batches :meth:`send` dropped because the resumed checkpoint trained them."""
        self._registry: Registry | None = None
        self._sent_to_rank: Counter[int] = Counter()
        self._window = SendWindow(max_inflight)
        self._skip: frozenset[int] = frozenset()

    # --- lifecycle ---------------------------------------------------------------------
    def open(self) -> None:
        """Read the resume point (``--resume``) and discover the peers."""
        if job_checkpoint.resume_requested():
            self._skip = job_checkpoint.resumed_batch_ids(self.replica_index, self.replica_size)
        runtime = get_runtime()
        self._registry = Registry(RegistrySettings.from_env())
        try:
            self.workers, self.ranks = runtime.run(self._discover())
        except BaseException:
            self.close()
            raise
        log.info(
            "data loader %d/%d: %d embedding worker(s), %d NN-worker rank(s)",
            self.replica_index,
            self.replica_size,
            len(self.workers),
            len(self.ranks),
        )

    def finish(self) -> None:
        """Wait for every send, then tell every NN-worker rank how many batches it got."""
        self._window.drain()
        get_runtime().run(self._announce_done())

    def abort(self) -> None:
        """Cancel the sends under way (failing or stopped: no back-pressure retries)."""
        self._window.cancel()

    def close(self) -> None:
        """Close the registry connection (after :meth:`finish` or :meth:`abort`)."""
        registry, self._registry = self._registry, None
        if registry is not None:
            get_runtime().run(registry.close())

    async def _discover(self) -> tuple[list[ServiceRecord], list[ServiceRecord]]:
        assert self._registry is not None
        # every replica (their replica_size): batches are dealt among those found here
        workers = await self._registry.wait_for(
            ROLE_EMBEDDING_WORKER, timeout_s=self.wait_timeout_s
        )
        ranks = await self._registry.wait_for(ROLE_NN_WORKER, timeout_s=self.wait_timeout_s)
        return workers, ranks

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
                for rank in self.ranks
            )
        )
        log.info(
            "data loader %d: sent %d batches (%d skipped on resume); end of stream announced",
            self.replica_index,
            self.count - self.skipped,
            self.skipped,
        )

    # --- sending -----------------------------------------------------------------------
    def send(self, batch: SplittableBatch) -> None:
        """Queue one batch (blocking only while ``max_inflight`` sends are under way).

        The batch is split into its halves later, on the event-loop thread; the caller's
        batch must not change afterwards (a ``PersiaBatch`` owns copies of its arrays).
        """
        k = self.count
        self.count += 1
        batch_id = k * self.replica_size + self.replica_index
        if batch_id in self._skip:  # trained before the checkpoint this job resumed from
            self.skipped += 1
            return
        self._window.make_room()
        worker = self.workers[k % len(self.workers)]
        rank = self.ranks[batch_id % len(self.ranks)]
        self._sent_to_rank[rank.replica_index] += 1
        coro = self._send(batch, batch_id, worker, rank)
        self._window.add(get_runtime().submit(coro))

    async def _send(
        self, batch: SplittableBatch, batch_id: int, worker: ServiceRecord, rank: ServiceRecord
    ) -> None:
        client = get_runtime().client
        until = time.monotonic() + self.send_timeout_s
        loader = self.replica_index
        try:
            await client.call(
                f"{worker.url}/batch",
                PutBatch(loader, batch_id, batch.id_part()).to_wire(),
                until=until,
                idempotent=True,
            )
        except RemoteBadRequestError as exc:
            raise _refused(exc, batch_id, worker) from exc
        dense = IngressBatch(loader, batch_id, worker.replica_index, batch.dense_part())
        try:
            await client.call(f"{rank.url}/ingress", dense.to_wire(), until=until, idempotent=True)
        except RemoteBadRequestError as exc:
            raise _refused(exc, batch_id, rank) from exc
        except ServiceUnavailableError as exc:
            raise ServiceUnavailableError(
                f"nn_worker/{rank.replica_index} did not take batch {batch_id} ({exc}); if it "
                "stopped, its own lines say why"
            ) from exc


def _refused(
    exc: RemoteBadRequestError, batch_id: int, peer: ServiceRecord
) -> RemoteBadRequestError:
    """A 400 answer, said the way the process that found the mistake says it."""
    what = exc.body.get("message") or str(exc)
    return RemoteBadRequestError(
        f"{peer.role}/{peer.replica_index} refused batch {batch_id}: {what}",
        peer_status=exc.peer_status,
        body=exc.body,
    )
