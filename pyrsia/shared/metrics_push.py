"""Push a service's metrics to a Prometheus push gateway, as PERSIA's services did.

PERSIA's servers pushed their metrics every ``push_interval_seconds`` to the gateway
named by ``PERSIA_METRICS_GATEWAY_ADDR`` (``host:port``), under ``job_name``, when
``common_config.metrics_config.enable_metrics`` was true. Pyrsia does the same with
prometheus-client's ``push_to_gateway`` (an HTTP PUT of the text exposition format to
``/metrics/job/<job_name>/replica_index/<i>/role/<role>``), in addition to serving
``GET /metrics``. Pushing is off unless both the flag and the variable are set.

The push runs in a worker thread (prometheus-client's HTTP call blocks), never on the
event loop. A gateway that is down costs one warning per failure streak and the service
keeps serving; a last, short push on shutdown records the final counters.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import prometheus_client as prom
from aiohttp import web

from pyrsia.shared.config_schema import MetricsConfig
from pyrsia.shared.constants import (
    ENV_METRICS_GATEWAY_ADDR,
    METRICS_FINAL_PUSH_TIMEOUT_S,
    METRICS_PUSH_TIMEOUT_S,
)
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.http_server import METRICS
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)

_JOB_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:")


@dataclass(frozen=True)
class MetricsPushSettings:
    """Where and how often to push; built by :func:`push_settings`."""

    gateway: str
    job_name: str
    interval_s: float


def _check_gateway(raw: str) -> str:
    """``host:port`` or ``http(s)://host:port``; anything else is a ConfigError."""
    url = raw if "://" in raw else f"http://{raw}"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(
            f"environment variable {ENV_METRICS_GATEWAY_ADDR}: expected host:port of a "
            f"Prometheus push gateway (e.g. metrics-gateway:9091), got {raw!r}"
        )
    return url


def push_settings(config: MetricsConfig, settings: Settings) -> MetricsPushSettings | None:
    """Push settings from the global config and ``PERSIA_METRICS_GATEWAY_ADDR`` of
    ``settings``, or None.

    Raises ConfigError naming the variable or key when a value cannot work.
    """
    raw = settings.text(ENV_METRICS_GATEWAY_ADDR).strip()
    if not config.enable_metrics:
        if raw:
            log.info(
                "%s is set but metrics_config.enable_metrics is false: not pushing metrics",
                ENV_METRICS_GATEWAY_ADDR,
            )
        return None
    if not raw:
        log.info(
            "enable_metrics: serving GET /metrics; set %s=host:port to push to a gateway too",
            ENV_METRICS_GATEWAY_ADDR,
        )
        return None
    if not config.job_name or not set(config.job_name) <= _JOB_NAME_CHARS:
        raise ConfigError(
            "global_config.yml: common_config.metrics_config.job_name: expected letters, "
            f"digits, '_', '-', '.' or ':', got {config.job_name!r}"
        )
    if config.push_interval_seconds < 1:
        raise ConfigError(
            "global_config.yml: common_config.metrics_config.push_interval_seconds: "
            f"expected an integer >= 1, got {config.push_interval_seconds}"
        )
    return MetricsPushSettings(
        gateway=_check_gateway(raw),
        job_name=config.job_name,
        interval_s=float(config.push_interval_seconds),
    )


class MetricsPusher:
    """Pushes one registry under one grouping key, periodically and once more at the end."""

    def __init__(
        self,
        registry: prom.CollectorRegistry,
        settings: MetricsPushSettings,
        grouping_key: dict[str, str],
    ):
        self.registry = registry
        self.settings = settings
        self.grouping_key = dict(grouping_key)
        self.pushes = 0
        self._failing = False

    def push_now(self, timeout_s: float = METRICS_PUSH_TIMEOUT_S) -> bool:
        """One blocking push; False (and one warning per failure streak) when it fails."""
        try:
            prom.push_to_gateway(
                self.settings.gateway,
                job=self.settings.job_name,
                registry=self.registry,
                grouping_key=self.grouping_key,
                timeout=timeout_s,
            )
        except OSError as exc:  # URLError, connection refused, HTTP errors, timeouts
            if not self._failing:
                log.warning("metrics push to %s failed: %s", self.settings.gateway, exc)
            self._failing = True
            return False
        if self._failing:
            log.info("metrics push to %s works again", self.settings.gateway)
        self._failing = False
        self.pushes += 1
        return True

    async def run(self, executor: concurrent.futures.Executor | None = None) -> None:
        """Push every ``interval_s`` until cancelled (blocking pushes run on ``executor``)."""
        loop = asyncio.get_running_loop()
        while True:
            await loop.run_in_executor(executor, self.push_now)
            await asyncio.sleep(self.settings.interval_s)


def install_metrics_push(
    app: web.Application, settings: MetricsPushSettings | None, *, role: str, replica_index: int
) -> MetricsPusher | None:
    """Push ``app``'s metrics registry while the app runs (nothing when ``settings`` is None)."""
    if settings is None:
        return None
    pusher = MetricsPusher(
        app[METRICS], settings, {"role": role, "replica_index": str(replica_index)}
    )

    async def pushing(_app: web.Application):
        # Its own thread, not the loop's default executor: asyncio.run joins that one at
        # exit, so a push stuck on a slow gateway would hold the SIGTERM exit for its timeout.
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics-push")
        task = asyncio.create_task(pusher.run(executor))
        log.info(
            "pushing metrics to %s every %gs as job %r",
            settings.gateway,
            settings.interval_s,
            settings.job_name,
        )
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        # the final counters, briefly: SIGTERM must still end the service within its budget
        loop = asyncio.get_running_loop()
        final = loop.run_in_executor(executor, pusher.push_now, METRICS_FINAL_PUSH_TIMEOUT_S)
        executor.shutdown(wait=False)
        try:  # behind a periodic push still in flight: bounded, never past the budget
            await asyncio.wait_for(final, METRICS_FINAL_PUSH_TIMEOUT_S)
        except TimeoutError:
            log.warning("final metrics push to %s did not finish in time", settings.gateway)

    app.cleanup_ctx.append(pushing)
    return pusher
