"""A bounded window of sends under way, for a thread that submits them to an event loop.

A data loader's ``send_data`` returns once its batch is submitted; at most ``limit`` sends
are under way, and an error of an earlier send is raised at the next call (or at
:meth:`SendWindow.drain`). Both data-loader senders use it: the one that posts to the
services (pyrsia/services/data_loader/sender.py) and embedded mode's in-process one.
"""

from __future__ import annotations

import concurrent.futures

from pyrsia.shared.validate import positive_int

__all__ = ["SendWindow"]


class SendWindow:
    """At most ``limit`` futures under way; finished ones are collected, errors re-raised."""

    def __init__(self, limit: int):
        self.limit = positive_int(limit, "max_inflight")
        self._futures: list[concurrent.futures.Future] = []

    def __len__(self) -> int:
        return len(self._futures)

    def make_room(self) -> None:
        """Collect finished sends, waiting for one while the window is full."""
        self._reap(block=len(self._futures) >= self.limit)

    def add(self, future: concurrent.futures.Future) -> None:
        """One more send under way (call :meth:`make_room` first)."""
        self._futures.append(future)

    def drain(self) -> None:
        """Wait for every send; re-raise the first error."""
        while self._futures:
            self._reap(block=True)

    def cancel(self) -> None:
        """Cancel every send under way (failing or stopped: no retries)."""
        for future in self._futures:
            future.cancel()
        self._futures = []

    def _reap(self, *, block: bool) -> None:
        if block and self._futures:
            concurrent.futures.wait(self._futures, return_when=concurrent.futures.FIRST_COMPLETED)
        still = []
        for future in self._futures:
            if future.done():
                future.result()
            else:
                still.append(future)
        self._futures = still
