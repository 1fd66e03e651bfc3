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

import pytest

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


@pytest.mark.slow
async def test_a_cold_ps_stays_registered_through_its_first_lookup(services, tmp_path, monkeypatch):
    """The issue's probe: an empty numba cache, a small lookup at once after registration;
    the registry entry never lapses (its TTL left stays above a heartbeat's worth)."""
    import numpy as np
    import redis.asyncio as aioredis

    from pyrsia.shared.constants import ROLE_EMBEDDING_PS, service_key
    from pyrsia.shared.http_client import HttpClient

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    ps = services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    key = service_key(ps.env["PERSIA_JOB_ID"], ROLE_EMBEDDING_PS, 0)
    db = aioredis.Redis.from_url(ps.env["PERSIA_REDIS_URL"])
    client = HttpClient(retries=0)
    lowest: list[int] = []

    async def watch() -> None:
        while True:
            lowest.append(await db.pttl(key))
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        hyper = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
        await client.call(f"{ps.url}/configure", {"hyperparams": hyper})
        await client.call(
            f"{ps.url}/register_optimizer", {"optimizer": {"type": "adagrad", "lr": 0.05}}
        )
        ids = np.arange(1, 9, dtype=np.uint64)
        await client.call(
            f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 8, "ids": ids}]}, timeout_s=120
        )
    finally:
        watcher.cancel()
        await client.close()
        await db.aclose()
    assert lowest and min(lowest) > 1000, min(lowest)  # never expired (-2), never near it
