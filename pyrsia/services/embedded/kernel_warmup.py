"""Load (or compile) every numba kernel before it is needed.

The kernels are compiled on first call and cached next to their modules
(``cache=True``). On a fresh checkout that first compile takes tens of seconds per
process, and several services starting at once would each pay it; ``python -m
pyrsia.services.warmup`` (``make test``, ``make demo``) pays it once. Even from the cache, the
first call of each kernel costs a process ~0.1-0.5 s of CPU, so each service also loads
its own kernels in a background thread as it starts (``pyrsia.shared.warming``): a job's
first training steps then do not pay it (they did: the first gradients reached the PS and
worker kernels seconds into the timed window of the end-to-end benchmark).
"""

from __future__ import annotations

import time

from pyrsia.services.embedded.fast_kernels import warm_fast_kernels
from pyrsia.services.embedding_ps.warm import warm_ps
from pyrsia.services.embedding_worker.warm import warm_worker
from pyrsia.shared.scatter import warm


def warm_up() -> float:
    """Every kernel of every process kind (``make warm``); returns the seconds it took."""
    started = time.perf_counter()
    warm_ps()
    warm_worker()
    warm()
    warm_fast_kernels()
    return time.perf_counter() - started


def main() -> None:
    """``python -m pyrsia.services.warmup``: every kernel ready, and how long it took."""
    print(f"numba kernels ready ({warm_up():.1f}s)")


if __name__ == "__main__":
    main()
