"""The benchmarks' per-thread CPU clock resolves a few milliseconds.

The feed-rate benchmark divides each NN-worker thread's CPU time over a steady window of a
handful of steps; a clock with the kernel's 10 ms tick read 0.0 for a short window
(``nn_cpu_ms_per_batch: 0.0`` in CI), so it must count nanoseconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "e2e"))
from procs import ENDED, threads_cpu, threads_window  # noqa: E402

SPIN_S = 0.003


def _spin() -> None:
    start = time.thread_time()
    while time.thread_time() - start < SPIN_S:
        pass
    done.set()
    release.wait()


done, release = threading.Event(), threading.Event()


@pytest.mark.timeout(30)
def test_a_thread_that_spun_3_ms_reads_3_ms_not_a_tick():
    thread = threading.Thread(target=_spin, name="spin-3ms")
    thread.start()
    try:
        assert done.wait(20)
        spent = threads_cpu()["spin-3ms"]
    finally:
        release.set()
        thread.join()
    # the 10 ms tick reads 0.0 or 0.01 here; nanosecond accounting reads ~3 ms
    assert SPIN_S <= spent < SPIN_S + 0.004, spent


def test_every_thread_of_the_process_is_counted_under_its_name():
    names = threads_cpu()
    assert "MainThread" in names
    assert all(v >= 0.0 for v in names.values())


def _spin_for(
    seconds: float, started: threading.Event | None = None, go: threading.Event | None = None
) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    if started is not None:
        started.set()
        go.wait()
        start = time.thread_time()
        while time.thread_time() - start < seconds:
            pass


def _wait_gone(*native_ids: int) -> None:
    """Until the OS threads have exited (``join`` returns a moment before they leave /proc)."""
    while any(os.path.exists(f"/proc/self/task/{tid}") for tid in native_ids):
        time.sleep(0.001)


@pytest.mark.timeout(30)
def test_a_thread_that_ended_inside_the_window_is_counted_for_its_part_of_it():
    """The embedded data loader's thread ends before the window closes: gone from /proc, its
    CPU in the window is reported under ENDED (and only the part inside the window)."""
    started, go = threading.Event(), threading.Event()
    straddling = threading.Thread(target=_spin_for, args=(0.03, started, go), name="straddles")
    straddling.start()
    assert started.wait(20)  # 30 ms spent before the window, 30 ms more inside it
    before = threads_cpu()
    go.set()
    inside = threading.Thread(target=_spin_for, args=(0.03,), name="inside")
    inside.start()
    inside.join()
    straddling.join()
    _wait_gone(inside.native_id, straddling.native_id)
    window = threads_window(threads_cpu(), before)
    assert "straddles" not in window and "inside" not in window
    assert 0.06 <= window[ENDED] < 0.075, window
    assert all(v >= 0.0 for v in window.values()), window
