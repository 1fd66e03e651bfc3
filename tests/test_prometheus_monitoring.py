"""Prometheus and Grafana as shipped in ``monitoring/``: the dashboard's PromQL against the
metrics the code defines, the compose ``monitoring`` profile,
and a real Prometheus (Debian's ``prometheus`` package) scraping a real job (PS, embedding
worker, and an NN-worker rank training from a stream) through that file, every dashboard
expression evaluated over its HTTP API. The targets file itself, ``persia-launcher
prometheus-targets`` (persia/_launch/prometheus.py) against a real registry:
test_prometheus_targets.py."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.registry import Registry, RegistrySettings
from tests.prometheus_helpers import check_file_sd, run_prometheus_targets
from tests.redis_server import free_port
from tests.service_procs import REPO

MONITORING = REPO / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "pyrsia.json"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
PROCESS_METRICS = {  # prometheus_client's ProcessCollector, on every server (pyrsia/shared/http_server.py)
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
}
NN_RANK_METRICS_PREFIX = "pyrsia_nn_worker_"


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def defined_metric_names() -> set[str]:
    """Every series name the code can expose: docs/gen_reference.py's list (the ``_total`` of
    counters included), a histogram's ``_bucket``/``_sum``/``_count``, the process metrics."""
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(REPO / "docs"))
    names = set(PROCESS_METRICS)
    for name, kind, *_ in gen_reference.metric_definitions():
        names.add(name)
        if kind == "histogram":
            names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    # collected at scrape time by pyrsia/shared/http_server.py's _CountsCollector (no prom.Counter call)
    names.update({"pyrsia_requests_refused_total", "pyrsia_request_bodies_aborted_total"})
    return names


def concrete(expr: str, job: str, rate_interval: str = "10s") -> str:
    """The expression as Grafana sends it for one job."""
    return expr.replace("$__rate_interval", rate_interval).replace("$job", re.escape(job))


# --------------------------------------------------------------------------- fast checks


def test_dashboard_expressions_use_only_metrics_the_code_defines():
    """Every panel's PromQL selects, for the dashboard's job, series the code exposes; the
    NN-rank panels' metrics are the ones pyrsia/services/nn_worker/rank_stats.py registers."""
    defined = defined_metric_names()
    exprs = dashboard_expressions()
    titles = {title for title, _ in exprs}
    for wanted in (
        "Samples/s per NN-worker rank",
        "Training loss",
        "PS entries",
        "Staleness: gradients in flight",
        "Request bytes held",
        "Process memory (resident)",
    ):
        assert wanted in titles, titles
    for title, expr in exprs:
        selectors = SELECTOR.findall(expr)
        assert selectors, f"{title}: no metric selector in {expr}"
        # a bare metric name (no {...}) would escape the job filter: every name has braces
        bare = set(re.findall(r"\b((?:pyrsia|process)_[a-z0-9_]+)\b(?!\{)", expr))
        assert not bare, f"{title}: {bare} without a job matcher in {expr}"
        for name, matchers in selectors:
            assert name in defined, f"{title}: {name} is not a metric the code defines"
            assert 'job=~"$job"' in matchers, f"{title}: {name} not filtered by $job"
    ranks = {n for _, e in exprs for n, _ in SELECTOR.findall(e) if n.startswith("pyrsia_nn_")}
    assert ranks >= {
        "pyrsia_nn_worker_samples_per_second",
        "pyrsia_nn_worker_loss",
        "pyrsia_nn_worker_step_phase_seconds_total",
        "pyrsia_nn_worker_gradients_in_flight",
    }, ranks


