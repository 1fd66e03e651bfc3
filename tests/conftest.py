"""Shared fixtures: a real redis-server per session, a fresh job id per test."""

from __future__ import annotations

import uuid

import pytest

from pyrsia.shared.constants import ENV_CHECKPOINT_ROOT
from pyrsia.shared.registry import RegistrySettings
from tests import progress_report
from tests.redis_server import RedisServer


def pytest_configure(config: pytest.Config) -> None:
    progress_report.pytest_configure(config)


@pytest.fixture(scope="session", autouse=True)
def checkpoint_root(tmp_path_factory):
    """Services started by tests may /dump and /load under pytest's base temporary directory
    (every ``tmp_path``): a PS otherwise confines them to its working directory, the repository
    (pyrsia/services/embedding_ps/checkpoint_root.py). A test of the default unsets it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_CHECKPOINT_ROOT, str(tmp_path_factory.getbasetemp()))
        yield


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def job_env(redis_server, monkeypatch) -> dict[str, str]:
    """Environment for this test's services: the session Redis and a job id of its own."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"test-{uuid.uuid4().hex[:10]}"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def registry_settings(job_env) -> RegistrySettings:
    return RegistrySettings(redis_url=job_env["PERSIA_REDIS_URL"], job_id=job_env["PERSIA_JOB_ID"])


@pytest.fixture
def services(job_env, tmp_path):
    """Factory: start service subprocesses for this test; all are stopped (SIGTERM) at teardown
    and must exit 0 within ``STOP_TIMEOUT_S``. A service still running then is killed and
    fails the test with -9; only a service the test killed itself (``svc.kill()``) may
    end with -9."""
    from tests.service_procs import STOP_TIMEOUT_S, ServiceProc

    started: list[ServiceProc] = []

    def start(
        module: str, args: list[str], *, role: str, replica_index: int = 0, **kw
    ) -> ServiceProc:
        svc = ServiceProc.start(
            module, args, job_env, role=role, replica_index=replica_index, log_dir=tmp_path, **kw
        )
        started.append(svc)
        return svc

    yield start
    codes = {f"{s.role}/{s.replica_index}": (s.stop(), s) for s in reversed(started)}
    bad = {k: code for k, (code, svc) in codes.items() if code != 0 and not svc.killed}
    assert not bad, f"services did not exit 0 within {STOP_TIMEOUT_S}s of SIGTERM: {bad}"
