"""How a service process shares the CPU with the NN worker on the same machine.

``normal``: the default scheduling class, the right one when each service has its own
machine (docker compose on a cluster).

``background``: Linux's ``SCHED_IDLE`` class (``nice 19`` where it does not exist). On
one machine the NN worker's dense step splits every torch operator over all the cores
and waits at the end of each for its slowest thread, so a service that takes a core for
a millisecond stalls the whole step; under ``SCHED_IDLE`` a service runs in the gaps the
training threads leave, and any training thread that wakes up takes the core back at
once. The price is lag: a starved PS or embedding worker applies gradients later, which
costs AUC when the training keeps the cores busy (2 NN-worker ranks on 2 cores), so the
Procfiles keep ``normal``; README "Scaling out" has the measurements.

The class applies to every thread of the process, those running now and (inherited) the
ones it starts later, and to the processes it spawns. Embedded mode, where the services'
engines are threads of the NN-worker process, gives the class to those threads alone
(:func:`apply_thread_cpu_priority`), ``background`` by default: there the staleness bound
caps the lag and the step gains (docs/guides/scaling.md).
"""

from __future__ import annotations

import argparse
import logging
import os

from pyrsia.shared.constants import ENV_CPU_PRIORITY
from pyrsia.shared.errors import UsageError
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)

CPU_PRIORITIES = ("normal", "background")


def add_cpu_priority_flag(parser: argparse.ArgumentParser) -> None:
    """``--cpu-priority normal|background`` (default ``$PERSIA_CPU_PRIORITY``, else normal)."""
    parser.add_argument(
        "--cpu-priority",
        choices=CPU_PRIORITIES,
        default=None,
        help="'background' runs this process in Linux's SCHED_IDLE class, so that on a "
        "shared machine it yields the cores to the NN worker's training threads "
        f"(default ${ENV_CPU_PRIORITY}, else normal)",
    )


def resolve_cpu_priority(flag: str | None, settings: Settings, default: str = "normal") -> str:
    """The flag's value, else ``$PERSIA_CPU_PRIORITY`` of ``settings`` (validated), else
    ``default``."""
    if flag is not None:
        return flag
    value = settings.text(ENV_CPU_PRIORITY).strip() or default
    if value not in CPU_PRIORITIES:
        raise UsageError(
            f"{ENV_CPU_PRIORITY} must be one of {', '.join(CPU_PRIORITIES)}, got {value!r}"
        )
    return value


def apply_cpu_priority(priority: str) -> str:
    """Move this process's threads to ``priority``'s class; returns what was applied.

    Call it early in ``main``: threads started afterwards inherit the class.
    """
    if priority not in CPU_PRIORITIES:
        raise UsageError(f"cpu priority must be one of {CPU_PRIORITIES}, got {priority!r}")
    if priority == "normal":
        return "normal"
    if hasattr(os, "SCHED_IDLE"):
        for task in _threads():  # a thread that ended meanwhile is left out
            apply_thread_cpu_priority("background", task)
        applied = "SCHED_IDLE"
    else:  # macOS and other systems without the idle class
        os.nice(19 - os.nice(0))
        applied = "nice 19"
    log.info("cpu priority: background (%s)", applied)
    return applied


def apply_thread_cpu_priority(priority: str, native_id: int = 0) -> str:
    """Move one thread of this process (``threading.Thread.native_id``; 0: the caller) to
    ``priority``'s class, back to the default class for ``normal``; returns what was applied.

    Embedded mode runs its engine threads in the background class beside the training
    thread (pyrsia/services/embedded/job.py). Where the kernel has no idle class, or
    refuses to let the thread back (an unprivileged user whose ``RLIMIT_NICE`` is 0), the
    thread keeps its class and the answer says so.
    """
    if priority not in CPU_PRIORITIES:
        raise UsageError(f"cpu priority must be one of {CPU_PRIORITIES}, got {priority!r}")
    if not hasattr(os, "SCHED_IDLE"):
        return "unchanged (no SCHED_IDLE here)"
    policy, applied = (
        (os.SCHED_IDLE, "SCHED_IDLE") if priority == "background" else (os.SCHED_OTHER, "normal")
    )
    try:
        if os.sched_getscheduler(native_id) != policy:
            os.sched_setscheduler(native_id, policy, os.sched_param(0))
    except (PermissionError, ProcessLookupError) as exc:
        log.debug("thread %d keeps its scheduling class (%s): %s", native_id, priority, exc)
        return "unchanged"
    return applied


def _threads() -> list[int]:
    """Thread ids of this process (just the caller's where /proc is missing)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except FileNotFoundError:
        return [0]
