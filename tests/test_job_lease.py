"""One running job per PERSIA_JOB_ID: the job lease (pyrsia/shared/job_lease.py).

A second job started with a live job id refuses to start (exit 2, one line naming the
running job's holder and how to pick another id), whichever process of it comes first;
the processes of one job, a crashed process's restart and a clean restart still get in.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_lib

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, lease_key, service_key
from pyrsia.shared.job_lease import Holder, JobConflictError, JobLease
from pyrsia.shared.registry import Registry
from tests.redis_server import free_port
from tests.service_procs import REPO

PS = "pyrsia.services.embedding_ps"


def _second(
    module_args: list[str], env: dict[str, str], timeout_s: float = 90
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *module_args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    line = proc.stderr.strip().splitlines()[-1]
    # a service names itself (error: embedding_parameter_server/0: job ...), a launcher not
    assert re.match(r"error: (\w+/\d+: )?job '", line) and "already running" in line, proc.stderr[
        -3000:
    ]
    for needle in ("PERSIA_JOB_ID", *needles):
        assert needle in line, (needle, line)
    return line


def _record_pid(env: dict[str, str], role: str, index: int) -> int:
    client = redis_lib.Redis.from_url(env["PERSIA_REDIS_URL"], decode_responses=True)
    try:
        return json.loads(client.get(service_key(env["PERSIA_JOB_ID"], role, index)))["pid"]
    finally:
        client.close()


def test_second_ps_with_a_live_job_id_is_refused_naming_the_holder(services, job_env):
    first = services(PS, ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False)
    started = time.monotonic()
    line = _assert_refused(
        _second([PS, "--port", "0"], job_env),
        f"pid {first.proc.pid}",
        f"{ROLE_EMBEDDING_PS}/0",
        "since ",
    )
    assert time.monotonic() - started < 30, "a live holder on this host is known at once"
    time.sleep(2)  # two heartbeats: the first job's record was never overwritten
    assert _record_pid(job_env, ROLE_EMBEDDING_PS, 0) == first.proc.pid, line


def test_second_job_of_another_shape_is_refused(services, job_env):
    services(PS, ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False)
    proc = _second([PS, "--port", "0", "--replica-index", "1", "--replica-size", "2"], job_env)
    _assert_refused(proc, "replica 1 of 2")


def test_kill9_then_restart_takes_the_slot_without_waiting(services, job_env):
    first = services(PS, ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False)
    first.kill()
    started = time.monotonic()
    again = services(PS, ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False)
    deadline = time.monotonic() + 30
    while _record_pid(job_env, ROLE_EMBEDDING_PS, 0) != again.proc.pid:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert again.proc.poll() is None, again.log_text()[-2000:]
    assert "is gone; taking its slot" in again.log_text()
    print(f"restart after kill -9 registered in {time.monotonic() - started:.2f}s")


def test_clean_stop_frees_the_id_even_for_another_shape(services, job_env):
    first = services(PS, ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False)
    assert first.stop() == 0
    for i in range(2):
        services(
            PS,
            ["--port", "0", "--replica-index", str(i), "--replica-size", "2"],
            role=ROLE_EMBEDDING_PS,
            replica_index=i,
            wait_ready=False,
        )


WAIT_SCRIPT = """
import sys, time
from pathlib import Path
Path(sys.argv[1], "started-" + sys.argv[2]).touch()
while not Path(sys.argv[1], "stop").exists():
    time.sleep(0.05)
"""


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


@pytest.mark.parametrize("launcher", ["data-loader", "nn-worker"])
def test_second_launcher_with_a_live_job_id_is_refused(launcher, job_env, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(WAIT_SCRIPT)

    def command(name: str) -> list[str]:
        if launcher == "data-loader":
            return [
                "persia.launcher",
                launcher,
                "--exit-when-done",
                str(script),
                str(tmp_path),
                name,
            ]
        return [
            "persia.launcher",
            launcher,
            str(script),
            "--master-port",
            str(free_port()),
            "--",
            str(tmp_path),
            name,
        ]

    env = {**os.environ, **job_env}
    log = tmp_path / "first.log"
    with open(log, "wb") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", *command("first")],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(tmp_path / "started-first", first, log)
        second = _second(command("second"), job_env)
        _assert_refused(second, f"pid {first.pid}")
        assert not (tmp_path / "started-second").exists(), "the second job's script ran"
    finally:
        (tmp_path / "stop").touch()
        code = first.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    client = redis_lib.Redis.from_url(job_env["PERSIA_REDIS_URL"])
    try:
        assert not client.exists(lease_key(job_env["PERSIA_JOB_ID"])), "the last one out frees it"
    finally:
        client.close()


# --- the rule for holders on other hosts, with leases driven directly --------------------------
def _other_host(lease: JobLease, pid: int = 4242) -> JobLease:
    lease.holder = Holder("elsewhere", "elsewhere/pid:[1]", pid, 99)
    return lease


async def test_holder_on_another_host_is_waited_for_and_replaced_once_silent(registry_settings):
    registry = Registry(registry_settings, ttl_s=1.0)
    other = Registry(registry_settings, ttl_s=1.0)
    try:
        await _other_host(other.lease).claim("embedding_worker", 0, 1)  # then never refreshed
        started = time.monotonic()
        await registry.lease.claim("embedding_worker", 0, 1)
        waited = time.monotonic() - started
        assert 0.5 < waited < 3.0, waited
    finally:
        await registry.close()
        await other.close()


async def test_holder_on_another_host_that_keeps_refreshing_is_refused(registry_settings):
    registry = Registry(registry_settings, ttl_s=1.0)
    other = Registry(registry_settings, ttl_s=1.0)
    stop = asyncio.Event()

    async def keep_alive() -> None:
        while not stop.is_set():
            await other.lease.refresh("embedding_worker", 0)
            await asyncio.sleep(0.2)

    try:
        await _other_host(other.lease).claim("embedding_worker", 0, 1)
        task = asyncio.create_task(keep_alive())
        with pytest.raises(JobConflictError, match="pid 4242 on elsewhere"):
            await registry.lease.claim("embedding_worker", 0, 1)
        stop.set()
        await task
    finally:
        await registry.close()
        await other.close()


async def test_lease_is_made_again_after_redis_lost_it(registry_settings):
    registry = Registry(registry_settings)
    try:
        await registry.lease.claim("embedding_worker", 0, 1)
        instance = registry.lease.instance
        client = registry._redis
        await client.delete(lease_key(registry_settings.job_id))  # as a restarted empty Redis
        assert await registry.lease.refresh("embedding_worker", 0)
        assert await client.hget(lease_key(registry_settings.job_id), "instance") == instance
    finally:
        await registry.close()


@pytest.mark.timeout(60)
def test_no_warning_when_redis_stopped_first_and_the_lease_just_expires(caplog):
    """A Procfile's shutdown stops Redis beside the launchers: giving the slot back finds it
    gone, the TTL ends the slot, and nothing is worth a warning (the log says so at debug)."""
    import logging

    from pyrsia.shared.registry import RegistrySettings
    from pyrsia.shared.slot_keeper import SlotKeeper
    from tests.redis_server import RedisServer

    server = RedisServer().start()
    keeper = SlotKeeper("data_loader", 0, 1, RegistrySettings(redis_url=server.url, job_id="gone"))
    keeper.start()
    server.stop()
    with caplog.at_level(logging.DEBUG, logger="pyrsia.shared.slot_keeper"):
        keeper.stop()
    records = [r for r in caplog.records if "give back the job lease" in r.getMessage()]
    assert [r.levelname for r in records] == ["DEBUG"], caplog.text
