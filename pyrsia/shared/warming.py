"""Loading compiled kernels in the background, so the first request does not pay for it.

numba loads a cached kernel on its first call (~0.1-0.5 s of CPU each). A process that
starts its warm-up in a thread as it starts pays that while it is still idle, not inside
the first training steps (each engine's ``warm.py``, pyrsia/shared/scatter.py).

On a cold start (no cache) the warm-up compiles for tens of seconds, and a first call made
meanwhile waits for that compilation. :func:`warming_in_progress` says whether a warm-up
started here is still running, so that ``pyrsia.shared.thread_offload`` keeps small work off
the event loop until it is done: a loop blocked on a compilation stops answering ``/health``
and stops the registry heartbeat, and the service drops out of the registry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_running = 0
"""Warm-up threads started by :func:`warm_in_background` and not finished (this process)."""
_running_lock = threading.Lock()


def warming_in_progress() -> bool:
    """Whether a warm-up started by :func:`warm_in_background` is still running."""
    return _running > 0


def _count(delta: int) -> None:
    global _running
    with _running_lock:
        _running += delta


def warm_in_background(warm: Callable[[], object], what: str) -> threading.Thread:
    """Run ``warm`` in a daemon thread (it holds no state: nothing to clean up at exit); a
    failure is logged, never raised (the first real call compiles what is missing)."""

    def run() -> None:
        started = time.perf_counter()
        try:
            warm()
        except Exception:
            log.exception("warming up the %s kernels failed", what)
            return
        finally:
            _count(-1)
        log.debug("%s kernels ready in %.2fs", what, time.perf_counter() - started)

    thread = threading.Thread(target=run, name="pyrsia-warmup", daemon=True)
    _count(+1)
    try:
        thread.start()
    except BaseException:
        _count(-1)
        raise
    return thread
