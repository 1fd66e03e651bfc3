"""An idle-class runtime loop keeps answering while other processes keep every core busy.

During training the NN worker's loop thread is in ``SCHED_IDLE`` (tests/test_session_cpu_class.py);
it also serves the rank's registry heartbeat and Prometheus's scrapes. With every core busy in
the default class an idle-class thread got no CPU at all, even while the training thread waited
for it, and the scrapes timed out (``make compose-test``: 2 ranks and 5 service containers on
2 cores). A thread that waits on the loop (``Runtime.waiting_on_loop``: a batch, a send slot,
``Runtime.run``) now lends it the default class.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from aiohttp import web

from pyrsia.shared.runtime import Runtime
from tests.redis_server import free_port

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")

SATURATED_S = 6.0
BATCH_WAIT_S = 0.02
"""How long the training thread waits on the loop for each batch."""
SCRAPE_BOUND_S = 2.0
"""Half the 4 s Prometheus allows a scrape (monitoring/prometheus.yml)."""

SCRAPER = """
import json, sys, time, urllib.request
url, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
took = []
while time.monotonic() < until:
    started = time.monotonic()
    try:
        urllib.request.urlopen(url, timeout=30).read()
        took.append(time.monotonic() - started)
    except OSError:
        took.append(float("inf"))
    time.sleep(0.1)
print(json.dumps(took))
"""


def _loop_class(runtime: Runtime) -> int:
    return os.sched_getscheduler(runtime.native_id)


async def _class_seen_by_the_loop() -> int:
    return os.sched_getscheduler(0)


def test_a_thread_waiting_on_the_loop_lends_it_the_default_class():
    runtime = Runtime().start()
    hold = runtime.hold_cpu_class("background")
    try:
        assert _loop_class(runtime) == os.SCHED_IDLE
        # Runtime.run waits on the loop: the coroutine runs in the default class
        assert runtime.run(_class_seen_by_the_loop()) == os.SCHED_OTHER
        assert _loop_class(runtime) == os.SCHED_IDLE
        # work handed over without waiting for it runs in the held class
        assert runtime.submit(_class_seen_by_the_loop()).result(10) == os.SCHED_IDLE
        with runtime.waiting_on_loop():
            with runtime.waiting_on_loop():  # nested waits count
                assert _loop_class(runtime) == os.SCHED_OTHER
            assert _loop_class(runtime) == os.SCHED_OTHER
        assert _loop_class(runtime) == os.SCHED_IDLE
    finally:
        hold.release()
    assert _loop_class(runtime) == os.SCHED_OTHER
    with runtime.waiting_on_loop():  # no holder: nothing changes either way
        assert _loop_class(runtime) == os.SCHED_OTHER
    assert _loop_class(runtime) == os.SCHED_OTHER
    runtime.stop()


async def _serve(port: int) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="pyrsia_nn_worker_steps 1\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def test_an_idle_class_loop_answers_scrapes_while_the_training_waits_and_every_core_is_busy():
    """The scrapes come from another process, as Prometheus's do. What is not covered: a
    loop that holds the GIL when the other processes preempt it in the middle of a step
    stalls the training thread too, until the cores have a gap (README "Sharing one
    machine": PERSIA_CPU_PRIORITY=normal where other jobs keep the cores busy)."""
    runtime = Runtime().start()
    port = free_port()
    runner = runtime.run(_serve(port))
    hold = runtime.hold_cpu_class("background")
    # one busy process of the default class per core, plus one: no gaps anywhere
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) + 1)
    ]
    scraper = subprocess.Popen(
        [sys.executable, "-c", SCRAPER, f"http://127.0.0.1:{port}/metrics", str(SATURATED_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    steps = 0
    try:
        # the training thread, waiting for its batches until the last scrape is answered (a
        # scrape still in flight when it stops waiting is, under this load, starved)
        deadline = time.monotonic() + SATURATED_S + 60
        while scraper.poll() is None and time.monotonic() < deadline:
            runtime.run(asyncio.sleep(BATCH_WAIT_S))
            steps += 1
        took = json.loads(scraper.communicate(timeout=120)[0])
    finally:
        for process in [*burners, scraper]:
            process.kill()
            process.wait()
        hold.release()
        runtime.run(runner.cleanup())
        runtime.stop()
    assert took, "the scraper made no request"
    assert max(took) < SCRAPE_BOUND_S, f"the slowest scrapes took {sorted(took)[-3:]} s"
    assert steps >= 20, f"only {steps} steps in {SATURATED_S} s"
