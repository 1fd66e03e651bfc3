"""The one mechanism that bounds the work in flight between the training loop and the servers.

A trained batch passes these bounded stages; every bound is made here, from the arguments of
``persia.data.DataLoader`` (per iteration, :class:`LookupLimits`) and of ``TrainCtx`` (per
context, :class:`InflightLimits`), plus the embedding worker's gradient buffer
(``pyrsia.shared.constants.GRADIENT_BUFFER_FACTOR``). Nothing else bounds this pipeline::

    lookahead ─► lookup ──► forward buffer ──► training step ──► TrainCtx.backward ──► /gradients ──► PS applied
    |◄────── staleness permit (DataLoader embedding_staleness) ─────────────────────────────────────────────►|
    |◄ lookahead (just in time) ─────────────►|  (taken by the loop)
               |◄ lookup worker ►|
                         |◄ forward buffer ►|
                                                        |◄────── backward slot (backward_buffer_size) ─────►|
                                                                             |◄── sender (backward_workers_size) ─►|
    embedding worker: from /lookup to /gradients the batch waits in the gradient buffer
    (forward_buffer_size x GRADIENT_BUFFER_FACTOR batches; beyond it the oldest is dropped)

Per DataLoader iteration (:class:`LookupLimits`, on the event loop):

* lookahead (training only, :class:`Lookahead`): lookups start *just in time*, only as many
  batches ahead of the loop as the measured lookup latency needs to be hidden behind the
  measured step time (usually 1 or 2), and never more than ``min(num_workers,
  forward_buffer_size + 1, embedding_staleness)``. Counted from the lookup's start until
  the loop takes the batch. With a staleness bound it also keeps the *window* (batches
  whose embeddings are out and whose gradients are not applied yet) at what the measured
  lookup and gradient latencies need (2 when they are short), below the bound. Embeddings
  read earlier miss the updates of every batch trained meanwhile (issue 10: reading 8
  ahead cost 0.005 test AUC on Census-Income; a window of 8 instead of 2 cost 0.0065 on
  the Criteo-shaped set). The window is the job's: a rank's lookups miss the updates of
  the batches *every* rank has out, so each of N ranks keeps ``ceil(window / N)`` of them
  (at least 1).
* staleness permit (training only): the prefetcher takes one before a lookup; it comes back
  when the batch's gradients were applied, or when the loop moves past the batch without
  backward. It bounds how many batches read embeddings that miss each other's updates.
* lookup worker (``num_workers``): held while a lookup's request is out.
* forward buffer (``forward_buffer_size``): batches looked up (or being looked up) and not
  yet taken by the loop; a slot is held from the lookup's start until the loop takes it.

Per TrainCtx (:class:`InflightLimits`):

* backward slot: ``TrainCtx.backward`` takes one (the training thread blocks while none is
  free) and the send gives it back when it finished, successfully or not. It bounds the
  gradient copies held in memory.
* sender: held on the event loop around each ``/gradients`` request. It bounds the requests
  on the wire at once.

And on the embedding worker, the gradient buffer: it bounds what a worker keeps for batches
whose gradients have not come back (a batch dropped from it answers 404 to its late
gradients).

Each permit or slot is given back exactly once, on success, failure or cancellation.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from pyrsia.shared.constants import RUNTIME_CLOSED_POLL_S
from pyrsia.shared.errors import RuntimeClosedError
from pyrsia.shared.validate import positive_int


class InflightLimits:
    """Backward slots and senders of one training process; the factory of lookup limits."""

    def __init__(self, *, backward_buffer: int = 10, backward_workers: int = 8):
        self.backward_buffer = positive_int(backward_buffer, "backward_buffer_size")
        self.backward_workers = positive_int(backward_workers, "backward_workers_size")
        self._slots = threading.BoundedSemaphore(self.backward_buffer)
        self._senders: asyncio.Semaphore | None = None

    # --- lookups (event loop; one set per DataLoader iteration) -------------------------
    @staticmethod
    def for_lookups(
        *,
        num_workers: int,
        buffer_size: int,
        staleness: int | None,
        just_in_time: bool,
        ranks: int = 1,
    ) -> LookupLimits:
        """The limits of one DataLoader iteration's lookups (call it on the event loop);
        ``ranks``: the job's NN-worker ranks, which share the staleness window."""
        return LookupLimits(
            num_workers=num_workers,
            buffer_size=buffer_size,
            staleness=staleness,
            just_in_time=just_in_time,
            ranks=ranks,
        )

    # --- backward slots (training thread) ---------------------------------------------
    def take_slot(
        self, running: Callable[[], bool], waiting: Callable[[], AbstractContextManager[None]]
    ) -> None:
        """Block until a backward slot is free; RuntimeClosedError once ``running()`` is False.
        ``waiting``: the runtime's ``waiting_on_loop`` (the sends that free a slot run there)."""
        if self._slots.acquire(blocking=False):
            return
        with waiting():
            while not self._slots.acquire(timeout=RUNTIME_CLOSED_POLL_S):
                if not running():
                    raise RuntimeClosedError("the NN-worker runtime has been stopped")

    def give_slot(self) -> None:
        """Give a backward slot back (the send finished, or never started)."""
        self._slots.release()

    # --- senders (event loop) ---------------------------------------------------------
    def senders(self) -> asyncio.Semaphore:
        """The semaphore each ``/gradients`` request holds while on the wire (made on the loop)."""
        if self._senders is None:
            self._senders = asyncio.Semaphore(self.backward_workers)
        return self._senders


