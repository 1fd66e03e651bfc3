"""The e2e benchmark's scheduler counters per process tree (benchmarks/e2e/sched_stats.py).

``e2e_bench.py`` prints each process's CPU, run-queue wait and context switches per training
step, the figures a change to the services' per-batch work moves. A thread that ended within
the window (a kernel warm-up, a helper) must keep counting what it did, or a process's
figures fall below what it used.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "e2e"))
from procs import CpuSampler  # noqa: E402
from sched_stats import SCHED_KEYS, per_batch, tree_sched  # noqa: E402


def _spin_then_sleep(spin_s: float, sleeps: int) -> None:
    start = time.thread_time()
    while time.thread_time() - start < spin_s:
        pass
    for _ in range(sleeps):
        time.sleep(0.001)


def _work_then_wait(done: threading.Event, release: threading.Event) -> None:
    _spin_then_sleep(0.02, 20)
    done.set()
    release.wait()


@pytest.mark.timeout(30)
def test_an_ended_thread_keeps_its_cpu_and_its_switches():
    seen: dict = {}
    pid = os.getpid()
    before = tree_sched([pid], seen)
    done, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_work_then_wait, args=(done, release))
    thread.start()
    assert done.wait(20)
    alive = tree_sched([pid], seen)  # reads the thread while it lives
    release.set()
    thread.join()
    after = tree_sched([pid], seen)  # gone from /proc now
    assert set(after) == set(SCHED_KEYS)
    assert after["cpu_s"] - before["cpu_s"] >= 0.015
    assert after["vcsw"] - before["vcsw"] >= 1  # its sleeps
    assert all(after[k] >= alive[k] for k in SCHED_KEYS)  # its ending took nothing away


@pytest.mark.timeout(30)
def test_the_sampler_reports_a_window_per_step():
    sampler = CpuSampler()
    sampler.track("me", os.getpid())
    sampler.sample()  # read here, at each end of the window (no sampling thread)
    t0 = time.time()
    _spin_then_sleep(0.05, 10)
    t1 = time.time()
    sampler.sample()
    window = sampler.window(t0, t1)["me"]
    assert set(window["sched"]) == set(SCHED_KEYS)
    assert window["sched"]["cpu_s"] >= 0.03
    step = per_batch(window["sched"], 10)
    assert step["cpu_ms"] == pytest.approx(1e2 * window["sched"]["cpu_s"])
    assert step["vcsw"] == pytest.approx(window["sched"]["vcsw"] / 10)