def test_grafana_and_prometheus_files_fit_together():
    """The dashboard names the provisioned data source; Prometheus reads the targets where the
    compose profile's prometheus-targets writes them; the profile holds only monitoring."""
    dash = json.loads(DASHBOARD.read_text())
    source = yaml.safe_load(
        (MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    uids = {p["datasource"]["uid"] for p in dash["panels"]}
    uids |= {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}
    provider = yaml.safe_load(
        (MONITORING / "grafana/provisioning/dashboards/pyrsia.yml").read_text()
    )["providers"][0]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    monitoring = {n for n, s in services.items() if "monitoring" in s.get("profiles", [])}
    assert monitoring == {"prometheus_targets", "prometheus", "grafana"}
    grafana_mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in services["grafana"]["volumes"])
    assert grafana_mounts["./monitoring/grafana/dashboards"] == provider["options"]["path"]
    assert grafana_mounts["./monitoring/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert source["url"] == "http://prometheus:9090"
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    (scrape,) = config["scrape_configs"]
    (pattern,) = scrape["file_sd_configs"][0]["files"]
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    assert mounts["./monitoring/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    targets_dir = mounts["prometheus_targets"]
    assert Path(pattern).parent.as_posix() == targets_dir and pattern.endswith("*.json")
    sidecar = services["prometheus_targets"]
    writer_dir = dict(v.split(":")[:2] for v in sidecar["volumes"])["prometheus_targets"]
    argv = sidecar["command"].split()
    from persia._launch.prometheus import build_parser

    args = build_parser().parse_args(argv[1:])
    assert argv[0] == "prometheus-targets" and args.watch
    assert Path(args.output).parent.as_posix() == writer_dir and args.output.endswith(".json")
    if shutil.which("promtool"):
        check = subprocess.run(
            ["promtool", "check", "config", "--syntax-only", str(PROMETHEUS_YML)],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stdout + check.stderr


# --------------------------------------------------------------------------- a real Prometheus


class Prometheus:
    """Debian's ``prometheus`` binary on a free loopback port, with monitoring/prometheus.yml
    scraping every second from ``targets_dir``."""

    def __init__(self, workdir: Path, targets_dir: Path):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip(
                "no prometheus binary: install Debian's package (apt-get install "
                "prometheus; .ci/run does)"
            )
        config = yaml.safe_load(PROMETHEUS_YML.read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["scrape_configs"][0]["scrape_timeout"] = "1s"
        config["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(targets_dir / "*.json")]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self._log_file = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.skip(
                    f"prometheus exited {self.proc.returncode} at start: "
                    f"{self.log.read_text()[-800:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        pytest.skip(f"prometheus not ready in {timeout_s} s: {self.log.read_text()[-800:]}")

    def query(self, expr: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


def _finite(result: list[dict]) -> bool:
    return any(float(r["value"][1]) == float(r["value"][1]) for r in result)  # not NaN


def test_a_real_prometheus_scrapes_a_job_and_every_panel_has_data(redis_server, tmp_path):
    """PS + embedding worker (processes) and an NN rank training from a stream in this process
    (its ingress registered as nn_worker/0): the targets file the command writes, a real
    Prometheus scraping through it, and every dashboard expression returning a finite value
    for the job while batches flow."""
    from persia import env as persia_env
    from tests.nn_helpers import environ, job_services

    job = f"prom_{uuid.uuid4().hex[:6]}"
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": job}
    targets = tmp_path / "targets"
    stop_feeding = threading.Event()
    errors: list[BaseException] = []
    prometheus = None
    with (
        environ(
            **env,
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            PERSIA_TENSORBOARD_DIR=None,
            PERSIA_METRICS_GATEWAY_ADDR=None,
        ),
        job_services(env, tmp_path / "svc"),
    ):
        persia_env.reload_env()
        trainer = threading.Thread(target=_catching(_train_from_the_stream, errors))
        feeder = threading.Thread(
            target=_catching(lambda: asyncio.run(_feed_the_job(env, stop_feeding)), errors)
        )
        trainer.start()
        feeder.start()
        try:
            asyncio.run(_wait_registered(env, ROLE_NN_WORKER))
            _write_targets(env, targets)
            prometheus = Prometheus(tmp_path, targets)
            prometheus.wait_ready()
            missing = _until_every_panel_has_data(prometheus, job, timeout_s=40)
            up = prometheus.query(f'up{{job="{job}"}}')
        finally:
            stop_feeding.set()
            feeder.join(60)
            trainer.join(60)
            if prometheus is not None:
                prometheus.stop()
            persia_env.reload_env()
    assert not errors, errors
    assert not missing, f"panels without data after 40 s: {missing}"
    assert sorted(
        (r["metric"]["role"], r["metric"]["replica_index"], r["value"][1]) for r in up
    ) == sorted(
        [
            (ROLE_EMBEDDING_PS, "0", "1"),
            (ROLE_EMBEDDING_WORKER, "0", "1"),
            (ROLE_NN_WORKER, "0", "1"),
        ]
    )


def _write_targets(env: dict[str, str], targets) -> None:
    """``persia-launcher prometheus-targets`` writes the job's file_sd JSON into ``targets``:
    one group per server role."""
    made = run_prometheus_targets(env, "--output", str(targets / "pyrsia.json"))
    assert made.returncode == 0, made.stderr
    groups = json.loads((targets / "pyrsia.json").read_text())
    check_file_sd(groups)
    roles = sorted(g["labels"]["role"] for g in groups)
    assert roles == sorted([ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER])


async def _feed_the_job(env: dict[str, str], stop_feeding: threading.Event) -> None:
    """Send batches (ids to the embedding worker, dense parts to rank 0's ingress) every
    50 ms until ``stop_feeding`` is set or 2000 are sent, then tell rank 0 the stream is done."""
    from pyrsia.shared.http_client import HttpClient
    from tests.nn_helpers import make_batch

    registry, client = Registry(RegistrySettings(**_settings(env))), HttpClient()
    sent = 0
    try:
        worker = (await registry.wait_for(ROLE_EMBEDDING_WORKER, timeout_s=30))[0]
        rank0 = (await registry.wait_for(ROLE_NN_WORKER, timeout_s=30))[0]
        while not stop_feeding.is_set() and sent < 2000:
            batch = make_batch([3 * sent + 1, 3 * sent + 2, 3 * sent + 3], seed=sent)
            await client.call(
                f"{worker.url}/batch",
                {"loader": 0, "batch_id": sent, "batch": batch.id_part().to_wire()},
            )
            await client.call(
                f"{rank0.url}/ingress",
                {"loader": 0, "batch_id": sent, "worker": 0, "dense": batch.dense_part().to_wire()},
                until=1e12,
            )
            sent += 1
            await asyncio.sleep(0.05)
        await client.call(f"{rank0.url}/done", {"loader": 0, "loader_count": 1, "sent": sent})
    finally:
        await client.close()
        await registry.close()


def _train_from_the_stream() -> None:
    """Rank 0 (this process) trains a SmallModel on what its ingress receives, one log a step."""
    from persia.ctx import TrainCtx
    from persia.data import DataLoader, StreamingDataset
    from persia.embedding.optim import SGD
    from tests.nn_helpers import SmallModel

    model = SmallModel()
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        log_every_n_steps=1,
    ) as ctx:
        for batch in DataLoader(StreamingDataset(buffer_size=2), timeout_ms=90000):
            output, labels = ctx.forward(batch)
            ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))


def _settings(env: dict[str, str]) -> dict[str, str]:
    return {"redis_url": env["PERSIA_REDIS_URL"], "job_id": env["PERSIA_JOB_ID"]}


async def _wait_registered(env: dict[str, str], role: str) -> None:
    registry = Registry(RegistrySettings(**_settings(env)))
    try:
        await registry.wait_for(role, timeout_s=30)
    finally:
        await registry.close()


def _until_every_panel_has_data(prometheus: Prometheus, job: str, timeout_s: float) -> list:
    """The (panel, expression) pairs still without a finite value at ``timeout_s``."""
    pending = dashboard_expressions()
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = [(t, e) for t, e in pending if not _finite(prometheus.query(concrete(e, job)))]
        if pending:
            time.sleep(0.5)
    return pending


def _catching(fn, errors: list[BaseException]):
    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    return run
