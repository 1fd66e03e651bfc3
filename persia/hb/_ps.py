"""The process's connection to the embedding workers for ``hb.scope(sharding=True)`` tables.

Opened on the first lookup of a sharded module (never at import or construction):
the registry session (``PERSIA_REDIS_URL`` / ``PERSIA_JOB_ID``), the workers'
readiness, the embedding hyperparameters (``options.embedding_config`` or the
defaults), the embedding optimizer, and the workers' embedding schema (to check
each module against its slot). Gradients go back through the runtime's
:class:`~pyrsia.services.nn_worker.backward.BackwardEngine` with at most
``options.emb_staleness`` sends in flight (0: every send is awaited), divided by the
world size when ``options.emb_grad_reduction`` is ``mean`` (the default, as HybridBackend
averages sharded gradients over the ranks) or applied as sent with ``sum`` (PERSIA's rule).

The embedding optimizer is ``options.embedding_optimizer`` when set, else the
translation of the dense optimizer built with ``hb.wraps`` (torch SGD and Adam have
exact counterparts on the PS); without either, the first training lookup fails with
a message saying what to set.
"""

from __future__ import annotations

import atexit
import logging
import threading
from dataclasses import dataclass

import numpy as np

from persia._session_open import open_session
from persia.embedding import get_default_embedding_config
from persia.embedding.optim import Optimizer as EmbeddingOptimizer
from persia.hb._context import context
from pyrsia.services.nn_worker.backward import BackwardEngine
from pyrsia.services.nn_worker.inflight import InflightLimits
from pyrsia.services.nn_worker.session import Session
from pyrsia.shared.config_schema import EmbeddingSchema, SlotConfig
from pyrsia.shared.constants import HB_GRADIENT_SENDERS as GRADIENT_SENDERS
from pyrsia.shared.errors import ConfigError, MisuseError
from pyrsia.shared.wire.batch import IDPart

log = logging.getLogger(__name__)


@dataclass
class Lookup:
    """One module call's answer: pooled rows and the reference its gradient goes back to."""

    rows: np.ndarray
    worker: int
    batch_id: int | None


class PSConnection:
    """Lazily opened session + gradient engine shared by every sharded module of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._engine: BackwardEngine | None = None
        self._schema: EmbeddingSchema | None = None
        self._suggested: EmbeddingOptimizer | None = None
        self.optimizer: EmbeddingOptimizer | None = None
        self._exit_hook = False

    def suggest_optimizer(self, optimizer: EmbeddingOptimizer | None) -> None:
        """The embedding optimizer derived from an ``hb.wraps`` dense optimizer (or None)."""
        self._suggested = optimizer

    def _choose_optimizer(self) -> EmbeddingOptimizer:
        chosen = context.options.embedding_optimizer or self._suggested
        if chosen is None:
            raise ConfigError(
                "hb.scope(sharding=True): no embedding optimizer for the PS. Set "
                "hb.context.options.embedding_optimizer = persia.embedding.optim.SGD(lr=...) "
                "(or Adam / Adagrad), or build the dense optimizer with "
                "hb.wraps(torch.optim.SGD or torch.optim.Adam)(...) to use the same one"
            )
        return chosen

    def open(self) -> Session:
        """The connected session (opened, configured and checked on first call)."""
        with self._lock:
            if self._session is not None:
                return self._session
            optimizer = self._choose_optimizer()
            session = open_session(context.settings)
            try:
                client, run = session.client, session.runtime.run
                run(client.wait_ready())
                config = context.options.embedding_config or get_default_embedding_config()
                run(client.configure(config.to_dict()))
                run(client.register_optimizer(optimizer.to_dict()))
                self._schema = run(client.schema()).schema
            except BaseException:
                session.close()
                raise
            staleness = context.options.emb_staleness
            self._engine = BackwardEngine(
                session.runtime,
                client,
                InflightLimits(
                    backward_buffer=max(1, staleness), backward_workers=GRADIENT_SENDERS
                ),
            )
            if not self._exit_hook:  # after the runtime's own hook, so it runs before it
                atexit.register(self.close)
                self._exit_hook = True
            self._session, self.optimizer = session, optimizer
            log.info("sharded embeddings: connected to %s", client.urls)
            return session

    def slot(self, name: str) -> SlotConfig:
        """The workers' config of slot ``name`` (a ConfigError with a suggestion when unknown)."""
        self.open()
        assert self._schema is not None
        return self._schema.slot(name)

    def schema(self) -> EmbeddingSchema:
        """The embedding schema the workers serve (their embedding_config.yml)."""
        self.open()
        assert self._schema is not None
        return self._schema

    def lookup(
        self, id_part: IDPart, train: bool
    ) -> tuple[tuple[tuple[str, np.ndarray], ...], int, int | None]:
        """``/lookup_direct`` of one module call: (embeddings, worker, gradient reference)."""
        session = self.open()
        answer, worker = session.runtime.run(session.client.lookup_direct(id_part, train))
        return answer.embeddings, worker, answer.batch_id

    def send_gradients(self, worker: int, batch_id: int, slot: str, grad: np.ndarray) -> None:
        """Queue one call's pooled gradient (bounded by ``emb_staleness``; 0 waits for it)."""
        engine = self._engine
        if engine is None:
            raise MisuseError("sharded embeddings: gradients before any lookup")
        # The worker divides the gradient by this scale: the world size averages the ranks'
        # gradients as HybridBackend does (GradientAggregation._reduce); 1 sums them (PERSIA).
        mean = context.options.emb_grad_reduction == "mean"
        scale = float(context.world_size) if mean else 1.0
        engine.submit(worker, batch_id, scale, [(slot, grad)])
        if context.options.emb_staleness == 0:
            engine.flush()

    def flush(self) -> None:
        """Wait until every gradient sent so far is applied on the PS; raise send errors."""
        if self._engine is not None:
            self._engine.flush()

    def dump(self, directory: str) -> None:
        """Every PS replica writes its shard of the embeddings to ``directory``."""
        session = self.open()
        self.flush()
        session.runtime.run(session.client.dump(directory))

    def load(self, directory: str) -> None:
        """Every PS replica loads the ids routed to it from the checkpoint in ``directory``."""
        session = self.open()
        self.flush()
        session.runtime.run(session.client.load(directory))

    @property
    def connected(self) -> bool:
        return self._session is not None

    def close(self) -> None:
        """Flush gradients (errors logged) and close the session; the next lookup reopens."""
        with self._lock:
            engine, session = self._engine, self._session
            self._engine, self._session, self._schema = None, None, None
        try:
            if engine is not None:
                engine.flush(raise_errors=False)
        finally:
            if session is not None:
                session.close()


connection = PSConnection()
