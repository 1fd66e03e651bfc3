"""``persia-launcher prometheus-targets`` (persia/_launch/prometheus.py): the file_sd targets
file it writes from a real registry, ``--watch`` following the registry and stopping on
SIGTERM, and its one-line refusals (the dashboard and a real Prometheus scraping through the
file: test_prometheus_monitoring.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.registry import Registry, ServiceRecord
from tests.prometheus_helpers import check_file_sd, run_prometheus_targets
from tests.redis_server import free_port
from tests.service_procs import REPO


async def test_targets_of_a_real_registry(services, job_env, registry_settings, tmp_path):
    """A PS and an embedding worker (processes) and an NN rank's record: one file_sd group
    each, labelled job, role, replica_index; stdout and --output give the same JSON."""
    (tmp_path / "emb.yml").write_text("slots_config:\n  a:\n    dim: 4\n")
    ps = services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    ew = services(
        "pyrsia.services.embedding_worker",
        ["--port", "0", "--embedding-config", str(tmp_path / "emb.yml")],
        role=ROLE_EMBEDDING_WORKER,
    )
    registry = Registry(registry_settings)
    rank = f"127.0.0.1:{free_port()}"
    try:
        await registry.register(
            ServiceRecord(role=ROLE_NN_WORKER, replica_index=1, replica_size=2, address=rank, pid=1)
        )
        out = await asyncio.to_thread(run_prometheus_targets, job_env)
        written = await asyncio.to_thread(
            run_prometheus_targets, job_env, "--output", str(tmp_path / "sd" / "pyrsia.json")
        )
    finally:
        await registry.close()
    assert out.returncode == 0 and written.returncode == 0, (out.stderr, written.stderr)
    groups = json.loads(out.stdout)
    check_file_sd(groups)
    assert json.loads((tmp_path / "sd" / "pyrsia.json").read_text()) == groups
    job = job_env["PERSIA_JOB_ID"]
    assert groups == [
        {
            "targets": [ps.address],
            "labels": {"job": job, "role": ROLE_EMBEDDING_PS, "replica_index": "0"},
        },
        {
            "targets": [ew.address],
            "labels": {"job": job, "role": ROLE_EMBEDDING_WORKER, "replica_index": "0"},
        },
        {"targets": [rank], "labels": {"job": job, "role": ROLE_NN_WORKER, "replica_index": "1"}},
    ]


async def test_watch_rewrites_the_file_atomically_and_stops_on_sigterm(
    job_env, registry_settings, tmp_path
):
    """--watch follows the registry (a replica that registers, one that leaves), never leaves
    a temporary file behind, and SIGTERM ends it with exit 0."""
    out = tmp_path / "targets" / "pyrsia.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "persia.launcher",
            "prometheus-targets",
            "--watch",
            "--interval",
            "0.2",
            "--output",
            str(out),
        ],
        cwd=REPO,
        env={**os.environ, **job_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    async def file_becomes(expected: list, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        seen = None
        while time.monotonic() < deadline:
            if out.exists():
                seen = json.loads(out.read_text())  # never half a file: it is renamed in
                if seen == expected:
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"targets file {seen} never became {expected}")

    registry = Registry(registry_settings)
    try:
        await file_becomes([])
        address = f"127.0.0.1:{free_port()}"
        await registry.register(
            ServiceRecord(role=ROLE_EMBEDDING_PS, replica_index=0, replica_size=1, address=address)
        )
        labels = {"job": job_env["PERSIA_JOB_ID"], "role": ROLE_EMBEDDING_PS, "replica_index": "0"}
        await file_becomes([{"targets": [address], "labels": labels}])
        await registry.deregister()
        await file_becomes([])
    finally:
        await registry.close()
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert sorted(p.name for p in out.parent.iterdir()) == ["pyrsia.json"]


def test_refusals_are_one_line_with_exit_2(tmp_path):
    env = {"PERSIA_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "PERSIA_JOB_ID": "x"}
    down = run_prometheus_targets(env)
    assert down.returncode == 2 and "cannot reach Redis" in down.stderr, down.stderr
    assert "Traceback" not in down.stderr
    watch = run_prometheus_targets(env, "--watch")
    assert watch.returncode == 2 and "--output" in watch.stderr, watch.stderr
    bad = run_prometheus_targets(env, "--interval", "0", "--output", str(tmp_path / "t.json"))
    assert bad.returncode == 2 and "--interval" in bad.stderr, bad.stderr
