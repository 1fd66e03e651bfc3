"""Helpers shared by the service benchmarks: processes, timing, tables, JSON, CPU accounting.

``Cluster`` starts a throwaway redis-server and Pyrsia services as real subprocesses
(the way tests do, through ``tests.service_procs``) and stops them with SIGTERM.
``repeat`` times a function with warm-up and repeats and reports min/median, because
shared machines are noisy. ``print_table`` and ``write_json`` format results;
``cpu_seconds`` reads a process's user+system CPU time from ``/proc/<pid>/stat`` so a
benchmark can say how busy each process was.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python benchmarks/x.py`: make the repo importable
    sys.path.insert(0, str(REPO))
BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from tests.redis_server import RedisServer  # noqa: E402
from tests.service_procs import ServiceProc  # noqa: E402

RESULTS_DIR = REPO / "bench_results"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class Cluster:
    """A redis-server plus service subprocesses of one benchmark job; a context manager."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.redis = RedisServer().start()
        self.env = {
            "PERSIA_REDIS_URL": self.redis.url,
            "PERSIA_JOB_ID": f"bench-{uuid.uuid4().hex[:8]}",
            "PYRSIA_LOG_LEVEL": "WARNING",
        }
        self.log_dir = log_dir
        self.procs: list[ServiceProc] = []

    def start(
        self,
        module: str,
        args: list[str],
        *,
        role: str,
        replica_index: int = 0,
        wait_ready: bool = True,
        extra_env: dict[str, str] | None = None,
        python_args: list[str] | None = None,
    ) -> ServiceProc:
        """Start ``python -m module args`` (or ``python -m <python_args> module`` for a profiler)."""
        env = {**self.env, **(extra_env or {})}
        if python_args:
            args = [*python_args[1:], "-m", module, *args]
            module = python_args[0]
        proc = ServiceProc.start(
            module,
            args,
            env,
            role=role,
            replica_index=replica_index,
            wait_ready=wait_ready,
            timeout_s=120.0,
            log_dir=self.log_dir,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> list[int]:
        """SIGTERM every service (newest first), then redis; the services' exit codes."""
        codes = [p.stop() for p in reversed(self.procs)]
        self.procs.clear()
        self.redis.stop()
        return codes

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def repeat(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5) -> dict[str, float]:
    """Wall seconds of ``fn()``: ``warmup`` untimed calls, then min/median/max over ``repeats``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return summarize(times)


def summarize(times: Sequence[float]) -> dict[str, float]:
    """min / median / max of a list of durations (seconds)."""
    return {
        "min_s": float(min(times)),
        "median_s": float(statistics.median(times)),
        "max_s": float(max(times)),
        "repeats": len(times),
    }


def process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time, as glibc's ``clock_getcpuclockid`` makes
    it on Linux (``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``): every thread's time on
    the CPU, ended threads included, in nanoseconds."""
    return ((~pid) << 3) | 2


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads, ended ones
    included), to the nanosecond: benchmarks divide it over windows of a fraction of a
    second, where ``/proc/<pid>/stat``'s 10 ms ticks read a busy client as idle. Falls back
    to those ticks where the kernel has no such clock."""
    try:
        return time.clock_gettime(process_cpu_clock(pid))
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)


def fmt_rate(x: float | None) -> str:
    """A rate as 12.3M / 456.7k."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.1f}"


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """Print ``rows`` as an aligned table; ``columns`` are (key, header) pairs."""
    cells = [[str(r.get(k, "")) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    print("  ".join(h.rjust(w) for (_, h), w in zip(columns, widths, strict=True)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))


def cpu_model() -> str:
    """The processor's name as the kernel reports it (else what ``platform.processor()`` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (bf16 decides what ``--mixed-precision`` means)."""
    from pyrsia.services.nn_worker.precision import cpu_computes_bf16

    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_bf16": cpu_computes_bf16(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_avg": os.getloadavg(),
    }


def result_path(name: str, path: Path | None = None) -> Path:
    """``path``, or a new ``bench_results/<name>-<time>.json`` when none is given."""
    return (
        path if path is not None else RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )


def write_json(name: str, doc: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``doc`` (plus machine info) to ``path`` or ``bench_results/<name>-<time>.json``."""
    path = result_path(name, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine_info(), **doc}, indent=1, default=float))
    return path


def parse_result_line(text: str) -> dict[str, float]:
    """The ``RESULT k=v ...`` line of a benchmark's output, as floats (exactly one allowed)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if len(lines) != 1:
        raise ValueError(f"expected exactly one RESULT line, found {len(lines)}")
    out = {}
    for item in lines[0].split()[1:]:
        key, _, value = item.partition("=")
        out[key] = float(value)
    return out
