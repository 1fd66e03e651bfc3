"""Run a service's numeric work inline when it is small, in its thread pool when it is not.

The compiled kernels release the GIL, so a large batch runs in a thread and the event
loop keeps answering ``/health``. For a small batch (the Adult demo's 128 samples x 8
slots) the hand-off itself (submit, a thread wake-up, the future's wake-up of the loop)
costs several times the kernels' CPU, so work on at most ``INLINE_WORK_MAX_IDS`` ids runs
on the loop directly, but only while the pool is idle: a pool job may hold a lock the
small one would wait for (a PS /dump holds every shard's), and waiting for it on the loop
would stall every other request. Nor while a kernel warm-up is still running
(``pyrsia.shared.warming``): a first call then waits for the compilation, which on a cold
start takes tens of seconds, and on the loop it would stop the service's heartbeat.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TypeVar

from pyrsia.shared.constants import INLINE_WORK_MAX_IDS
from pyrsia.shared.warming import warming_in_progress

T = TypeVar("T")


class Offloader:
    """A service's thread pool, bypassed for small work while nothing runs in it."""

    def __init__(self, executor: Executor, max_inline_ids: int = INLINE_WORK_MAX_IDS):
        self.executor = executor
        self.max_inline_ids = max_inline_ids
        self._running = 0  # pool jobs submitted and not done (finished or cancelled)
        self._lock = threading.Lock()

    @property
    def idle(self) -> bool:
        return self._running == 0

    def _done(self, _future: Future) -> None:  # in the pool's thread, or here if cancelled
        with self._lock:
            self._running -= 1

    async def run(self, n_ids: int | None, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``; inline when ``n_ids <= max_inline_ids``, the pool is idle and no
        kernel warm-up is running.

        ``n_ids=None`` always uses the pool (dumps, loads, scans: unbounded work).
        """
        if (
            n_ids is not None
            and n_ids <= self.max_inline_ids
            and self._running == 0
            and not warming_in_progress()
        ):
            return fn(*args)
        future = self.executor.submit(fn, *args)
        with self._lock:
            self._running += 1
        future.add_done_callback(self._done)  # runs at once if the job is already done
        return await asyncio.wrap_future(future)

    def shutdown(self) -> None:
        """Drop queued jobs, wait for the running ones."""
        self.executor.shutdown(wait=True, cancel_futures=True)
