"""A bounded window of sends under way, for a thread that submits them to an event loop.

A data loader's ``send_data`` returns once its batch is submitted; at most ``limit`` sends
are under way, and an error of an earlier send is raised at the next call (or at
:meth:`SendWindow.drain`). Both data-loader senders use it: the one that posts to the
services (pyrsia/services/data_loader/sender.py) and embedded mode's in-process one.

Each send tells the window when it finishes (a done callback on its future), so making room
is one look at a counter; waiting is one condition wait. ``concurrent.futures.wait`` over the
window's futures, which it replaced, locked and unlocked every future twice per call: ~0.14
ms of the data loader's CPU per batch in embedded mode on Census-Income, where the window
is full at nearly every batch (the loader runs ahead of the training loop's queue).
"""

from __future__ import annotations

import concurrent.futures
import threading

from pyrsia.shared.validate import positive_int

__all__ = ["SendWindow"]


class SendWindow:
    """At most ``limit`` futures under way; finished ones are collected, errors re-raised."""

    def __init__(self, limit: int):
        self.limit = positive_int(limit, "max_inflight")
        self._futures: set[concurrent.futures.Future] = set()
        """Added and not collected yet: under way, or finished and in ``_finished``."""
        self._finished: list[concurrent.futures.Future] = []
        """Finished and not collected yet, in the order they finished."""
        self._changed = threading.Condition()

    def __len__(self) -> int:
        with self._changed:
            return len(self._futures)

    def make_room(self) -> None:
        """Collect finished sends (an error of one is raised here), waiting for one to
        finish while ``limit`` are under way."""
        with self._changed:
            while len(self._futures) - len(self._finished) >= self.limit:
                self._changed.wait()
        self._collect()

    def add(self, future: concurrent.futures.Future) -> None:
        """One more send under way (call :meth:`make_room` first)."""
        with self._changed:
            self._futures.add(future)
        future.add_done_callback(self._on_done)  # at once if it finished already

    def drain(self) -> None:
        """Wait for every send; re-raise the first error."""
        while True:
            with self._changed:
                if not self._futures:
                    return
                while not self._finished:
                    self._changed.wait()
            self._collect()

    def cancel(self) -> None:
        """Cancel every send under way (failing or stopped: no retries)."""
        with self._changed:
            futures = list(self._futures)
            self._futures.clear()
            self._finished.clear()
        for future in futures:
            future.cancel()

    def _on_done(self, future: concurrent.futures.Future) -> None:
        with self._changed:
            if future in self._futures:  # not after cancel()
                self._finished.append(future)
                self._changed.notify_all()

    def _collect(self) -> None:
        """Forget the finished sends; the first that failed (or was cancelled: the runtime
        stopped) is raised, and again at every later call, until :meth:`cancel`."""
        with self._changed:
            finished, self._finished = self._finished, []
            for k, future in enumerate(finished):
                if future.cancelled() or future.exception() is not None:
                    self._finished = finished[k:]
                    break
                self._futures.discard(future)
            else:
                return
        future.result()
