"""Loading compiled kernels in the background, so the first request does not pay for it.

numba loads a cached kernel on its first call (~0.1-0.5 s of CPU each). A process that
starts its warm-up in a thread as it starts pays that while it is still idle, not inside
the first training steps (pyrsia/services/warmup.py, pyrsia/shared/scatter.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


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
        log.debug("%s kernels ready in %.2fs", what, time.perf_counter() - started)

    thread = threading.Thread(target=run, name="pyrsia-warmup", daemon=True)
    thread.start()
    return thread
