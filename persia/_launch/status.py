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
import signal
import sys
import time
from collections.abc import Awaitable

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from rich.console import Console
from rich.table import Table

from persia._launch.status_table import Process, Snapshot, healthy, render
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
from pyrsia.shared.metrics_text import auth_headers, fetch_samples
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.settings import current

SERVER_ROLES = (ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER)
"""Registered roles that serve /health and /metrics, in the order shown."""
LAUNCHER_ROLES = (ROLE_NN_WORKER_NODE, ROLE_DATA_LOADER)
"""Roles that only hold a slot of the job lease (no address)."""


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
        found.append(
            Process(
                role=parts[1],
                index=index,
                size=size,
                pid=int(holder.get("pid", 0) or 0),
                host=str(holder.get("host", "")).split("/")[0],
                health="lease",  # "<host>/pid:[ns]"
                since=since_ms / 1000.0 if isinstance(since_ms, (int, float)) else None,
            )
        )
    return found


async def snapshot(settings: RegistrySettings, timeout_s: float = SCRAPE_TIMEOUT_S) -> Snapshot:
    """Every registered process, with its health and metrics (raises RegistryError)."""
    registry = Registry(settings)
    processes: list[Process] = []
    try:
        await registry.ping()
        for role in SERVER_ROLES:
            for index, rec in sorted((await registry.discover(role)).items()):
                processes.append(
                    Process(
                        role=rec.role,
                        index=index,
                        size=rec.replica_size,
                        address=rec.address,
                        pid=rec.pid,
                    )
                )
        try:
            processes += sorted(await _lease_slots(settings), key=lambda p: (p.role, p.index))
        except (RedisError, OSError):
            pass  # the servers are the view; the launcher slots are a bonus
    finally:
        await registry.close()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        timeout=timeout, headers=auth_headers(settings.environment)
    ) as session:
        await asyncio.gather(*(_scrape(session, p) for p in processes if p.address))
    return Snapshot(settings.job_id, settings.display_url, processes, time.time())


# --------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher status",
        description="Show every process of a running job: registry, /health and /metrics "
        "(PERSIA_REDIS_URL, PERSIA_JOB_ID; PERSIA_AUTH_TOKEN when the job uses one).",
    )
    parser.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between scrapes (rates are measured over it)",
    )
    parser.add_argument("--no-color", action="store_true", help="plain text, no colors")
    parser.add_argument(
        "--width",
        type=int,
        default=None,
        help="table width in characters (default: the terminal's; on a pipe or a file, the table's own width: nothing folded)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.interval > 0:
        print("error: --interval: expected a number of seconds > 0", file=sys.stderr)
        return 2
    console = Console(
        no_color=args.no_color,
        highlight=False,
        width=args.width,
        force_terminal=False if args.no_color else None,
    )
    settings = RegistrySettings.from_env(current())  # an entry point
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
        with (
            Live(console=console, auto_refresh=False, screen=False)
            if console.is_terminal
            else (contextlib.nullcontext()) as live
        ):
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
