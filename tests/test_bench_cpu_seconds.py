"""The benchmarks' per-process CPU clock (``benchmarks/_common.cpu_seconds``) is precise.

``ps_bench``'s HTTP rows and the feed-rate benchmark divide a process's CPU over a window
of a fraction of a second; read from ``/proc/<pid>/stat`` in clock ticks (10 ms) a short
window read 0.00 CPU for a client that clearly worked. The kernel's per-process CPU clock
counts in nanoseconds, every thread included (ended ones too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import cpu_seconds  # noqa: E402


def burn(seconds: float) -> None:
    """Keep this thread on the CPU for ``seconds`` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_few_milliseconds_of_cpu_are_seen_to_the_millisecond():
    for _ in range(5):  # every short window, not one lucky one
        before_ps, before = time.process_time(), cpu_seconds(os.getpid())
        burn(0.004)
        used = cpu_seconds(os.getpid()) - before
        truth = time.process_time() - before_ps
        assert abs(used - truth) < 0.001, (used, truth)


def test_another_process_is_measured_with_its_threads():
    code = (
        "import threading, time\n"
        "def burn():\n"
        "    end = time.thread_time() + 0.05\n"
        "    while time.thread_time() < end: pass\n"
        "t = threading.Thread(target=burn); t.start(); t.join(); burn()\n"
        "print(time.process_time(), flush=True)\n"
        "import sys; sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        own = float(child.stdout.readline())
        seen = cpu_seconds(child.pid)
        assert own >= 0.1  # both threads burned, one of them has ended
        assert own - 0.001 <= seen <= own + 0.05, (seen, own)
    finally:
        child.communicate(timeout=10)
