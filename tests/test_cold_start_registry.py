"""A service stays registered while its kernels are still compiling (issue 49, item 5).

On a cold start (no numba cache) a PS registered itself, then answered its first small
lookup inline on the event loop; that call waited for the warm-up thread's compilation
(28.8 s measured here), the loop stopped, the registry heartbeat lapsed and the PS left the
registry and ``persia-launcher status`` for 23.5 s. While a warm-up runs, small work goes to
the thread pool instead, so the loop keeps answering and heartbeating.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.warming import warm_in_background, warming_in_progress


async def test_small_work_leaves_the_loop_while_a_warm_up_runs():
    compiled = threading.Event()
    warm = warm_in_background(lambda: compiled.wait(10), "test")
    offload = Offloader(ThreadPoolExecutor(max_workers=1))
    try:
        assert warming_in_progress()
        loop_thread = threading.current_thread()
        ran_in: list[threading.Thread] = []

        def kernel() -> None:  # as a first call does: it waits for the compilation
            ran_in.append(threading.current_thread())
            compiled.wait(10)

        work = asyncio.ensure_future(offload.run(8, kernel))
        ticks, started = 0, time.monotonic()
        while not work.done() and time.monotonic() - started < 0.5:  # the loop keeps running
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks >= 20 and not work.done()
        compiled.set()
        await work
        assert ran_in and ran_in[0] is not loop_thread
        warm.join(5)
        assert not warming_in_progress()
        ran_in.clear()
        await offload.run(8, kernel)  # warm: small work runs inline again
        assert ran_in[0] is loop_thread
    finally:
        compiled.set()
        offload.shutdown()
