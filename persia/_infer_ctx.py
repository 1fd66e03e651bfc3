"""``InferCtx``: inference against fixed embedding-worker addresses (PERSIA's API).

Defined beside ``persia.ctx`` (which exports it), as ``TrainCtx`` is, to keep each
context module small.
"""

from __future__ import annotations

from persia._base_ctx import PreprocessMode
from persia._embedding_ctx import EmbeddingCtx
from persia._session_open import open_session
from pyrsia.services.nn_worker.embedding_client import normalize_address
from pyrsia.services.nn_worker.session import Session
from pyrsia.shared.errors import InvalidInputError


class InferCtx(EmbeddingCtx):
    """Inference against fixed embedding-worker addresses (``"host:port"``); no registry.

    Usable without ``with``, as PERSIA's TorchServe handler does::

        ctx = InferCtx(get_embedding_worker_services())      # no network work yet
        ctx.wait_for_serving()                               # connects, waits for the workers
        batch = ctx.get_embedding_from_bytes(persia_batch_bytes)
        non_id, embeddings, _ = ctx.prepare_features(batch)
    """

    def __init__(self, embedding_worker_address_list: list[str], *args, **kwargs):
        super().__init__(PreprocessMode.INFERENCE, *args, **kwargs)
        if isinstance(embedding_worker_address_list, str) or not embedding_worker_address_list:
            raise InvalidInputError(
                "embedding_worker_address_list",
                "a non-empty list of 'host:port'",
                embedding_worker_address_list,
            )
        self.embedding_worker_address_list = [
            normalize_address(a) for a in embedding_worker_address_list
        ]

    def _open_session(self) -> Session:
        return open_session(self.settings, addresses=self.embedding_worker_address_list)

    def wait_for_serving(self, timeout_s: float | None = None) -> None:
        """Wait until every embedding worker reports ready (and so its PS replicas)."""
        self._run(self.session.client.wait_ready(timeout_s))
