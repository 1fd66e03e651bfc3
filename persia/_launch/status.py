"""``persia-launcher status``: every process of a running job, seen from the terminal.

::

    persia-launcher status            one look (two scrapes --interval apart, for the rates)
    persia-launcher status --watch    redrawn every --interval seconds until Ctrl-C
    persia-launcher status --no-color plain text (logs, CI, tests)

It reads the registry of ``PERSIA_JOB_ID`` on ``PERSIA_REDIS_URL`` (as every process of the
job does, so it works the same for a job started by honcho, docker compose, Kubernetes or
the launcher): the servers registered there (embedding PS replicas, embedding workers,
NN-worker ranks) and the launcher processes holding a slot of the job lease (the
``nn-worker`` node launchers and data loaders, which serve no HTTP). From each server it
reads ``GET /health`` and ``GET /metrics`` (with ``PERSIA_AUTH_TOKEN`` when set) and shows::

    process                  address     health  uptime  memory  throughput     staleness  detail
    embedding_parameter_server/0 ...     ready   5m02s   812 MiB 41.2k ids/s               entries 1.2M
    embedding_worker/0       ...         ready   5m01s   300 MiB 96 lookups/s   3
    nn_worker/0              ...         ready   4m58s   2.1 GiB 12.3k samples/s 2         step 1520, loss 0.3412

Exit code: 0 when every registered server answers ready, 1 when one does not (or none is
registered), 2 when the registry cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pyrsia.shared.constants import (
    ENV_AUTH_TOKEN,
    REDIS_SOCKET_TIMEOUT_S,
    ROLE_DATA_LOADER,
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
    ROLE_NN_WORKER,
    ROLE_NN_WORKER_NODE,
    lease_key,
)
from pyrsia.shared.constants import STATUS_SCRAPE_TIMEOUT_S as SCRAPE_TIMEOUT_S
from pyrsia.shared.errors import PersiaError
from pyrsia.shared.metrics_text import Samples, auth_headers, fetch_samples, sample_sum
from pyrsia.shared.registry import Registry, RegistrySettings

SERVER_ROLES = (ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER)
"""Registered roles that serve /health and /metrics, in the order shown."""
LAUNCHER_ROLES = (ROLE_NN_WORKER_NODE, ROLE_DATA_LOADER)
"""Roles that only hold a slot of the job lease (no address)."""


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


# --------------------------------------------------------------------------- collecting


async def _scrape(session: aiohttp.ClientSession, proc: Process) -> None:
    url = f"http://{proc.address}"
    try:
        async with session.get(f"{url}/health") as resp:
            if resp.status in (401, 403):
                proc.health = "refused"
                proc.reason = f"{resp.status}: set {ENV_AUTH_TOKEN} to the job's token"
                return
            body = await resp.json(content_type=None)
            proc.health = "ready" if resp.status == 200 and body.get("ready") else "not ready"
            proc.reason = "" if proc.health == "ready" else str(body.get("reason", resp.status))
        samples = await fetch_samples(session, proc.address)
        if samples is not None:
            proc.samples, proc.scraped_at = samples, time.monotonic()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        proc.health, proc.reason = "unreachable", str(exc) or type(exc).__name__
        return
    start = proc.value("process_start_time_seconds")
    if start is not None:
        proc.since = start


async def _lease_slots(settings: RegistrySettings) -> list[Process]:
    """The launcher processes holding a slot of the job lease (pyrsia/shared/job_lease.py)."""
    import json

    client = aioredis.Redis.from_url(
        settings.redis_url, socket_timeout=REDIS_SOCKET_TIMEOUT_S, decode_responses=True
    )
    try:
        fields = await client.hgetall(lease_key(settings.job_id))
    finally:
        await client.aclose()
    found = []
    for name, raw in fields.items():
        parts = name.split(":")
        if len(parts) != 3 or parts[0] != "slot" or parts[1] not in LAUNCHER_ROLES:
            continue
        try:
            holder = json.loads(raw)
            index = int(parts[2])
        except ValueError:
            continue
        size = int(fields.get(f"size:{parts[1]}", 0) or 0)
        since_ms = holder.get("since_ms")
        found.append(Process(
            role=parts[1], index=index, size=size, pid=int(holder.get("pid", 0) or 0),
            host=str(holder.get("host", "")).split("/")[0], health="lease",  # "<host>/pid:[ns]"
            since=since_ms / 1000.0 if isinstance(since_ms, (int, float)) else None,
        ))  # fmt: skip
    return found


async def snapshot(settings: RegistrySettings, timeout_s: float = SCRAPE_TIMEOUT_S) -> Snapshot:
    """Every registered process, with its health and metrics (raises RegistryError)."""
    registry = Registry(settings)
    processes: list[Process] = []
    try:
        await registry.ping()
        for role in SERVER_ROLES:
            for index, rec in sorted((await registry.discover(role)).items()):
                processes.append(Process(role=rec.role, index=index, size=rec.replica_size,
                                         address=rec.address, pid=rec.pid))  # fmt: skip
        try:
            processes += sorted(await _lease_slots(settings), key=lambda p: (p.role, p.index))
        except (RedisError, OSError):
            pass  # the servers are the view; the launcher slots are a bonus
    finally:
        await registry.close()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers()) as session:
        await asyncio.gather(*(_scrape(session, p) for p in processes if p.address))
    return Snapshot(settings.job_id, settings.display_url, processes, time.time())


# --------------------------------------------------------------------------- rendering


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


_HEALTH_STYLE = {"ready": "green", "not ready": "yellow", "unreachable": "red", "refused": "red",
                 "lease": "cyan"}  # fmt: skip


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
    for column in ("process", "address", "pid", "health", "uptime", "memory", "throughput",
                   "staleness", "detail"):  # fmt: skip
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
            f"{proc.name} of {proc.size}" if proc.size else proc.name, where,
            str(proc.pid or ""), health, _duration(uptime),
            _bytes(proc.value("process_resident_memory_bytes")), throughput, staleness, detail,
        )  # fmt: skip
    if not now.processes:
        table.caption = "nothing registered: is the job running, with this PERSIA_JOB_ID?"
    return table


def healthy(snap: Snapshot) -> bool:
    servers = [p for p in snap.processes if p.address]
    return bool(servers) and all(p.health == "ready" for p in servers)


# --------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher status",
        description="Show every process of a running job: registry, /health and /metrics "
        "(PERSIA_REDIS_URL, PERSIA_JOB_ID; PERSIA_AUTH_TOKEN when the job uses one).",
    )
    parser.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between scrapes (rates are measured over it)")  # fmt: skip
    parser.add_argument("--no-color", action="store_true", help="plain text, no colors")
    parser.add_argument("--width", type=int, default=None,
                        help="table width in characters (default: the terminal's; on a pipe or a file, the table's own width: nothing folded)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.interval > 0:
        print("error: --interval: expected a number of seconds > 0", file=sys.stderr)
        return 2
    console = Console(
        no_color=args.no_color, highlight=False, width=args.width,
        force_terminal=False if args.no_color else None,
    )  # fmt: skip
    settings = RegistrySettings.from_env()
    try:
        if args.watch:
            try:
                return asyncio.run(_watch(console, settings, args.interval))
            except KeyboardInterrupt:
                return 0
        before = asyncio.run(snapshot(settings))
        time.sleep(args.interval)
        now = asyncio.run(snapshot(settings))
    except PersiaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = render(now, before)
    if args.width is None and not console.is_terminal:
        console.width = natural_width(table)  # `status | less`, `> status.txt`: not 80 columns
    console.print(table)
    return 0 if healthy(now) else 1


def natural_width(table: Table) -> int:
    """The width ``table`` takes with no column folded (at least 80): what a pipe or a file
    gets, where rich would otherwise squeeze it to 80 columns."""
    wide = Console(width=100_000, no_color=True)
    return max(80, wide.measure(table).maximum)


async def _watch(console: Console, settings: RegistrySettings, interval_s: float) -> int:
    """Redraw until Ctrl-C (exit 0). On a terminal one frame is redrawn in place; on a pipe
    each frame is printed after the last, as it is scraped. Ctrl-C is a loop signal handler,
    not a KeyboardInterrupt, so it ends a watch at once whether it lands in a scrape or a sleep."""
    from rich.live import Live

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    before = None
    try:
        with Live(console=console, auto_refresh=False, screen=False) if console.is_terminal else (
            contextlib.nullcontext()
        ) as live:  # fmt: skip
            while not stop.is_set():
                now = await _unless_stopped(snapshot(settings), stop)
                if now is None:
                    break
                frame = render(now, before)
                if live is not None:
                    live.update(frame, refresh=True)
                else:
                    console.print(frame)
                    console.file.flush()
                before = now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return 0


async def _unless_stopped(work: Awaitable[Snapshot], stop: asyncio.Event) -> Snapshot | None:
    """``work``'s result, or None (``work`` cancelled) once ``stop`` is set first."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


if __name__ == "__main__":
    raise SystemExit(main())
