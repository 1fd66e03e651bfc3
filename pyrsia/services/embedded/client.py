"""The embedding client of embedded mode: the NN worker's client over the in-process transport.

:class:`EmbeddedClient` is the NN worker's
:class:`~pyrsia.services.nn_worker.embedding_client.EmbeddingClient` (the code services mode
runs over HTTP) over :class:`~pyrsia.services.embedded.transport.InProcessTransport`, which
builds the embedding worker and PS engines from the job's configuration and answers every
embedding route with them.
"""

from __future__ import annotations

from pyrsia.services.embedded.local_ps import LocalPS
from pyrsia.services.embedded.transport import InProcessTransport
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.shared.config import EmbeddingSchema, GlobalConfig


class EmbeddedClient(EmbeddingClient):
    """The embedding client of an embedded job: the engines of this process behind it."""

    transport: InProcessTransport

    def __init__(self, schema: EmbeddingSchema, config: GlobalConfig, **engine_options: int):
        """``engine_options``: the transport's ``inline_max_ids`` and ``threads``."""
        super().__init__(InProcessTransport(schema, config, **engine_options))

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
