"""The data loader's network side: a batch's two halves posted to the services.

:class:`HttpBatchTransport` is the HTTP :class:`~pyrsia.shared.batch_sender.BatchTransport`:
it finds the embedding workers and NN-worker ranks in the Redis registry, posts a batch's id
features to its worker's ``/batch`` and its dense half with the reference to its rank's
``/ingress`` (both answer 429 when their bounded queue is full, and the send backs off and
retries until its deadline), and ends the stream with ``/done`` to every rank.
:class:`BatchSender` is the data loader's sender (``pyrsia.shared.batch_sender``: batch ids,
resume, the bound on sends under way) over it; ``persia.ctx.DataCtx`` is the user-facing
facade over one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from pyrsia.shared import batch_sender
from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.errors import RemoteBadRequestError, ServiceUnavailableError
from pyrsia.shared.registry import Registry, RegistrySettings, ServiceRecord
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.batch import DensePart, IDPart
from pyrsia.shared.wire.ingress import IngressBatch, LoaderDone
from pyrsia.shared.wire.worker import PutBatch

log = logging.getLogger(__name__)


class SplittableBatch(Protocol):
    """What the sender needs of a batch (``persia.embedding.data.PersiaBatch`` is one)."""

    def id_part(self) -> IDPart: ...

    def dense_part(self) -> DensePart: ...


class HttpBatchTransport:
    """A data-loader replica's batches over HTTP to the peers the registry lists."""

    def __init__(self, replica_index: int, replica_size: int, settings: Settings):
        """``settings``: the process's, from the ``DataCtx`` that sends (the registry, the
        token)."""
        self.settings = settings
        self.replica_index = replica_index
        self.replica_size = replica_size
        self.workers: list[ServiceRecord] = []
        self.ranks: list[ServiceRecord] = []
        self._registry: Registry | None = None

    def open(self, wait_timeout_s: float) -> tuple[int, int]:
        """Wait up to ``wait_timeout_s`` for every embedding worker and NN-worker rank."""
        self._registry = Registry(RegistrySettings.from_env(self.settings))
        try:
            runtime = get_runtime(self.settings)
            self.workers, self.ranks = runtime.run(self._discover(wait_timeout_s))
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
        return len(self.workers), len(self.ranks)

    async def _discover(self, timeout_s: float) -> tuple[list[ServiceRecord], list[ServiceRecord]]:
        assert self._registry is not None
        # every replica (their replica_size): batches are dealt among those found here
        workers = await self._registry.wait_for(ROLE_EMBEDDING_WORKER, timeout_s=timeout_s)
        ranks = await self._registry.wait_for(ROLE_NN_WORKER, timeout_s=timeout_s)
        return workers, ranks

    def prepare(self, batch: SplittableBatch) -> SplittableBatch:
        """Nothing here: the batch is split into its halves on the event-loop thread."""
        return batch

    async def deliver(
        self, batch: SplittableBatch, batch_id: int, worker: int, rank: int, timeout_s: float
    ) -> None:
        """POST the id half to the worker's ``/batch``, then the dense half to ``/ingress``."""
        client = get_runtime().client
        until = time.monotonic() + timeout_s
        loader = self.replica_index
        peer, to = self.workers[worker], self.ranks[rank]
        try:
            await client.call(
                f"{peer.url}/batch",
                PutBatch(loader, batch_id, batch.id_part()).to_wire(),
                until=until,
                idempotent=True,
            )
        except RemoteBadRequestError as exc:
            raise _refused(exc, batch_id, peer) from exc
        dense = IngressBatch(loader, batch_id, peer.replica_index, batch.dense_part())
        try:
            await client.call(f"{to.url}/ingress", dense.to_wire(), until=until, idempotent=True)
        except RemoteBadRequestError as exc:
            raise _refused(exc, batch_id, to) from exc
        except ServiceUnavailableError as exc:
            raise ServiceUnavailableError(
                f"nn_worker/{to.replica_index} did not take batch {batch_id} ({exc}); if it "
                "stopped, its own lines say why"
            ) from exc

    async def done(self, sent_to_rank: Mapping[int, int]) -> None:
        """POST ``/done`` with this loader's count to every rank."""
        client = get_runtime().client
        await asyncio.gather(
            *(
                client.call(
                    f"{rank.url}/done",
                    LoaderDone(
                        self.replica_index, self.replica_size, sent_to_rank.get(i, 0)
                    ).to_wire(),
                    idempotent=True,
                )
                for i, rank in enumerate(self.ranks)
            )
        )

    def close(self) -> None:
        """Close the registry connection."""
        registry, self._registry = self._registry, None
        if registry is not None:
            get_runtime().run(registry.close())


class BatchSender(batch_sender.BatchSender):
    """The data loader's sender over HTTP (``open`` waits up to ``wait_timeout_s`` for at
    least one embedding worker and for every NN-worker rank, naming what is missing)."""

    transport: HttpBatchTransport
    transport_type = HttpBatchTransport


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
