"""Process plumbing of the end-to-end benchmark: launch, CPU sampling, /metrics scraping.

``CpuSampler`` reads user+system CPU seconds of each named process *tree* (the root
pid plus every descendant, e.g. ``persia-launcher nn-worker`` -> torchrun -> train.py)
from ``/proc`` every ``interval_s`` in a thread, so the benchmark can report each
process's CPU share over exactly the training window. ``scrape_histograms`` turns a
service's Prometheus ``/metrics`` text into count / mean seconds per histogram.
"""

from __future__ import annotations

import os
import re
import resource
import threading
import time
import urllib.request
from pathlib import Path

from sched_stats import SCHED_KEYS, tree_sched

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _task_cpu_s(task: str) -> tuple[str, float] | None:
    """(kernel name, CPU seconds) of thread ``task`` of this process, or None once it ended.

    ``schedstat``'s first field counts nanoseconds on the CPU; ``stat``'s utime+stime count
    10 ms ticks, too coarse for a window of a few steps, and serve only where the kernel
    lacks schedstat.
    """
    base = f"/proc/self/task/{task}"
    try:
        with open(f"{base}/stat") as fh:
            text = fh.read()
        name = text[text.index("(") + 1 : text.rindex(")")]
        try:
            with open(f"{base}/schedstat") as fh:
                return name, int(fh.read().split()[0]) / 1e9
        except FileNotFoundError:
            fields = text.rsplit(")", 1)[1].split()
            return name, (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
        return None


ENDED = "(ended threads)"
"""The key under which :func:`threads_cpu` and :func:`threads_window` count the CPU of threads
that have ended (gone from ``/proc``, e.g. an embedded data loader's once its data is sent)."""


def threads_cpu() -> dict[str, float]:
    """CPU seconds used so far by each thread of this process, summed per thread name
    (Python's name for its threads, e.g. ``pyrsia-runtime``; the OS name for the others),
    and by the threads that have ended under :data:`ENDED`: the values sum to the process's
    CPU time."""
    python_names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        read = _task_cpu_s(task)
        if read is not None:
            name = python_names.get(int(task)) or read[0]
            out[name] = out.get(name, 0.0) + read[1]
    out[ENDED] = max(0.0, time.process_time() - sum(out.values()))  # read last: never short
    return out


def threads_window(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """CPU seconds per thread name between two :func:`threads_cpu` readings. A thread that
    ended in between is counted under :data:`ENDED` for its part of the window only, so the
    values sum to the process's CPU over the window."""
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    out[ENDED] = out.get(ENDED, 0.0) - sum(v for k, v in before.items() if k not in after)
    return out


def minor_faults() -> int:
    """Page faults this process has taken so far (minor: no disk read, e.g. a fresh page
    the kernel zeroes for a heap that grew back), all threads together."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of ``pid``, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK


def process_tree_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each root's tree (one scan of /proc for all roots)."""
    return {name: cpu for name, (cpu, _) in process_trees(roots).items()}


def process_trees(roots: dict[str, int]) -> dict[str, tuple[float, list[int]]]:
    """CPU seconds and the pids of each root's tree (one scan of /proc for all roots)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            s = _stat(int(entry))
            if s is not None:
                stats[int(entry)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out = {}
    for name, root in roots.items():
        total, stack, pids = 0.0, [root], []
        while stack:
            pid = stack.pop()
            if pid in stats:
                total += stats[pid][1]
                pids.append(pid)
                stack.extend(children.get(pid, ()))
        out[name] = (total, pids)
    return out


class CpuSampler:
    """Samples the CPU seconds of named process trees in a background thread.

    A tree's value never decreases: when a process exits its last value is kept
    (its CPU then counts toward nothing later, which is right for a window before exit).
    """

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.roots: dict[str, int] = {}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._last: dict[str, float] = {}
        self._threads: dict[str, dict] = {}  # per tree: each thread's last sched reading

    def track(self, name: str, pid: int) -> None:
        self.roots[name] = pid

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        trees = process_trees(dict(self.roots))
        now = {name: cpu for name, (cpu, _) in trees.items()}
        for name, (_, pids) in trees.items():  # the scheduler's counters, as name/key
            seen = self._threads.setdefault(name, {})
            now.update({f"{name}/{k}": v for k, v in tree_sched(pids, seen).items()})
        merged = {k: max(v, self._last.get(k, 0.0)) for k, v in now.items()}
        self._last.update(merged)
        self.samples.append((time.time(), dict(self._last)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _at(self, t: float) -> dict[str, float]:
        """CPU seconds per tree at wall time ``t`` (linear between samples)."""
        before = [s for s in self.samples if s[0] <= t]
        after = [s for s in self.samples if s[0] >= t]
        if not before:
            return dict(after[0][1]) if after else {}
        if not after:
            return dict(before[-1][1])
        (t0, a), (t1, b) = before[-1], after[0]
        w = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
        return {k: a.get(k, 0.0) + w * (b.get(k, 0.0) - a.get(k, 0.0)) for k in b}

    def window(self, start: float, end: float) -> dict[str, dict[str, float]]:
        """Per tree: CPU seconds used in [start, end], the share of one core (1.0 = a core)
        and, under ``sched``, the scheduler's counters over the window (``sched_stats``)."""
        a, b = self._at(start), self._at(end)
        span = max(end - start, 1e-9)
        out = {
            k: {"cpu_s": b[k] - a.get(k, 0.0), "cores": (b[k] - a.get(k, 0.0)) / span}
            for k in b
            if "/" not in k
        }
        for name, v in out.items():
            v["sched"] = {
                key: b.get(f"{name}/{key}", 0.0) - a.get(f"{name}/{key}", 0.0) for key in SCHED_KEYS
            }
        return out


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)_(sum|count)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")
_BUCKET = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)$'
)


def _quantile(buckets: dict[float, float], q: float) -> float:
    """Upper bound (ms) of the bucket holding quantile ``q`` of cumulative ``buckets``."""
    total = buckets.get(float("inf"), 0.0)
    for le in sorted(buckets):
        if total and buckets[le] >= q * total:
            return 1e3 * le
    return float("nan")


def scrape_histograms(url: str, timeout_s: float = 5.0) -> dict[str, dict[str, float]]:
    """``{histogram: {"count", "mean_ms", "p50_ms", "p90_ms"}}`` from ``url/metrics``.

    Labels are summed; quantiles are bucket upper bounds (Prometheus' resolution).
    """
    token = os.environ.get("PERSIA_AUTH_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        text = resp.read().decode()
    acc: dict[str, dict[str, float]] = {}
    cumulative: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        b = _BUCKET.match(line)
        if b:
            per = cumulative.setdefault(b.group(1), {})
            le = float(b.group(2))
            per[le] = per.get(le, 0.0) + float(b.group(3))
            continue
        m = _LINE.match(line)
        if m:
            acc.setdefault(m.group(1), {"sum": 0.0, "count": 0.0})[m.group(2)] += float(m.group(4))
    return {
        name: {
            "count": v["count"],
            "mean_ms": 1e3 * v["sum"] / v["count"] if v["count"] else 0.0,
            "p50_ms": _quantile(cumulative[name], 0.5),
            "p90_ms": _quantile(cumulative[name], 0.9),
        }
        for name, v in acc.items()
        if name in cumulative
    }
