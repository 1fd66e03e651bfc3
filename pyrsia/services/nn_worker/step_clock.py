"""Where a training step's time goes on the training thread: wall, CPU and run-queue seconds
per phase.

``TrainCtx.backward`` splits its step into ``autograd`` (loss.backward()), ``gradient_send``
(collecting the embedding gradients and handing them to the sender) and ``dense_step`` (the
dense optimizer step and zero_grad); a training script may time its own phases (waiting for
the next batch, forward) with another clock. The totals are
cumulative since the context was entered, so a benchmark reads them before and after its
timed window. Thread CPU time (``time.thread_time``) is reported next to wall time because
on a shared machine wall time also counts waiting. On Linux the clock also reads the
thread's run-queue delay (``/proc/thread-self/schedstat``, about 2 µs a read): the time the
thread was ready to run but had no core. What is left, wall − CPU − run queue, is time the
thread was blocked: on the GIL, a lock, torch's worker threads or the network.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["StepClock"]


class _RunQueueDelay:
    """The calling thread's cumulative run-queue delay in seconds (None where not available)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self._broken = False

    def read(self) -> float | None:
        if self._broken:
            return None
        tid = threading.get_native_id()
        if tid != self._tid:  # /proc/thread-self names the thread that opened it
            self.close()
            try:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                self._broken = True
                return None
            self._tid = tid
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * 1e-9
        except (OSError, IndexError, ValueError):
            self._broken = True
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._tid = None

    def __del__(self) -> None:
        self.close()


class StepClock:
    """Cumulative wall, thread-CPU and run-queue seconds per named phase of one thread."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.runq: dict[str, float] = {}
        """Seconds ready to run without a core (empty where the kernel does not say)."""
        self._delay = _RunQueueDelay()
        self._wall0 = 0.0
        self._cpu0 = 0.0
        self._runq0: float | None = None

    def start(self) -> None:
        """Start timing the next phase (call from the training thread)."""
        self._wall0, self._cpu0 = time.perf_counter(), time.thread_time()
        self._runq0 = self._delay.read()

    def lap(self, phase: str) -> None:
        """Add the time since ``start``/the last ``lap`` to ``phase`` and restart the clock."""
        wall, cpu, runq = time.perf_counter(), time.thread_time(), self._delay.read()
        self.wall[phase] = self.wall.get(phase, 0.0) + wall - self._wall0
        self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu - self._cpu0
        if runq is not None and self._runq0 is not None:
            self.runq[phase] = self.runq.get(phase, 0.0) + runq - self._runq0
        self._wall0, self._cpu0, self._runq0 = wall, cpu, runq

    def clear(self) -> None:
        """Forget the totals so far (the phases to count start now)."""
        self.wall.clear()
        self.cpu.clear()
        self.runq.clear()

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{phase: {"wall_s": ..., "cpu_s": ..., "runq_s": ...}}`` so far (``runq_s`` only
        where the kernel reports run-queue delay)."""
        out = {k: {"wall_s": self.wall[k], "cpu_s": self.cpu[k]} for k in self.wall}
        for k, v in self.runq.items():
            out[k]["runq_s"] = v
        return out
