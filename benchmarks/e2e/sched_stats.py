"""What the scheduler did for a process tree: CPU, run-queue wait, wake-ups and preemptions.

On a machine where the NN worker's training threads share the cores with the services,
every millisecond a service spends on the CPU and every wake-up it takes can push a
training thread into the run queue. :func:`tree_sched` sums, over every thread of every
process of a tree, four counters the kernel keeps per thread:

- ``cpu_s``: time on the CPU (``/proc/<pid>/task/<tid>/schedstat``, first field, ns);
- ``runq_s``: time ready to run but waiting for a core (schedstat's second field);
- ``vcsw``: voluntary context switches (``status``: the thread blocked, e.g. waited on a
  socket, a lock or a queue; each one is a later wake-up);
- ``ivcsw``: involuntary ones (``status``: the thread was preempted).

A thread that ended keeps the counters it had at its last reading (the sampler reads every
fraction of a second), so what it did before that still counts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

SCHED_KEYS = ("cpu_s", "runq_s", "vcsw", "ivcsw")


def task_sched(pid: int, tid: str) -> dict[str, float] | None:
    """The four counters of thread ``tid`` of ``pid``, or None once it ended (or where the
    kernel has no schedstat)."""
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/schedstat") as fh:
            cpu_ns, wait_ns, _slices = fh.read().split()[:3]
        vcsw = ivcsw = 0
        with open(f"{base}/status") as fh:
            for line in fh:
                if line.startswith("voluntary_ctxt_switches"):
                    vcsw = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    ivcsw = int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return {"cpu_s": int(cpu_ns) / 1e9, "runq_s": int(wait_ns) / 1e9, "vcsw": vcsw, "ivcsw": ivcsw}


def tree_sched(
    pids: Iterable[int], seen: dict[tuple[int, str], dict[str, float]]
) -> dict[str, float]:
    """The four counters summed over every thread of ``pids`` seen so far: ``seen`` keeps
    each thread's last reading (updated here), so a thread that ended (a kernel warm-up, a
    helper) still counts what it did and a tree's sums never fall."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            read = task_sched(pid, tid)
            if read is not None:
                seen[(pid, tid)] = read
    out = dict.fromkeys(SCHED_KEYS, 0.0)
    for read in seen.values():
        for key in SCHED_KEYS:
            out[key] += read[key]
    return out


def per_batch(delta: dict[str, float], batches: int) -> dict[str, float]:
    """A window's counters per batch: CPU and run queue in ms, switches as counts."""
    n = max(batches, 1)
    return {
        "cpu_ms": 1e3 * delta.get("cpu_s", 0.0) / n,
        "runq_ms": 1e3 * delta.get("runq_s", 0.0) / n,
        "vcsw": delta.get("vcsw", 0.0) / n,
        "ivcsw": delta.get("ivcsw", 0.0) / n,
    }
