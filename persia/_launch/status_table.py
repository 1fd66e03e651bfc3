"""What ``persia-launcher status`` shows: the job as one look saw it (:class:`Snapshot` of
:class:`Process` rows) and its rendering as a rich table (:func:`render`), with the
throughput, staleness and detail figures each role's metrics give.

Collecting (registry, ``/health``, ``/metrics``) and the command live in ``status.py``;
this module only reads what was collected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.metrics_text import Samples, sample_sum


@dataclass
class Process:
    """One process of the job as one look saw it."""

    role: str
    index: int
    size: int
    address: str | None = None
    pid: int = 0
    host: str = ""
    health: str = "unknown"  # ready, not ready, unreachable, refused (token), lease (launcher)
    reason: str = ""
    since: float | None = None
    """Start time (epoch seconds): the process's own (metrics), else its lease slot's."""
    samples: Samples = field(default_factory=dict)
    scraped_at: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.role}/{self.index}"

    def value(self, metric: str, **labels: str) -> float | None:
        """Sum of ``metric``'s samples whose labels include ``labels``; None if absent."""
        return sample_sum(self.samples, metric, **labels)


@dataclass
class Snapshot:
    job_id: str
    redis: str
    processes: list[Process]
    taken_at: float


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}" if value >= 10 or value == 0 else f"{value:.1f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _rate(now: Process, before: Process | None, metric: str, **labels: str) -> float | None:
    if before is None or not before.scraped_at or now.scraped_at <= before.scraped_at:
        return None
    a, b = before.value(metric, **labels), now.value(metric, **labels)
    if a is None or b is None or b < a:
        return None
    return (b - a) / (now.scraped_at - before.scraped_at)


def _figures(proc: Process, before: Process | None) -> tuple[str, str, str]:
    """(throughput, staleness, detail) of one process."""
    if proc.role == ROLE_NN_WORKER:
        rate = proc.value("pyrsia_nn_worker_samples_per_second")
        stale = proc.value("pyrsia_nn_worker_gradients_in_flight")
        step, loss = proc.value("pyrsia_nn_worker_steps"), proc.value("pyrsia_nn_worker_loss")
        detail = []
        if step is not None:
            detail.append(f"step {step:.0f}")
        if loss is not None and not math.isnan(loss):
            detail.append(f"loss {loss:.4g}")
        skipped = proc.value("pyrsia_nn_worker_skipped_embedding_updates_total")
        if skipped:
            detail.append(f"{skipped:.0f} skipped")
        throughput = "" if rate is None else f"{_si(rate)} samples/s"
        return throughput, "" if stale is None else f"{stale:.0f}", ", ".join(detail)
    if proc.role == ROLE_EMBEDDING_WORKER:
        rate = _rate(proc, before, "pyrsia_ew_lookup_seconds_count")
        stale = proc.value("pyrsia_ew_staleness")
        pending = proc.value("pyrsia_ew_pending_batches")
        throughput = "" if rate is None else f"{_si(rate)} lookups/s"
        detail = "" if pending is None else f"pending {pending:.0f}"
        return throughput, "" if stale is None else f"{stale:.0f}", detail
    if proc.role == ROLE_EMBEDDING_PS:
        rate = _rate(proc, before, "pyrsia_ps_ids_total")
        entries = proc.value("pyrsia_ps_entries")
        throughput = "" if rate is None else f"{_si(rate)} ids/s"
        return throughput, "", "" if entries is None else f"entries {_si(entries)}"
    return "", "", ""


_HEALTH_STYLE = {
    "ready": "green",
    "not ready": "yellow",
    "unreachable": "red",
    "refused": "red",
    "lease": "cyan",
}


def render(now: Snapshot, before: Snapshot | None = None) -> Table:
    """The job as a rich table (``before``: an earlier snapshot, for the rates)."""
    previous = {p.name: p for p in before.processes} if before is not None else {}
    servers = [p for p in now.processes if p.address]
    ready = sum(p.health == "ready" for p in servers)
    table = Table(
        title=f"job {now.job_id} on {now.redis}: {len(now.processes)} processes, "
        f"{ready}/{len(servers)} servers ready",
        title_justify="left",
    )
    for column in (
        "process",
        "address",
        "pid",
        "health",
        "uptime",
        "memory",
        "throughput",
        "staleness",
        "detail",
    ):
        wraps = column in ("health", "detail")  # the reason and the detail may be long
        table.add_column(column, overflow="fold", no_wrap=not wraps)
    for proc in now.processes:
        throughput, staleness, detail = _figures(proc, previous.get(proc.name))
        health = Text(proc.health, style=_HEALTH_STYLE.get(proc.health, ""))
        if proc.reason:
            health.append(f" ({proc.reason})")
        uptime = None if proc.since is None else now.taken_at - proc.since
        where = proc.address or (f"{proc.host} (launcher)" if proc.host else "(launcher)")
        table.add_row(
            f"{proc.name} of {proc.size}" if proc.size else proc.name,
            where,
            str(proc.pid or ""),
            health,
            _duration(uptime),
            _bytes(proc.value("process_resident_memory_bytes")),
            throughput,
            staleness,
            detail,
        )
    if not now.processes:
        table.caption = "nothing registered: is the job running, with this PERSIA_JOB_ID?"
    return table


def healthy(snap: Snapshot) -> bool:
    servers = [p for p in snap.processes if p.address]
    return bool(servers) and all(p.health == "ready" for p in servers)