class Lookahead:
    """How far ahead of the training loop lookups run: just enough to hide their latency.

    Two measured bounds (moving averages; before the first measurements, the caps):

    * ``target``, lookups started and not yet taken by the loop:
      ``1 + ceil(LATENCY_MARGIN * lookup latency / step interval)``, in ``[1, cap]``;
    * ``window``, with a staleness bound (``window_cap``): batches whose embeddings are out
      and whose gradients are not yet applied (looked up, training, or gradients in flight),
      by Little's law ``ceil(WINDOW_MARGIN * (lookup latency + hold) / step interval)`` in
      ``[2, window_cap]``, where ``hold`` is the time from the loop taking a batch to its
      gradients being applied. This is the staleness the embeddings actually see: only as
      much as the throughput needs (2 when lookups and gradient sends are fast). When the
      embedding side is the bottleneck the averages include the queue the window makes,
      and the window grows to the bound; the bound is then the user's knob (README, "End
      to end on 2 cores": a window sized by the least recent latencies instead held the
      bound off but lost more samples/s than a lower bound did).

    With ``ranks`` > 1 the window is the job's, shared: each rank keeps ``ceil(window /
    ranks)`` (at least 1). A rank's lookups miss the updates of the batches every rank has
    out, so counted per rank the staleness grows with the ranks: on the Criteo-shaped set 2
    ranks of whole batches, each keeping the whole window, lose 0.0031-0.0106 test AUC
    against one process; sharing it, 0.0001-0.0023 (``benchmarks/rank_quality.py``).

    Lives on the runtime loop.
    """

    LATENCY_MARGIN = 2.0
    """Headroom over the mean latency, so a lookup slower than usual is still hidden."""
    WINDOW_MARGIN = 1.25
    """Headroom of the window over what the mean latencies need."""
    SMOOTHING = 0.2

    def __init__(self, cap: int, window_cap: int | None = None, ranks: int = 1):
        self.cap = max(1, cap)
        self.window_cap = None if window_cap is None else max(2, window_cap)
        self.ranks = positive_int(ranks, "ranks")
        """The job's NN-worker ranks, which share the window."""
        self.ahead = 0
        self.out = 0
        """Batches admitted and not yet returned (counted only with a ``window_cap``)."""
        self._latency: float | None = None
        self._interval: float | None = None
        self._hold: float | None = None
        self._last_take: float | None = None
        self._changed = asyncio.Event()

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.SMOOTHING * (new - old)

    @property
    def target(self) -> int:
        if self._latency is None or not self._interval:
            return self.cap
        want = 1 + math.ceil(self.LATENCY_MARGIN * self._latency / self._interval)
        return max(1, min(self.cap, want))

    @property
    def window(self) -> int | None:
        if self.window_cap is None:
            return None
        if self._latency is None or not self._interval or self._hold is None:
            job = self.window_cap
        else:
            want = math.ceil(self.WINDOW_MARGIN * (self._latency + self._hold) / self._interval)
            job = max(2, min(self.window_cap, want))
        return max(1, math.ceil(job / self.ranks))  # this rank's share of the job's window

    def _full(self) -> bool:
        window = self.window
        return self.ahead >= self.target or (window is not None and self.out >= window)

    async def wait_for_room(self) -> None:
        """Return once below ``target`` (and ``window``); then count one more lookup."""
        while self._full():
            self._changed.clear()
            await self._changed.wait()
        self.ahead += 1
        if self.window_cap is not None:
            self.out += 1

    def looked_up(self, seconds: float) -> None:
        self._latency = self._average(self._latency, seconds)

    def taken(self) -> None:
        """The loop took a looked-up batch: one fewer ahead; measure the step interval."""
        now = time.monotonic()
        if self._last_take is not None:
            self._interval = self._average(self._interval, now - self._last_take)
        self._last_take = now
        self.ahead = max(0, self.ahead - 1)
        self._changed.set()

    def gave_up(self) -> None:
        """A counted lookup will never be taken (it failed or the stream ended)."""
        self.ahead = max(0, self.ahead - 1)
        self._changed.set()

    def returned(self, hold: float | None) -> None:
        """A batch's staleness permit came back, ``hold`` seconds after the loop took it
        (None: it was never taken)."""
        if self.window_cap is not None:
            self.out = max(0, self.out - 1)
        if hold is not None:
            self._hold = self._average(self._hold, hold)
        self._changed.set()


