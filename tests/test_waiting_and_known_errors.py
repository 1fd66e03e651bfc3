"""A waiting process says what it waits for; a known error ends it with one line.

Real processes on a real Redis: an NN worker started with no other service of its job, and
data loaders pointed at a Redis that is not there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.redis_server import RedisServer, free_port

REPO = Path(__file__).resolve().parent.parent
ADULT = REPO / "examples" / "adult_income"
LAUNCHER = [sys.executable, "-m", "persia.launcher"]
LOADER = "from persia.ctx import DataCtx\nwith DataCtx() as ctx:\n    pass\n"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSIA_", "LOG_LEVEL"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture
def redis():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.mark.timeout(180)
def test_nn_worker_without_services_says_what_it_waits_for_then_one_line(redis):
    env = _env(
        PERSIA_REDIS_URL=redis.url,
        PERSIA_JOB_ID=f"wait-{uuid.uuid4().hex[:8]}",
        PERSIA_WAIT_TIMEOUT_S="12",
        PERSIA_EMBEDDING_CONFIG=str(ADULT / "config" / "embedding_config.yml"),
        MASTER_PORT=str(free_port()),
    )
    proc = subprocess.Popen(
        [*LAUNCHER, "nn-worker", str(ADULT / "train.py")],
        env=env,
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[tuple[float, str]] = []
    with proc.stdout:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
    code = proc.wait(timeout=60)
    out = "\n".join(text for _, text in lines)
    waits = [(t, text) for t, text in lines if "waiting for embedding_worker" in text]
    assert waits, out
    assert re.search(
        r"\[nn_worker/0\] pyrsia\.shared\.registry: waiting for embedding_worker: none "
        r"registered yet, [5-9] s",
        waits[0][1],
    ), out
    assert len(waits) >= 2 and waits[1][0] - waits[0][0] < 7, out  # every ~5 s, not once
    errors = [text for _, text in lines if text.startswith("error:")]
    assert code == 2, out
    assert len(errors) == 1, out
    assert "timed out after 12s waiting for embedding_worker" in errors[0]
    assert "persia-launcher embedding-worker" in errors[0]  # what to do
    assert "Traceback" not in out
    assert "exitcode" not in out  # torch's own report of the failed rank is left out


def _run_loader(tmp_path: Path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    return subprocess.run(
        [*LAUNCHER, "data-loader", "--exit-when-done", *flags, str(script)],
        env=_env(PERSIA_JOB_ID=f"wrong-{uuid.uuid4().hex[:8]}", **env),
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
    )


@pytest.mark.timeout(150)
def test_a_wrong_redis_url_is_one_line(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    proc = _run_loader(tmp_path, PERSIA_REDIS_URL=url, PERSIA_WAIT_TIMEOUT_S="6")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"error: data_loader/0: cannot reach Redis at {url}")
    assert "point PERSIA_REDIS_URL at one every process can reach" in errors[0]  # the fix
    assert "Traceback" not in proc.stderr
    # the launcher waited for Redis before it went on without a job lease, and said so
    assert re.search(r"waiting for Redis at redis://127\.0\.0\.1:\d+/0: 5 s of 6", proc.stderr)


@pytest.mark.timeout(150)
def test_verbose_shows_the_traceback_too(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = _run_loader(tmp_path, "--verbose", PERSIA_REDIS_URL=url, PERSIA_WAIT_TIMEOUT_S="1")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: data_loader/0: cannot reach Redis at {url}"), proc.stderr


def test_a_bad_wait_timeout_is_named():
    from pyrsia.shared.errors import ConfigError
    from pyrsia.shared.registry import wait_timeout_s
    from pyrsia.shared.settings import Settings

    bad = Settings.from_env({"PERSIA_WAIT_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match="PERSIA_WAIT_TIMEOUT_S: expected a positive"):
        wait_timeout_s(120.0, bad)
    assert wait_timeout_s(120.0, Settings.from_env({})) == 120.0
