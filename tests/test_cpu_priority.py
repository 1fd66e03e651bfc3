"""``--cpu-priority background`` puts every thread of a service in SCHED_IDLE (one thread alone
in embedded mode); bad values are refused."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pyrsia.shared.constants import (
    ENV_CPU_PRIORITY,
    REGISTRATION_TTL_S,
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
    service_key,
)
from pyrsia.shared.cpu_priority import apply_thread_cpu_priority, resolve_cpu_priority
from pyrsia.shared.errors import UsageError
from pyrsia.shared.settings import Settings
from tests.service_procs import cpu_seconds

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "adult_income" / "config" / "embedding_config.yml"

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")


def thread_policies(pid: int) -> dict[int, int]:
    """Scheduling policy of each thread of ``pid``."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(task)] = os.sched_getscheduler(int(task))
        except ProcessLookupError:
            continue
    return out


def test_background_services_run_every_thread_in_sched_idle(services):
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--cpu-priority", "background"],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,  # registered; ready once a job configures it
    )
    worker = services(
        "pyrsia.services.embedding_worker",
        ["--port", "0", "--embedding-config", str(CONFIG), "--cpu-priority", "background"],
        role=ROLE_EMBEDDING_WORKER,
        wait_ready=False,
    )
    for svc in (ps, worker):
        policies = thread_policies(svc.proc.pid)
        assert len(policies) > 1  # the event loop and its helper threads
        assert set(policies.values()) == {os.SCHED_IDLE}, policies
    assert worker.health()[0] in (200, 503)  # it answers (ready once its PS is configured)


def test_services_default_to_the_normal_class(services):
    ps = services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    assert set(thread_policies(ps.proc.pid).values()) == {os.SCHED_OTHER}


def test_data_loader_script_and_its_children_run_in_the_idle_class(job_env, tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "print('loader', os.sched_getscheduler(0))\n"
        "child = [sys.executable, '-c', 'import os; print(\"child\", os.sched_getscheduler(0))']\n"
        "subprocess.run(child, check=True)\n"
    )
    env = {**os.environ, **job_env, ENV_CPU_PRIORITY: "background"}  # from the environment
    done = subprocess.run(
        [sys.executable, "-m", "persia.launcher", "data-loader", "--exit-when-done", str(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"loader {os.SCHED_IDLE}" in done.stdout
    assert f"child {os.SCHED_IDLE}" in done.stdout


@pytest.mark.parametrize("command", ["embedding-parameter-server", "embedding-worker"])
def test_a_bad_priority_in_the_environment_is_refused_by_name(job_env, command):
    env = {**os.environ, **job_env, ENV_CPU_PRIORITY: "urgent"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.launcher",
            command,
            "--port",
            "0",
            "--embedding-config",
            str(CONFIG),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert ENV_CPU_PRIORITY in done.stderr and "'urgent'" in done.stderr


def test_a_bad_flag_value_is_refused_by_argparse():
    done = subprocess.run(
        [sys.executable, "-m", "persia.launcher", "embedding-worker", "--cpu-priority", "high"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--cpu-priority" in done.stderr and "'high'" in done.stderr


def _env(value: str) -> Settings:
    return Settings.from_env({ENV_CPU_PRIORITY: value})


def test_the_flag_wins_over_the_environment():
    assert resolve_cpu_priority("normal", _env("background")) == "normal"
    assert resolve_cpu_priority(None, _env("background")) == "background"
    assert resolve_cpu_priority(None, _env("")) == "normal"
    with pytest.raises(UsageError, match=ENV_CPU_PRIORITY):
        resolve_cpu_priority(None, _env("low"))


def test_one_thread_moves_to_the_idle_class_and_back_alone():
    release = threading.Event()
    other = threading.Thread(target=release.wait, args=(30,))
    other.start()
    try:
        assert apply_thread_cpu_priority("background", other.native_id) == "SCHED_IDLE"
        assert os.sched_getscheduler(other.native_id) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller keeps its class
        assert apply_thread_cpu_priority("normal", other.native_id) == "normal"
        assert os.sched_getscheduler(other.native_id) == os.SCHED_OTHER
        with pytest.raises(UsageError, match="'idle'"):
            apply_thread_cpu_priority("idle", other.native_id)
    finally:
        release.set()
        other.join()


def test_an_embedded_default_applies_only_without_the_variable():
    assert resolve_cpu_priority(None, Settings.from_env({}), default="background") == "background"
    assert resolve_cpu_priority(None, _env("normal"), default="background") == "normal"


# One busy loop per core that sleeps 1 ms of every 10: the cores are never free for more
# than a millisecond, as under a training step that uses every core between its syncs.
_DUTY_CYCLED_HOG = (
    "import time\n"
    "while True:\n"
    "    end = time.perf_counter() + 0.009\n"
    "    while time.perf_counter() < end: pass\n"
    "    time.sleep(0.001)\n"
)


@pytest.mark.slow
def test_a_background_service_keeps_its_registration_while_training_load_fills_the_cores(
    services, job_env
):
    """SCHED_IDLE runs in the gaps a busy-but-not-spinning load leaves: heartbeats and
    /health go on. (Under loops that never sleep, one per core and more, an idle-class
    process can wait for a core for 30 s and more, longer than the registration's TTL:
    README "Scaling out" says so; that is the kernel's contract for the class.)"""
    import redis

    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--cpu-priority", "background"],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )
    key = service_key(job_env["PERSIA_JOB_ID"], ROLE_EMBEDDING_PS, 0)
    client = redis.Redis.from_url(job_env["PERSIA_REDIS_URL"])
    hogs = [
        subprocess.Popen([sys.executable, "-c", _DUTY_CYCLED_HOG])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        time.sleep(0.5)  # the hogs are running
        load = [cpu_seconds(h.pid) for h in hogs]
        deadline = time.monotonic() + 2.5 * REGISTRATION_TTL_S
        while time.monotonic() < deadline:
            assert client.exists(key), "the registration expired under load"
            assert ps.health()[0] == 503  # answers: registered, not configured yet
            time.sleep(0.5)
        busy = sum(cpu_seconds(h.pid) - c for h, c in zip(hogs, load, strict=True))
        cores = os.cpu_count() or 1
        assert busy >= 0.7 * cores * 2.5 * REGISTRATION_TTL_S, "the load did not fill the cores"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        client.close()
