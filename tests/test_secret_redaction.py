"""The job's secrets (the Redis URL's password, ``PERSIA_AUTH_TOKEN``) never surface.

Real services run against a real redis-server started with ``--requirepass``; each error
path that formats the Redis URL is provoked (wrong password, Redis unreachable, a password
sent to a Redis that has none, a worker whose PS never comes, a service's exit), and every
byte the processes wrote (stdout/stderr), every ``/health`` and ``/metrics`` body and every
exit message is searched for the secret strings.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from pyrsia.shared.redaction import REDACTED, redact, redact_url, redacting_formatter
from pyrsia.shared.registry import RegistrySettings
from tests.redis_server import RedisServer, free_port
from tests.service_procs import REPO

PASSWORD = "rEd1s-pw-" + uuid.uuid4().hex[:12]
WRONG_PASSWORD = "wr0ng-pw-" + uuid.uuid4().hex[:12]
TOKEN = "t0ken-" + uuid.uuid4().hex
SECRETS = (PASSWORD, WRONG_PASSWORD, TOKEN)


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


# --- the helper itself ---------------------------------------------------------------------
def test_redact_url_hides_the_password_and_keeps_the_rest():
    assert (
        redact_url(f"redis://:{PASSWORD}@10.0.0.5:6379/0") == f"redis://:{REDACTED}@10.0.0.5:6379/0"
    )
    assert redact_url(f"rediss://user:{PASSWORD}@h/1") == f"rediss://user:{REDACTED}@h/1"
    assert redact_url(f"redis://h:1/0?password={PASSWORD}&db=2") == (
        f"redis://h:1/0?password={REDACTED}&db=2"
    )
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("redis://p%40ss%3Aword@h/0").count("p%40ss") == 0


def test_redact_replaces_env_secrets_even_outside_urls(monkeypatch):
    monkeypatch.setenv("PERSIA_REDIS_URL", f"redis://:{PASSWORD}@127.0.0.1:6379/0")
    monkeypatch.setenv("PERSIA_AUTH_TOKEN", TOKEN)
    text = f"AUTH {PASSWORD} failed; header Bearer {TOKEN}; url redis://u:{WRONG_PASSWORD}@h/0"
    assert _leaks(redact(text)) == []
    assert "redis://u:***@h/0" in redact(text)


def test_settings_repr_and_log_lines_are_redacted(monkeypatch, caplog):
    url = f"redis://:{PASSWORD}@127.0.0.1:6379/0"
    monkeypatch.setenv("PERSIA_REDIS_URL", url)
    assert PASSWORD not in repr(RegistrySettings(redis_url=url))
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "connecting to %s", (url,), None)
    try:
        raise RuntimeError(f"boom {PASSWORD}")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert _leaks(redacting_formatter("%(message)s").format(record)) == []


# --- real processes --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def locked_redis():
    server = RedisServer(extra_args=["--requirepass", PASSWORD]).start()
    yield server
    server.stop()


def _env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSIA_")}
    env.update(
        PERSIA_REDIS_URL=redis_url,
        PERSIA_JOB_ID=f"redact-{uuid.uuid4().hex[:8]}",
        PERSIA_AUTH_TOKEN=TOKEN,
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def _run_to_exit(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def emb_config(tmp_path) -> Path:
    path = tmp_path / "embedding_config.yml"
    path.write_text("slots_config:\n  a:\n    dim: 2\n")
    return path


@pytest.mark.parametrize("case", ["wrong_password", "unreachable", "malformed_url"])
def test_ps_exit_message_on_redis_errors_hides_the_password(case, locked_redis, tmp_path):
    if case == "wrong_password":
        url = f"redis://:{WRONG_PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    elif case == "unreachable":
        url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    else:
        url = f"redis://:{PASSWORD}@127.0.0.1:port/0"
    proc = _run_to_exit("pyrsia.services.embedding_ps", ["--port", "0"], _env(url))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]
    assert "REDIS" in proc.stderr.upper() and REDACTED in proc.stderr, proc.stderr[-2000:]
    assert _leaks(out) == [], out[-2000:]


def _get(url: str, token: str | None = TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:  # the 401's body is msgpack
        with exc:  # closed here, not by the garbage collector (a ResourceWarning then)
            return exc.code, exc.read().decode(errors="replace")


def test_worker_health_logs_and_exit_hide_the_secrets(locked_redis, emb_config, tmp_path):
    """A worker whose PS never registers reports the registry timeout on /health and in an
    ERROR line (both name the Redis URL); then it is stopped. Nothing shows a secret."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    env = _env(url)
    port = free_port()
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pyrsia.services.embedding_worker",
                "--embedding-config",
                str(emb_config),
                "--port",
                str(port),
                "--ps-wait-timeout",
                "1",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    bodies: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/health")
            except OSError:
                time.sleep(0.1)
                continue
            if status == 503 and "timed out" in body:
                bodies.append(body)
                break
            time.sleep(0.1)
        assert bodies, f"no timeout on /health\n{log_path.read_text()[-3000:]}"
        assert REDACTED in json.loads(bodies[0])["reason"], bodies[0]
        bodies.append(_get(f"http://127.0.0.1:{port}/metrics")[1])
        bodies.append(_get(f"http://127.0.0.1:{port}/health", token="x" * 20)[1])  # the 401
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    log = log_path.read_text()
    assert code == 0, log[-3000:]
    assert "ERROR" in log and "timed out" in log, log[-3000:]
    for text in (*bodies, log):
        assert _leaks(text) == [], text[-3000:]


def test_redis_supervisor_messages_hide_requirepass():
    """``pyrsia.shared.redis_local --restart-on-failure`` names the redis-server it restarts: by its
    port, never by arguments that may include ``--requirepass``."""
    import io

    from pyrsia.shared.redis_local import supervise

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    out = io.StringIO()
    try:
        code = supervise(
            ["/bin/false", "--requirepass", PASSWORD, "--port", "6399"], limit=1, out=out
        )
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert code == 1 and "6399" in out.getvalue(), out.getvalue()
    assert _leaks(out.getvalue()) == [], out.getvalue()


@pytest.mark.parametrize("verbose", [False, True])
def test_data_loader_error_and_launcher_warning_hide_the_password(locked_redis, tmp_path, verbose):
    """A data loader whose DataCtx meets a refused password ends with one line naming the URL
    (with LOG_LEVEL=debug: the whole traceback), after the launcher's own lease warning;
    neither form shows the password."""
    script = tmp_path / "data_loader.py"
    script.write_text("from persia.ctx import DataCtx\nwith DataCtx() as ctx:\n    pass\n")
    url = f"redis://:{WRONG_PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    extra = {"LOG_LEVEL": "debug"} if verbose else {}
    proc = _run_to_exit(
        "persia.launcher", ["data-loader", "--exit-when-done", str(script)], _env(url, **extra)
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and REDACTED in out, out[-3000:]
    assert ("Traceback" in out) == verbose, out[-3000:]
    assert "no job lease taken" in out, out[-3000:]
    assert _leaks(out) == [], out[-3000:]