class Permit:
    """One batch's staleness permit. Calling it (once, from any thread) gives it back."""

    __slots__ = ("_limits", "taken_at", "held_s")

    def __init__(self, limits: LookupLimits):
        self._limits = limits
        self.taken_at: float | None = None
        """When the loop took the batch (loop clock), for the lookahead's hold time."""
        self.held_s = 0.0
        """Seconds the training thread kept the batch's gradients on purpose (``BackwardEngine.
        hold``): not a latency the window must cover, so not counted in the hold time (counted,
        it widened Criteo's window from 2 to 3 and cost 0.002 test AUC)."""

    def __call__(self) -> None:
        self._limits._loop.call_soon_threadsafe(self._limits._returned, self)


class LookupLimits:
    """Lookahead, staleness permits, lookup workers and forward buffer of one DataLoader
    iteration (see the module docstring). Made and used on the event loop; only the
    staleness permit's releaser may be called from another thread."""

    def __init__(
        self,
        *,
        num_workers: int,
        buffer_size: int,
        staleness: int | None,
        just_in_time: bool,
        ranks: int = 1,
    ):
        self.num_workers = positive_int(num_workers, "num_workers")
        self.buffer_size = positive_int(buffer_size, "forward_buffer_size")
        self.ranks = positive_int(ranks, "ranks")
        self.staleness = None if not staleness else positive_int(staleness, "embedding_staleness")
        self._loop = asyncio.get_running_loop()
        self._workers = asyncio.Semaphore(self.num_workers)
        self._buffer = asyncio.Semaphore(self.buffer_size)
        self._permits = asyncio.Semaphore(self.staleness) if self.staleness else None
        cap = min(self.num_workers, self.buffer_size + 1, self.staleness or self.num_workers)
        self.lookahead: Lookahead | None = (
            Lookahead(cap, window_cap=self.staleness, ranks=self.ranks) if just_in_time else None
        )

    # --- one lookup's life ------------------------------------------------------------
    async def admit(self) -> None:
        """Wait for lookahead room, then for a staleness permit (before fetching an item)."""
        if self.lookahead is not None:
            await self.lookahead.wait_for_room()
        if self._permits is not None:
            await self._permits.acquire()

    def unadmit(self) -> None:
        """Give back what :meth:`admit` took (there was no item to look up)."""
        if self._permits is not None:
            self._permits.release()
        if self.lookahead is not None:
            self.lookahead.gave_up()
            self.lookahead.returned(None)

    def permit_releaser(self) -> Permit | None:
        """The admitted batch's staleness permit: a thread-safe function giving it back (call
        it once: after the gradients were applied, or when the batch is dropped); None when
        there is no staleness bound."""
        return Permit(self) if self._permits is not None else None

    def _returned(self, permit: Permit) -> None:
        assert self._permits is not None
        self._permits.release()
        if self.lookahead is not None:
            taken = permit.taken_at
            hold = None if taken is None else time.monotonic() - taken - permit.held_s
            self.lookahead.returned(hold)

    async def take_buffer_slot(self) -> None:
        """A place in the forward buffer, held until the loop takes the batch (or its error)."""
        await self._buffer.acquire()

    async def take_worker(self) -> None:
        await self._workers.acquire()

    def give_worker(self) -> None:
        self._workers.release()

    def looked_up(self, seconds: float) -> None:
        """A lookup answered after ``seconds`` (feeds the lookahead's latency average)."""
        if self.lookahead is not None:
            self.lookahead.looked_up(seconds)

    def taken(self, permit: Callable[[], None] | None = None) -> None:
        """The loop took a looked-up batch (holding ``permit``) out of the forward buffer."""
        self._buffer.release()
        if isinstance(permit, Permit):
            permit.taken_at = time.monotonic()
        if self.lookahead is not None:
            self.lookahead.taken()

    def dropped(self) -> None:
        """The loop took the error of a failed lookup out of the forward buffer."""
        self._buffer.release()

    def gave_up(self) -> None:
        """An admitted lookup failed: it will never be taken."""
        if self.lookahead is not None:
            self.lookahead.gave_up()
