"""StepClock splits a phase's wall time into CPU, run queue (ready without a core) and the
rest (blocked), per thread (pyrsia/services/nn_worker/step_clock.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pyrsia.services.nn_worker.step_clock import StepClock

REPO = Path(__file__).resolve().parent.parent
LINUX_SCHEDSTAT = os.path.exists("/proc/thread-self/schedstat")


def spin(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time: on a loaded machine a wall-clock spin
    gets only a share of a core, and the CPU it was meant to show would fall short."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="run-queue delay comes from Linux schedstat")
def test_sleeping_phase_is_neither_cpu_nor_run_queue():
    clock = StepClock()
    clock.start()
    time.sleep(0.2)
    clock.lap("sleep")
    snap = clock.snapshot()["sleep"]
    assert snap["wall_s"] >= 0.2
    assert snap["cpu_s"] < 0.05
    assert 0.0 <= snap["runq_s"] < 0.1  # blocked, not waiting for a core


SHARED_CORE = """
import json, os, subprocess, sys, time
from pyrsia.services.nn_worker.step_clock import StepClock
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
hog = subprocess.Popen([sys.executable, "-c",
    f"import os; os.sched_setaffinity(0, {{{cpu}}})\\nwhile True: pass"])
time.sleep(0.5)  # the hog is running on our core
clock = StepClock()
clock.start()
end = time.perf_counter() + 1.0
while time.perf_counter() < end:
    pass
clock.lap("busy")
hog.kill()
print(json.dumps(clock.snapshot()["busy"]))
"""


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="run-queue delay comes from Linux schedstat")
def test_sharing_a_core_shows_as_run_queue():
    done = subprocess.run(
        [sys.executable, "-c", SHARED_CORE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    busy = json.loads(done.stdout.strip().splitlines()[-1])
    # Two busy threads on one core: each waits for it about half the time.
    assert busy["runq_s"] > 0.25 * busy["wall_s"]
    assert busy["cpu_s"] + busy["runq_s"] <= busy["wall_s"] * 1.05


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="run-queue delay comes from Linux schedstat")
def test_clock_reads_the_thread_that_uses_it():
    clock = StepClock()
    clock.start()
    spin(0.05)
    clock.lap("main")

    def other() -> None:  # the same clock, now on another thread: that thread's counters
        clock.start()
        spin(0.05)
        clock.lap("other")

    t = threading.Thread(target=other)
    t.start()
    t.join()
    snap = clock.snapshot()
    for phase in ("main", "other"):
        assert snap[phase]["cpu_s"] >= 0.04
        assert 0.0 <= snap[phase]["runq_s"] <= snap[phase]["wall_s"]


def test_clear_forgets_every_total():
    clock = StepClock()
    clock.start()
    spin(0.01)
    clock.lap("a")
    clock.clear()
    assert clock.snapshot() == {}
    clock.start()
    clock.lap("b")
    assert set(clock.snapshot()) == {"b"}
