"""PERSIA's ``persia.helper``: a whole job on this machine, for tests and notebooks.

``with ensure_persia_service(embedding_config=..., data_loader_func=f): ...`` starts the
services a job needs and stops them when the block ends::

    redis-server                  only when PERSIA_REDIS_URL is unset (PERSIA started a
                                  nats-server); on a free port from nats_server_port
    embedding PS  x N             python -m pyrsia.services.embedding_ps, free ports from
                                  embedding_parameter_server_port
    embedding worker  x M         python -m pyrsia.services.embedding_worker, free ports from
                                  embedding_worker_port
    data_loader_func()            in a thread of this process
    nn_worker_func()              in a thread of this process

The configs (dicts or paths) are written to temporary YAML files the services read.
PERSIA pickled the two functions with cloudpickle and ran them in subprocesses; Pyrsia
unpickles nothing, so they run in threads here: one replica each
(``data_loader_replica_num`` and ``nproc_per_node`` other than 1 are refused), and an
exception they raise is raised again when the block ends. The services get SIGTERM
when the block ends; one that had already died is named in a RuntimeError.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from persia.utils import find_free_port
from pyrsia.shared.constants import (
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
    ENV_REDIS_URL,
    HELPER_HEALTH_POLL_S,
    HELPER_HEALTH_TIMEOUT_S,
    HELPER_READY_TIMEOUT_S,
    HELPER_START_ATTEMPTS,
    HELPER_STOP_TIMEOUT_S,
    REDIS_PROBE_INTERVAL_S,
    REDIS_PROBE_TIMEOUT_S,
    REDIS_START_TIMEOUT_S,
)
from pyrsia.shared.errors import InvalidInputError, ServiceUnavailableError
from pyrsia.shared.process_env import export, unset
from pyrsia.shared.settings import Settings, current

__all__ = ["PersiaServiceCtx", "ensure_persia_service"]

_logger = logging.getLogger(__name__)

_DEFAULT_GLOBAL_CONFIG = {
    "embedding_worker_config": {"forward_buffer_size": 1000},
    "common_config": {"metrics_config": {"enable_metrics": False}},
}
_REPO = Path(__file__).resolve().parent.parent
_ENV_SET = (ENV_REDIS_URL, ENV_EMBEDDING_CONFIG, ENV_GLOBAL_CONFIG)
"""Set in this process while the block runs (the services and the functions read them)."""


def _write_yaml(config: dict, directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as fh:
        yaml.safe_dump(config, fh)
    return path


def _wait_healthy(
    proc: subprocess.Popen, port: int, what: str, env: dict[str, str], *, ready: bool
) -> None:
    """Until ``/health`` answers (200 when ``ready``: a worker is ready once its PS are)."""
    headers = {}
    if env.get("PERSIA_AUTH_TOKEN"):
        headers["Authorization"] = f"Bearer {env['PERSIA_AUTH_TOKEN']}"
    deadline = time.monotonic() + HELPER_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceUnavailableError(f"{what} exited with {proc.returncode} while starting")
        request = urllib.request.Request(f"http://127.0.0.1:{port}/health", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=HELPER_HEALTH_TIMEOUT_S) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError:
            if not ready:
                return  # listening: a PS is ready once configured
        except OSError:
            pass
        time.sleep(HELPER_HEALTH_POLL_S)
    raise TimeoutError(f"{what} not ready on port {port} after {HELPER_READY_TIMEOUT_S:.0f}s")


class _Runner(threading.Thread):
    """Runs a user function; its exception is kept for the end of the block."""

    def __init__(self, func: Callable[[], object], name: str):
        super().__init__(name=name, daemon=True)
        self.func = func
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.func()
        except BaseException as exc:  # noqa: BLE001 - re-raised by PersiaServiceCtx.__exit__
            self.error = exc


class PersiaServiceCtx:
    """Start a local job (Redis if needed, PS, embedding workers, user functions); see the module docstring.

    Arguments are PERSIA's: ``embedding_config`` / ``embedding_config_path`` (one is needed),
    ``global_config`` / ``global_config_path`` (default: forward buffer 1000, metrics off),
    replica counts and first ports (a taken port moves to the next free one).
    """

    def __init__(
        self,
        data_loader_func: Callable | None = None,
        nn_worker_func: Callable | None = None,
        embedding_config: dict | None = None,
        embedding_config_path: str | None = None,
        global_config: dict | None = None,
        global_config_path: str | None = None,
        data_loader_replica_num: int = 1,
        nproc_per_node: int = 1,
        embedding_worker_replica_num: int = 1,
        embedding_parameter_replica_num: int = 1,
        embedding_worker_port: int = 7777,
        embedding_parameter_server_port: int = 8888,
        nats_server_port: int = 4222,
    ):
        if embedding_config is None and embedding_config_path is None:
            raise InvalidInputError(
                "embedding_config",
                "a dict, or embedding_config_path",
                message="pass embedding_config (a dict) or embedding_config_path",
            )
        for name, value in (
            ("data_loader_replica_num", data_loader_replica_num),
            ("nproc_per_node", nproc_per_node),
        ):
            if value != 1:
                raise InvalidInputError(
                    name,
                    "1",
                    value,
                    message=f"{name}={value}: Pyrsia's helper runs the function in one thread of this "
                    "process (nothing is unpickled in a subprocess); start more replicas with "
                    "persia-launcher",
                )
        for name, value in (
            ("embedding_worker_replica_num", embedding_worker_replica_num),
            ("embedding_parameter_replica_num", embedding_parameter_replica_num),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(name, "a positive integer", value)
        self.data_loader_func = data_loader_func
        self.nn_worker_func = nn_worker_func
        self.embedding_config = embedding_config
        self.embedding_config_path = embedding_config_path
        self.global_config = global_config or _DEFAULT_GLOBAL_CONFIG
        self.global_config_path = global_config_path
        self.embedding_worker_replica_num = embedding_worker_replica_num
        self.embedding_parameter_replica_num = embedding_parameter_replica_num
        self.embedding_worker_port = embedding_worker_port
        self.embedding_parameter_server_port = embedding_parameter_server_port
        self.nats_server_port = nats_server_port
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._threads: list[_Runner] = []
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._saved_env: dict[str, str | None] | None = None

    # --- start ----------------------------------------------------------------------
    def _spawn(self, what: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        proc = subprocess.Popen(args, env=env, cwd=_REPO)
        self._procs.append((what, proc))
        return proc

    def _start_redis(self, env: dict[str, str]) -> str:
        """A private redis-server on a free port; its URL."""
        from pyrsia.shared.redis_local import find_redis_server

        port = find_free_port(self.nats_server_port)
        assert self._tmp is not None
        proc = self._spawn(
            "redis-server",
            [
                find_redis_server(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._tmp.name,
            ],
            env,
        )
        import socket

        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceUnavailableError(f"redis-server exited with {proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=REDIS_PROBE_TIMEOUT_S):
                    break
            except OSError:
                time.sleep(REDIS_PROBE_INTERVAL_S)
        return f"redis://127.0.0.1:{port}/0"

    def _start_services(
        self, role: str, module: str, count: int, first_port: int, env: dict[str, str]
    ) -> None:
        port = first_port
        for index in range(count):
            what = f"{role}[{index}]"
            for attempt in range(HELPER_START_ATTEMPTS):
                # a port found free can be taken before the service binds it (an outgoing
                # connection's ephemeral port): then the service exits and the next port is tried
                port = find_free_port(port)
                proc = self._spawn(
                    what,
                    [
                        sys.executable,
                        "-m",
                        module,
                        "--port",
                        str(port),
                        "--replica-index",
                        str(index),
                        "--replica-size",
                        str(count),
                    ],
                    env,
                )
                try:
                    _wait_healthy(proc, port, what, env, ready=role == "embedding worker")
                    break
                except ServiceUnavailableError:
                    self._procs.pop()
                    if attempt == HELPER_START_ATTEMPTS - 1:
                        raise
                    port += 1
            port += 1

    def __enter__(self) -> PersiaServiceCtx:
        self._tmp = tempfile.TemporaryDirectory(prefix="persia-helper-")
        settings = current()  # PERSIA's API, entered: this process's settings, read now
        self._saved_env = {key: settings.environ.get(key) for key in _ENV_SET}
        env = dict(settings.environ)  # the services' environment, built here
        try:
            handed: dict[str, str] = {}
            if not settings.text(ENV_REDIS_URL).strip():
                handed[ENV_REDIS_URL] = self._start_redis(env)
            embedding_path = self.embedding_config_path or _write_yaml(
                self.embedding_config, self._tmp.name, "embedding_config.yml"
            )
            global_path = self.global_config_path or _write_yaml(
                self.global_config, self._tmp.name, "global_config.yml"
            )
            handed.update(
                {ENV_EMBEDDING_CONFIG: str(embedding_path), ENV_GLOBAL_CONFIG: str(global_path)}
            )
            env.update(handed)
            # the contexts the user's functions enter in this process read these (PERSIA's API)
            export(handed)
            self._start_services(
                "embedding PS",
                "pyrsia.services.embedding_ps",
                self.embedding_parameter_replica_num,
                self.embedding_parameter_server_port,
                env,
            )
            self._start_services(
                "embedding worker",
                "pyrsia.services.embedding_worker",
                self.embedding_worker_replica_num,
                self.embedding_worker_port,
                env,
            )
            if self.data_loader_func is not None or self.nn_worker_func is not None:
                from pyrsia.shared.runtime import get_runtime

                # started here, before two threads could both start it
                get_runtime(Settings.from_env(env))
            for func, name in (
                (self.data_loader_func, "persia-data-loader"),
                (self.nn_worker_func, "persia-nn-worker"),
            ):
                if func is not None:
                    runner = _Runner(func, name)
                    runner.start()
                    self._threads.append(runner)
        except BaseException:
            self._stop()
            raise
        return self

    # --- stop -----------------------------------------------------------------------
    def _stop(self) -> list[str]:
        died = [f"{what} (exit {p.returncode})" for what, p in self._procs if p.poll() is not None]
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for what, proc in reversed(self._procs):
            try:
                proc.wait(timeout=HELPER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _logger.warning(
                    "%s did not exit %.0fs after SIGTERM: killed", what, HELPER_STOP_TIMEOUT_S
                )
                proc.kill()
                proc.wait()
        self._procs.clear()
        saved = self._saved_env or {}  # the environment as it was
        unset(key for key, value in saved.items() if value is None)
        export({key: value for key, value in saved.items() if value is not None})
        self._saved_env = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return died

    def __exit__(self, exc_type, exc, tb) -> None:
        errors = []
        for runner in self._threads:
            runner.join(timeout=HELPER_STOP_TIMEOUT_S)
            if runner.is_alive():
                _logger.warning("%s still running when the block ended", runner.name)
            elif runner.error is not None:
                errors.append(runner.error)
        self._threads.clear()
        died = self._stop()
        if exc_type is not None:
            return
        if errors:
            raise errors[0]
        if died:
            raise ServiceUnavailableError(
                f"service(s) died before the block ended: {', '.join(died)}"
            )


def ensure_persia_service(*args, **kwargs) -> PersiaServiceCtx:
    """``PersiaServiceCtx(*args, **kwargs)``, PERSIA's spelling."""
    return PersiaServiceCtx(*args, **kwargs)
