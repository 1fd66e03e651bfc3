"""Asynchronous return of embedding gradients to the embedding workers (data-flow step 6).

``TrainCtx.backward`` hands each batch's gradients to :class:`BackwardEngine` and goes
on with the next batch without a round trip to the event loop (the send is scheduled
with ``call_soon_threadsafe``). The gradients come as a function the loop calls: turning
the embedding tensors' gradients into arrays, and encoding them, happen off the training
thread. The bounds are the backward slots and senders of
:class:`~pyrsia.services.nn_worker.inflight.InflightLimits`: the caller blocks while
``backward_buffer_size`` batches are unanswered, and at most ``backward_workers_size``
requests are on the wire at once. A send that fails is kept and raised at the next ``submit`` /
``raise_pending`` / ``flush``, so an error is never silently lost; ``flush`` waits
for everything in flight (context exit does it).

A batch may also be *held* (``hold``): kept on the training thread and handed to the loop by
the next ``hand_over``, ``hold``, ``submit`` or ``flush``. ``TrainingStep`` holds each CPU
step's gradients until the next backward starts: autograd releases the GIL for the whole
backward, so the loop's Python work (the payload, the worker's and PS's glue) runs then,
instead of taking the GIL in turns with the dense optimizer's and the forward's Python,
which is what the hand-over at once cost on 2 cores (embedded Census: the dense step
3.2 ms against PyTorch's 1.1, a third of it waiting for the GIL).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.services.nn_worker.features import GradientPayload
from pyrsia.services.nn_worker.inflight import InflightLimits, Permit
from pyrsia.shared.errors import GradientSendError, RuntimeClosedError
from pyrsia.shared.runtime import Runtime
from pyrsia.shared.wire.worker import Gradients

log = logging.getLogger(__name__)


class BackwardEngine:
    """Bounded, concurrent, error-reporting sender of embedding gradients."""

    def __init__(
        self,
        runtime: Runtime,
        client: EmbeddingClient,
        limits: InflightLimits,
    ):
        self.runtime = runtime
        self.client = client
        self.limits = limits
        self._tasks: set[asyncio.Task] = set()
        self._errors: list[BaseException] = []
        self._held: tuple | None = None
        self._held_at = 0.0
        self._held_lock = threading.Lock()
        self.sent = 0
        self.handed_over = 0
        """Batches handed to the loop (by ``submit``, or a held one by ``hand_over``)."""
        self._counts_logged: tuple[int, int] | None = None  # the carry counts last logged

    def submit(
        self,
        worker: int,
        batch_id: int,
        loss_scale: float,
        grads: list[tuple[str, np.ndarray]] | Callable[[], list | GradientPayload],
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """Queue one batch's gradients; blocks while every backward slot is taken.

        ``grads`` is the ``[(slot, float32 array)]`` to send, or a function giving it (or a
        ``GradientPayload``, with a gathered answer's tables) that the loop calls (so the
        arrays are made off the training thread).
        ``on_done`` runs on the loop when the send finished, successfully or not (it
        releases the batch's embedding-staleness permit).
        """
        self.raise_pending()
        self.hand_over()  # a held batch goes first: the sends keep the steps' order
        self._send_soon(worker, batch_id, loss_scale, grads, on_done)

    def hold(
        self,
        worker: int,
        batch_id: int,
        loss_scale: float,
        grads: list[tuple[str, np.ndarray]] | Callable[[], list | GradientPayload],
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """As ``submit``, but the batch waits on this thread for the next ``hand_over`` (or
        ``hold``, ``submit``, ``flush``); at most one batch is held."""
        self.raise_pending()
        self.hand_over()
        with self._held_lock:
            self._held = (worker, batch_id, loss_scale, grads, on_done)
            self._held_at = time.monotonic()

    def hand_over(self) -> None:
        """Give the held batch, if any, to the loop; blocks while every backward slot is
        taken. Call it where the caller is about to wait for the loop's work (a batch, the
        gradients) or to release the GIL for long (autograd)."""
        held, held_at = self._take_held()
        if held is not None:
            on_done = held[-1]
            if isinstance(on_done, Permit):  # the window's hold time leaves the wait here out
                on_done.held_s += time.monotonic() - held_at
            self._send_soon(*held)

    def _take_held(self) -> tuple[tuple | None, float]:
        """The held batch (None when there is none) and when it was held; none is held after."""
        with self._held_lock:
            held, self._held = self._held, None
            return held, self._held_at

    @property
    def holding(self) -> bool:
        """Whether a batch is held on the training thread."""
        return self._held is not None

    def _send_soon(self, worker, batch_id, loss_scale, grads, on_done) -> None:
        loop = self.runtime.loop
        self.limits.take_slot(lambda: self.runtime.running, self.runtime.waiting_on_loop)
        try:
            loop.call_soon_threadsafe(self._start, worker, batch_id, loss_scale, grads, on_done)
        except BaseException:
            self.limits.give_slot()
            raise
        self.handed_over += 1

    def _start(self, worker, batch_id, loss_scale, grads, on_done) -> None:
        """On the loop: start the send task (callbacks run in order, so ``flush`` sees it)."""
        task = asyncio.create_task(self._send(worker, batch_id, loss_scale, grads, on_done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, worker, batch_id, loss_scale, grads, on_done) -> None:
        try:
            payload = grads() if callable(grads) else grads
            if not isinstance(payload, GradientPayload):
                payload = GradientPayload(list(payload))
            request = Gradients(
                batch_id,
                float(loss_scale),
                tuple(payload.slots),
                None if payload.tables is None else tuple(payload.tables),
                tuple(payload.skipped_slots),
            )
            carried = self.client.carry_gradients(worker, request)
            if carried is not None:
                if on_done is not None:  # the lookup that this permit admits applies them first
                    on_done, release = None, on_done
                    release()
                await carried
            else:
                async with self.limits.senders():
                    await self.client.send_gradients(worker, request)
            self.sent += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # kept and re-raised in the training thread
            log.error(
                "sending gradients of batch %d to worker %d failed: %s", batch_id, worker, exc
            )
            self._errors.append(exc)
        finally:
            self.limits.give_slot()
            if on_done is not None:
                on_done()

    def raise_pending(self) -> None:
        """Raise the first failed send since the last call (as GradientSendError)."""
        if self._errors:
            errors, self._errors = self._errors, []
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise GradientSendError(
                f"embedding gradients were not applied: {errors[0]}{more}"
            ) from errors[0]

    async def _wait_all(self) -> None:
        carrier = self.client.carrier
        if carrier is None:
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            return
        carrier.hold = False  # what is kept, and what comes now, goes alone at once
        try:
            carrier.send_alone()
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        finally:
            carrier.hold = True

    def flush(self, *, raise_errors: bool = True, timeout_s: float | None = None) -> None:
        """Wait until every queued send finished (at most ``timeout_s``); then report failures.

        On timeout the sends still running are cancelled and counted as failed (logged).
        """
        if not self.runtime.running and self._take_held()[0] is not None:
            self._errors.append(RuntimeClosedError("the NN-worker runtime stopped first"))
        if self.runtime.running:
            self.hand_over()
            try:
                self.runtime.run(self._wait_all(), timeout_s=timeout_s)
            except TimeoutError:
                log.error(
                    "%d batches of embedding gradients not delivered within %.1fs; dropped",
                    len(self._tasks),
                    timeout_s,
                )
                self._errors.append(TimeoutError("gradient sends cancelled at shutdown"))
        carrier = self.client.carrier
        if carrier is not None and (carrier.carried, carrier.alone) != self._counts_logged:
            self._counts_logged = (carrier.carried, carrier.alone)  # once per change, not per flush
            log.info(
                "embedding gradients so far: %d batches carried on lookups, %d sent alone",
                carrier.carried,
                carrier.alone,
            )
        if raise_errors:
            self.raise_pending()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)
