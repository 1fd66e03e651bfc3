"""Metrics pushed to a Prometheus push gateway, as PERSIA's services did.

The gateway is a real aiohttp server on loopback that records what it is sent (the
requests prometheus-client's ``push_to_gateway`` makes); the services are real processes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import prometheus_client as prom
import pytest
from aiohttp import web

from pyrsia.shared.config_schema import MetricsConfig
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.metrics_push import MetricsPusher, MetricsPushSettings, push_settings
from pyrsia.shared.settings import Settings
from tests.redis_server import free_port
from tests.service_procs import ServiceProc


@dataclass
class Gateway:
    """What the recording gateway received: (method, path, body) in arrival order."""

    port: int
    received: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pushes(self, path_part: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [r for r in self.received if path_part in r[1]]


@contextmanager
def recording_gateway() -> Iterator[Gateway]:
    """A push-gateway stand-in: a real HTTP server answering 200 and keeping every body."""
    gateway = Gateway(free_port())
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def record(request: web.Request) -> web.Response:
        body = (await request.read()).decode()
        with gateway.lock:
            gateway.received.append((request.method, request.path, body))
        return web.Response(status=200)

    def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", gateway.port).start())
        ready.set()
        loop.run_until_complete(stop.wait())
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield gateway
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


GLOBAL_CONFIG = """\
common_config:
  metrics_config:
    enable_metrics: true
    job_name: {job}
    push_interval_seconds: 1
"""


def test_services_push_to_the_gateway_and_still_serve_metrics(redis_server, tmp_path):
    job = f"pushjob_{uuid.uuid4().hex[:6]}"
    (tmp_path / "global.yml").write_text(GLOBAL_CONFIG.format(job=job))
    (tmp_path / "emb.yml").write_text("slots_config:\n  a:\n    dim: 4\n")
    with recording_gateway() as gateway:
        env = {
            "PERSIA_REDIS_URL": redis_server.url,
            "PERSIA_JOB_ID": job,
            "PERSIA_METRICS_GATEWAY_ADDR": gateway.address,
            "PERSIA_GLOBAL_CONFIG": str(tmp_path / "global.yml"),
        }
        ps = ServiceProc.start(
            "pyrsia.services.embedding_ps",
            ["--port", "0"],
            env,
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
            log_dir=tmp_path,
        )
        worker = ServiceProc.start(
            "pyrsia.services.embedding_worker",
            ["--port", "0", "--embedding-config", str(tmp_path / "emb.yml")],
            env,
            role=ROLE_EMBEDDING_WORKER,
            log_dir=tmp_path,
        )
        try:
            ps_path = f"/metrics/job/{job}/replica_index/0/role/{ROLE_EMBEDDING_PS}"
            ew_path = f"/metrics/job/{job}/replica_index/0/role/{ROLE_EMBEDDING_WORKER}"
            # periodic: at least two pushes each within a few intervals
            assert wait_for(lambda: len(gateway.pushes(ps_path)) >= 2, 20), ps.log_text()[-2000:]
            assert wait_for(lambda: len(gateway.pushes(ew_path)) >= 2, 20), worker.log_text()[
                -2000:
            ]
            # /metrics is still served
            with urllib.request.urlopen(f"{ps.url}/metrics", timeout=5) as resp:
                assert b"pyrsia_ps_entries" in resp.read()
            before_stop = len(gateway.pushes(ps_path))
        finally:
            codes = [worker.stop(), ps.stop()]
        assert codes == [0, 0]
        assert len(gateway.pushes(ps_path)) > before_stop  # pushed while shutting down too
        method, _, body = gateway.pushes(ps_path)[-1]
        assert method == "PUT" and "pyrsia_ps_entries" in body
        method, _, body = gateway.pushes(ew_path)[-1]
        assert method == "PUT" and "pyrsia_ew_pending_batches" in body
        assert "metrics push" not in ps.log_text()  # no push failed


def _gateway(address: str | None) -> Settings:
    return Settings.from_env({} if address is None else {"PERSIA_METRICS_GATEWAY_ADDR": address})


def test_gateway_variable_alone_does_not_push(caplog):
    # enable_metrics is false by default (PERSIA's server default): no pushing without it.
    caplog.set_level(logging.INFO, logger="pyrsia.shared.metrics_push")
    assert push_settings(MetricsConfig(), _gateway("127.0.0.1:9091")) is None
    assert "enable_metrics is false" in caplog.text


def test_push_settings_validation():
    enabled = MetricsConfig(enable_metrics=True, job_name="train_job", push_interval_seconds=5)
    assert push_settings(enabled, _gateway(None)) is None  # /metrics only
    assert push_settings(enabled, _gateway("metrics-gateway:9091")) == MetricsPushSettings(
        "http://metrics-gateway:9091", "train_job", 5.0
    )
    for bad in ("metrics-gateway", "ftp://gw:9091", "gw:port"):
        with pytest.raises(ConfigError, match="PERSIA_METRICS_GATEWAY_ADDR"):
            push_settings(enabled, _gateway(bad))
    gateway = _gateway("gw:9091")
    with pytest.raises(ConfigError, match="job_name"):
        push_settings(MetricsConfig(enable_metrics=True, job_name="a/b"), gateway)
    with pytest.raises(ConfigError, match="push_interval_seconds"):
        push_settings(MetricsConfig(enable_metrics=True, push_interval_seconds=0), gateway)


def test_unreachable_gateway_warns_once_and_recovers(caplog):
    registry = prom.CollectorRegistry()
    prom.Counter("pyrsia_test_total", "a counter", registry=registry).inc(3)
    port = free_port()  # nothing listens here yet
    pusher = MetricsPusher(
        registry,
        MetricsPushSettings(f"http://127.0.0.1:{port}", "j", 1.0),
        {"role": "r", "replica_index": "0"},
    )
    caplog.set_level(logging.INFO, logger="pyrsia.shared.metrics_push")
    assert pusher.push_now() is False and pusher.push_now() is False
    assert caplog.text.count("metrics push to") == 1
    with recording_gateway() as gateway:
        pusher.settings = MetricsPushSettings(f"http://{gateway.address}", "j", 1.0)
        assert pusher.push_now() is True
        ((_, path, body),) = gateway.received
    assert path == "/metrics/job/j/replica_index/0/role/r"
    assert "pyrsia_test_total 3.0" in body
    assert "works again" in caplog.text


def test_sigterm_exits_in_time_while_the_gateway_hangs(redis_server, tmp_path):
    """A gateway that takes connections and never answers: pushes hang until their timeout,
    and SIGTERM still ends the PS with 0 within ServiceProc's 5 s (else it would be -9)."""
    job = f"hangjob_{uuid.uuid4().hex[:6]}"
    (tmp_path / "global.yml").write_text(GLOBAL_CONFIG.format(job=job))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # never accepted: the kernel completes connects, nobody answers
        env = {
            "PERSIA_REDIS_URL": redis_server.url,
            "PERSIA_JOB_ID": job,
            "PERSIA_METRICS_GATEWAY_ADDR": f"127.0.0.1:{silent.getsockname()[1]}",
            "PERSIA_GLOBAL_CONFIG": str(tmp_path / "global.yml"),
        }
        ps = ServiceProc.start(
            "pyrsia.services.embedding_ps",
            ["--port", "0"],
            env,
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
            log_dir=tmp_path,
        )
        try:
            time.sleep(1.5)  # a periodic push is hanging on the gateway now
        finally:
            started = time.monotonic()
            code = ps.stop()
        assert code == 0, ps.log_text()[-2000:]
        assert time.monotonic() - started < 5.0
