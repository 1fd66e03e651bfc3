"""Embedding prefetch for ``persia.data.DataLoader`` (data-flow step 3).

A producer task on the runtime loop pulls the next batch from its source
(:mod:`pyrsia.services.nn_worker.lookups`: this rank's ingress queue, or a user iterator
read by one helper thread), looks its embeddings up through that source
with at most ``num_workers`` lookups in flight, and queues the lookups *in source order*
(at most ``forward_buffer_size`` ahead of the training loop). In training, lookups start
just in time (the lookahead) and each takes an embedding-staleness permit (when
``embedding_staleness`` is set); the permit comes back when the batch's gradients have
been applied (``TrainCtx.backward``) or when the loop moves past the batch without calling
backward. Every one of these bounds is a :class:`~pyrsia.services.nn_worker.inflight.LookupLimits`
(``pyrsia/services/nn_worker/inflight.py`` documents them together).

An error in the producer or a lookup is raised in the training loop at the batch it
concerns; closing the prefetcher cancels and awaits everything it started.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.inflight import InflightLimits, LookupLimits
from pyrsia.shared.constants import RUNTIME_CLOSED_POLL_S
from pyrsia.shared.errors import RuntimeClosedError
from pyrsia.shared.runtime import Runtime
from pyrsia.shared.validate import positive_int

log = logging.getLogger(__name__)

_END = object()


class _Failed:
    """An error for the training loop: ``sticky`` ones (the source failed) end the stream;
    a failed lookup is raised once, at its batch."""

    def __init__(self, exc: BaseException, *, sticky: bool):
        self.exc = exc
        self.sticky = sticky


class BatchSource(Protocol):
    """What a Prefetcher reads: the next item (None at the end), its lookup, and close
    (:mod:`pyrsia.services.nn_worker.lookups` has the two the DataLoader uses)."""

    async def next(self) -> Any: ...

    async def lookup(self, item: Any) -> PersiaTrainingBatch: ...

    def close(self, runtime: Runtime) -> None: ...


class Prefetcher:
    """Ordered, bounded, concurrent embedding lookups ahead of the training loop.

    Looked-up batches (with their tensors built, see ``persia.data``) are handed to the
    training thread through a thread-safe queue, so taking a ready batch costs the training
    thread no round trip to the event loop.
    """

    def __init__(
        self,
        runtime: Runtime,
        source: BatchSource,
        *,
        num_workers: int,
        buffer_size: int,
        staleness: int | None,
        just_in_time: bool = False,
        on_wait: Callable[[float], None] | None = None,
        before_wait: Callable[[], None] | None = None,
        ranks: int = 1,
    ):
        """``source``: where batches come from and how each is looked up (``lookups``);
        closed with the Prefetcher. ``on_wait(seconds)``: told, on the training thread, how
        long each :meth:`next` waited for a ready batch (``RankStats.waited``: the rank's
        lookup wait). ``before_wait()``: called on the training thread before :meth:`next`
        waits for a batch that is not ready (``TrainingStep.hand_over``: the batch may wait
        for the staleness permit of the gradients the step holds). ``ranks``: the job's
        NN-worker ranks, which share the staleness window (``inflight.Lookahead``)."""
        self.runtime = runtime
        self.source = source
        self._on_wait = on_wait
        self._before_wait = before_wait
        self._num_workers = num_workers
        self._buffer_size = buffer_size
        self._staleness = staleness
        self._just_in_time = just_in_time
        self._ranks = positive_int(ranks, "ranks")
        self._out: asyncio.Queue | None = None  # lookup tasks in source order (loop side)
        self._ready: queue.SimpleQueue = queue.SimpleQueue()  # handed to the training thread
        self._tasks: list[asyncio.Task] = []  # producer and deliverer
        self._lookups: set[asyncio.Task] = set()
        self._last: PersiaTrainingBatch | None = None
        self._limits: LookupLimits | None = None  # made on the loop by _start

    # --- loop side ----------------------------------------------------------------------
    async def _start(self) -> None:
        self._limits = InflightLimits.for_lookups(
            num_workers=self._num_workers,
            buffer_size=self._buffer_size,
            staleness=self._staleness,
            just_in_time=self._just_in_time,
            ranks=self._ranks,
        )
        self._out = asyncio.Queue()  # bounded by the limits' forward-buffer slots
        self._tasks = [asyncio.create_task(self._produce()), asyncio.create_task(self._deliver())]

    async def _produce(self) -> None:
        limits = self._limits
        assert self._out is not None and limits is not None
        try:
            while True:
                await limits.admit()
                item = await self.source.next()
                if item is None:
                    limits.unadmit()
                    break
                await limits.take_buffer_slot()
                await limits.take_worker()
                task = asyncio.create_task(self._lookup(item, limits.permit_releaser()))
                self._lookups.add(task)
                task.add_done_callback(self._lookups.discard)
                self._out.put_nowait(task)
            self._out.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._out.put_nowait(_Failed(exc, sticky=True))

    async def _lookup(self, item: Any, release: Callable[[], None] | None) -> PersiaTrainingBatch:
        limits = self._limits
        assert limits is not None
        started = time.monotonic()
        try:
            batch = await self.source.lookup(item)
        except BaseException:
            if release is not None:
                release()
            limits.gave_up()
            raise
        finally:
            limits.give_worker()
        limits.looked_up(time.monotonic() - started)
        if release is not None:
            if batch.trainable:
                batch.hold_permit(release)
            else:
                release()
        return batch

    async def _deliver(self) -> None:
        """Hand the lookups' results, in source order, to the training thread."""
        assert self._out is not None
        try:
            while True:
                entry = await self._out.get()
                if entry is _END or isinstance(entry, _Failed):
                    self._ready.put(entry)
                    return
                try:
                    self._ready.put(await entry)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._ready.put(_Failed(exc, sticky=False))
        except asyncio.CancelledError:  # closed, or the runtime stopped: never leave it waiting
            self._ready.put(_Failed(RuntimeClosedError("the DataLoader was closed"), sticky=True))
            raise

    async def _close(self) -> None:
        tasks = [*self._tasks, *self._lookups]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Batches looked up but never handed out give their permits back.
        while self._out is not None and not self._out.empty():
            entry = self._out.get_nowait()
            if (
                isinstance(entry, asyncio.Task)
                and entry.done()
                and not entry.cancelled()
                and entry.exception() is None
            ):
                entry.result().release()

    # --- training-loop side -------------------------------------------------------------
    def start(self) -> Prefetcher:
        self.runtime.run(self._start())
        return self

    def _take(self, timeout_s: float | None) -> Any:
        """The next entry of the hand-over queue (no event-loop round trip when one is ready)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            return self._ready.get_nowait()
        except queue.Empty:
            if self._before_wait is not None:
                self._before_wait()
        with self.runtime.waiting_on_loop():
            while True:
                wait = RUNTIME_CLOSED_POLL_S
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise TimeoutError(f"no batch within {timeout_s:.1f}s")
                try:
                    return self._ready.get(timeout=wait)
                except queue.Empty:
                    if not self.runtime.running:
                        raise RuntimeClosedError("the NN-worker runtime has been stopped") from None

    def next(self, timeout_s: float | None) -> PersiaTrainingBatch | None:
        """The next batch in source order, None at the end; TimeoutError after ``timeout_s``."""
        if self._last is not None:
            self._last.release()  # moved past without backward: give the permit back
            self._last = None
        if self._on_wait is None:
            entry = self._take(timeout_s)
        else:
            started = time.perf_counter()
            entry = self._take(timeout_s)
            self._on_wait(time.perf_counter() - started)
        limits = self._limits
        assert limits is not None
        if entry is _END or (isinstance(entry, _Failed) and entry.sticky):
            self._ready.put(entry)  # the stream stays ended
            if entry is _END:
                return None
            raise entry.exc
        loop = self.runtime.loop
        if isinstance(entry, _Failed):
            loop.call_soon_threadsafe(limits.dropped)
            raise entry.exc
        loop.call_soon_threadsafe(limits.taken, entry.permit)
        self._last = entry
        return entry

    def close(self) -> None:
        try:
            if self._last is not None:
                self._last.release()
                self._last = None
            if self.runtime.running:
                self.runtime.run(self._close())
            while True:  # batches handed over but never taken give their permits back
                try:
                    entry = self._ready.get_nowait()
                except queue.Empty:
                    break
                if isinstance(entry, PersiaTrainingBatch):
                    entry.release()
        finally:
            self.source.close(self.runtime)
