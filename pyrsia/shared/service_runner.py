"""Run one service replica: serve its app, register it, drain and deregister on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from aiohttp import web

from pyrsia.shared.allocator import keep_freed_memory
from pyrsia.shared.config_schema import MetricsConfig
from pyrsia.shared.constants import ENV_ADVERTISE_HOST, REDIS_STARTUP_WAIT_S
from pyrsia.shared.cpu_priority import apply_cpu_priority
from pyrsia.shared.failure_report import KNOWN_ERRORS, name_this_process, report
from pyrsia.shared.http_server import STATE, install_uvloop, serve
from pyrsia.shared.logging_setup import configure_logging
from pyrsia.shared.metrics_push import MetricsPushSettings, push_settings
from pyrsia.shared.process_exit import exit_now
from pyrsia.shared.registry import Registry, RegistrySettings, ServiceRecord
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)


def advertise_host(bind_host: str, settings: Settings) -> str:
    """The host other services should dial: ``PERSIA_ADVERTISE_HOST`` of ``settings``, else
    the bind host, else (when bound to all interfaces) this machine's host name."""
    explicit = settings.text(ENV_ADVERTISE_HOST)
    if explicit:
        return explicit
    if bind_host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return bind_host


async def run_service(
    app: web.Application,
    *,
    settings: Settings,
    role: str,
    replica_index: int,
    replica_size: int,
    host: str,
    port: int,
    registry: Registry | None = None,
    use_registry: bool = True,
) -> None:
    """Serve ``app`` until SIGTERM, registered as ``role/replica_index`` while it runs.

    ``registry`` (default: one from ``settings``, the process's) is closed when the service
    stops.
    ``use_registry=False`` serves without Redis (inference with ``infer_config.servers``:
    peers are dialled at fixed addresses).
    """
    if not use_registry:
        app[STATE].details.update(role=role, replica_index=replica_index)
        await serve(app, host, port)
        return
    if registry is None:
        registry = Registry(RegistrySettings.from_env(settings))
    await registry.ping(wait_s=REDIS_STARTUP_WAIT_S)

    async def on_started(bound_port: int) -> None:
        record = ServiceRecord(
            role=role,
            replica_index=replica_index,
            replica_size=replica_size,
            address=f"{advertise_host(host, settings)}:{bound_port}",
            pid=os.getpid(),
        )
        await registry.register(record)
        app[STATE].details.update(role=role, replica_index=replica_index, address=record.address)

    try:
        await serve(app, host, port, on_started=on_started)
    finally:
        await registry.close()


def start_process(
    role: str, replica_index: int, cpu_priority: str, metrics: MetricsConfig, settings: Settings
) -> MetricsPushSettings | None:
    """A service process's set-up once its flags and configs are read: log lines named
    after ``role`` and ``replica_index``, its CPU class, freed heap memory kept for reuse
    (``pyrsia/shared/allocator.py``); returns its metrics push settings (None: no push).
    Raises ConfigError naming a push setting that cannot work. ``settings``: the process's."""
    configure_logging(role, replica_index, settings.log_level)
    name_this_process(f"{role}/{replica_index}")
    apply_cpu_priority(cpu_priority)
    pushed = push_settings(metrics, settings)
    log.info("freed heap memory: %s", keep_freed_memory(settings))
    return pushed


def run(main_coro_factory, settings: Settings) -> None:
    """Run a service's async main on uvloop; exit code 0 right after a clean drain.

    Once the service has drained, cleaned up and deregistered, the process leaves with
    ``os._exit(0)``: interpreter finalization (garbage-collecting the numba, aiohttp and
    numpy object graphs) took 1-4 s on a loaded machine, which pushed the whole SIGTERM
    to exit past the 5 s after which honcho sends SIGKILL. Nothing is
    lost: every resource has been released by its cleanup context by then, and the log
    handlers and standard streams are flushed first.

    A known error on the way (an unusable ``PERSIA_REDIS_URL``, Redis down, the port in use)
    is one line on stderr naming this process, and exit code 2, like the flags' errors; the
    traceback goes to the process's log file (``pyrsia/shared/failure_report.py``). Any other
    exception shows its traceback, then that line, and exits 1.
    """
    install_uvloop()
    try:
        asyncio.run(main_coro_factory())
    except KNOWN_ERRORS as exc:
        exit_now(report(exc, settings))
    except Exception as exc:  # a crash: its traceback, then the line (run names it first)
        exit_now(report(exc, settings, user_script=False))
    exit_now(0)
