"""``DataCtx``: how a data loader hands its batches to the running job.

The facade of PERSIA's API over a :class:`pyrsia.shared.batch_sender.BatchSender` (over HTTP
``pyrsia.services.data_loader.sender.BatchSender``, in embedded mode ``EmbeddedSender``),
which does the sending side (where each batch goes, back-pressure, the end-of-stream
notice, and ``--resume``'s skipping of batches already trained; its module docstring
describes them). ``DataCtx`` reads this replica's place in the job from ``persia.env``,
checks what the script hands it, and keeps PERSIA's signatures.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from persia.embedding.data import PersiaBatch
from persia.env import get_replica_index, get_replica_size
from pyrsia.services.data_loader.sender import BatchSender as HttpBatchSender
from pyrsia.services.embedded.mode import embedded_requested
from pyrsia.shared.batch_sender import BatchSender
from pyrsia.shared.constants import DATA_SEND_TIMEOUT_S, DEFAULT_WAIT_TIMEOUT_S
from pyrsia.shared.errors import DataCtxError, InvalidTypeError
from pyrsia.shared.failure_report import end_script_on_persia_errors, note_failure
from pyrsia.shared.settings import Settings, current
from pyrsia.shared.validate import positive_int

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
        self._sender: BatchSender | None = None
        self._sent_batches: weakref.WeakSet[PersiaBatch] = weakref.WeakSet()
        self._count = 0
        self.settings: Settings | None = None
        """This process's settings, read when the context is entered (PERSIA's API is an
        entry point) and passed to the sender."""
        self.skipped = 0

    # --- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> DataCtx:
        settings = self.settings = current()
        end_script_on_persia_errors(settings)  # `python data_loader.py`: one line per error
        self.replica_index, self.replica_size = get_replica_index(), get_replica_size()
        sender_type: type[BatchSender] = HttpBatchSender
        if embedded_requested(settings.environ):  # the engines are imported only in embedded mode
            from pyrsia.services.embedded.sender import EmbeddedSender

            sender_type = EmbeddedSender
        sender = sender_type(
            self.replica_index,
            self.replica_size,
            wait_timeout_s=self.wait_timeout_s,
            send_timeout_s=self.send_timeout_s,
            max_inflight=self.max_inflight,
            settings=settings,
        )
        sender.open()
        self._sender = sender
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.settings is not None:  # set by __enter__
            note_failure(exc, self.settings)
        sender, self._sender = self._sender, None
        if sender is None:
            return
        try:
            if exc_type is None:
                sender.finish()
            else:
                sender.abort()  # failing or stopped (SIGTERM): no back-pressure retries
                stopped = exc_type is SystemExit or exc_type is KeyboardInterrupt
                # the error itself is reported once, by whoever ends the process
                (log.info if stopped else log.error)(
                    "data loader stopped (%s); not announcing end of stream", exc_type.__name__
                )
        finally:
            self.skipped = sender.skipped
            sender.close()

    # --- sending -----------------------------------------------------------------------
    def send_data(self, persia_batch: PersiaBatch) -> None:
        """Send one batch (blocking only while ``max_inflight`` sends are under way).

        The send itself runs later, on the runtime's event-loop thread; that is safe with
        a data loader that refills the same numpy buffers for every batch, because a
        ``PersiaBatch`` copies its arrays when it is built: the batch sent is the one the
        caller built, whatever happens to the caller's arrays afterwards.
        """
        sender = self._sender
        if sender is None:
            raise DataCtxError("send_data() called outside `with DataCtx() as ctx:`")
        if not isinstance(persia_batch, PersiaBatch):
            raise InvalidTypeError(
                "persia_batch",
                "a PersiaBatch",
                message=f"send_data expects a PersiaBatch, got {type(persia_batch).__name__}",
            )
        if persia_batch in self._sent_batches:
            raise DataCtxError("this PersiaBatch was already sent; build a new batch for new data")
        self._sent_batches.add(persia_batch)
        self._count += 1
        sender.send(persia_batch)
        self.skipped = sender.skipped

    @property
    def sent(self) -> int:
        """Batches handed to ``send_data`` so far."""
        return self._count

    def __repr__(self) -> str:
        state: Any = "entered" if self._sender is not None else "idle"
        return f"DataCtx(replica {self.replica_index}/{self.replica_size}, {state}, sent={self._count})"
