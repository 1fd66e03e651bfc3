"""The embedding client of embedded mode: the NN worker's client over the in-process transport.

:class:`EmbeddedClient` is the NN worker's
:class:`~pyrsia.services.nn_worker.embedding_client.EmbeddingClient` (the code services mode
runs over HTTP) over :class:`~pyrsia.services.embedded.transport.InProcessTransport`, which
builds the embedding worker and PS engines from the job's configuration and answers every
embedding route with them. A plain batch's lookup and gradients skip the route objects and
take the engines' fast path (``fast_path.py``: one store call and one compiled kernel each);
everything else, and every error, is the general path's.
"""

from __future__ import annotations

from pyrsia.services.embedded.fast_kernels import warm_fast_kernels
from pyrsia.services.embedded.fast_path import FastPath
from pyrsia.services.embedded.local_ps import LocalPS
from pyrsia.services.embedded.transport import InProcessTransport
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.shared.config import EmbeddingSchema, GlobalConfig
from pyrsia.shared.wire.worker import Embeddings, Gradients, GradientsApplied


class EmbeddedClient(EmbeddingClient):
    """The embedding client of an embedded job: the engines of this process behind it."""

    transport: InProcessTransport

    def __init__(
        self,
        schema: EmbeddingSchema,
        config: GlobalConfig,
        *,
        fast_path: bool = True,
        **engine_options: int,
    ):
        """``engine_options``: the transport's ``inline_max_ids`` and ``threads``;
        ``fast_path=False`` sends every call down the general path (benchmarks, tests)."""
        super().__init__(InProcessTransport(schema, config, **engine_options))
        transport = self.transport
        self.fast = FastPath(transport.worker, transport.store, transport.ps, enabled=fast_path)
        self._fast_warmed = False

    async def lookup(
        self,
        worker: int,
        batch_id: int,
        train: bool,
        batch_size: int,
        *,
        gathered: bool = False,
        carry: bool = False,
    ) -> tuple[Embeddings, bool]:
        """As the general client's; a plain batch's gathered lookup takes the fast path
        (``carry`` changes nothing in process: the in-process transport carries no gradients)."""
        if gathered and worker == 0:
            answer = self.fast.lookup(batch_id, train)
            if answer is not None:
                return answer, bool(train and answer.requires_grad)
        return await super().lookup(
            worker, batch_id, train, batch_size, gathered=gathered, carry=carry
        )

    async def send_gradients(self, worker: int, request: Gradients) -> GradientsApplied:
        """As the general client's; one table's gradients of a plain batch take the fast path."""
        if worker == 0:
            applied = self.fast.gradients(request)
            if applied is not None:
                return applied
        return await super().send_gradients(worker, request)

    async def register_optimizer(self, optimizer: dict) -> object:
        """As the general client's; the fast path's kernels are loaded too, before the first
        batch (the transport loads the engines' own)."""
        answer = await super().register_optimizer(optimizer)
        if not self._fast_warmed:
            await self.transport.offload.run(None, warm_fast_kernels)
            self._fast_warmed = True
        return answer

    @property
    def worker(self) -> Worker:
        """The in-process embedding worker (the data loader's sender buffers batches in it)."""
        return self.transport.worker

    @property
    def store(self) -> EmbeddingStore:
        """The in-process PS replica's store."""
        return self.transport.store

    @property
    def ps(self) -> LocalPS:
        return self.transport.ps
