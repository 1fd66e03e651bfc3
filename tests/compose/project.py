"""A docker compose project of the repository's ``docker-compose.yml``, driven from a test.

The ``docker compose`` plugin (v2) where it is installed, ``docker-compose`` (1.29) otherwise;
the repository's ``.docker.env`` as the env file, with the test's variables in the process
environment (they win over the file, as a user's shell variables do). Containers are found by
compose's labels, so the same code serves both CLIs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OFFLINE_IMAGES = {
    "IMAGE": "pyrsia:latest",
    "REDIS_IMAGE": "pyrsia-redis:bookworm",
    "PROMETHEUS_IMAGE": "pyrsia-prometheus:bookworm",
}
"""The images ``make images`` builds from Debian's packages (scripts/docker/images.sh)."""
AUC_LINE = re.compile(r"^test AUC: ([0-9.]+)$", re.MULTILINE)


def compose_cli() -> list[str] | None:
    """The compose command line: the v2 plugin, else docker-compose 1.29; None without either."""
    if shutil.which("docker") and _ok(["docker", "compose", "version"]):
        return ["docker", "compose"]
    if shutil.which("docker-compose") and _ok(["docker-compose", "version"]):
        return ["docker-compose"]
    return None


def _ok(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """``docker ARGS``; its stdout (stderr too when it fails)."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


class ComposeProject:
    """One compose project: its name, its workspace and the variables it runs with."""

    def __init__(self, cli: list[str], name: str, variables: dict[str, str]):
        self.cli = cli
        self.name = name
        self.variables = dict(variables)

    def run(self, *args: str, timeout: float = 300, **variables: str) -> str:
        """``docker compose -p NAME --env-file .docker.env -f docker-compose.yml ARGS``."""
        env = {**os.environ, **self.variables, **variables}
        argv = [
            *self.cli,
            "-p",
            self.name,
            "--env-file",
            str(REPO / ".docker.env"),
            "-f",
            str(REPO / "docker-compose.yml"),
            *args,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout + done.stderr

    def _label(self, service: str | None = None) -> list[str]:
        out = ["--filter", f"label=com.docker.compose.project={self.name}"]
        if service is not None:
            out += ["--filter", f"label=com.docker.compose.service={service}"]
        return out

    def container(self, service: str) -> str:
        """The id of the service's (one) container, running or not."""
        ids = docker("ps", "-aq", *self._label(service)).split()
        if len(ids) != 1:
            raise RuntimeError(f"{self.name}: {len(ids)} containers of {service}, expected 1")
        return ids[0]

    def logs(self, service: str) -> str:
        done = subprocess.run(
            ["docker", "logs", self.container(service)], capture_output=True, text=True, timeout=60
        )
        return done.stdout + done.stderr

    def wait(self, service: str, timeout: float) -> int:
        """Wait for the service's container to exit; its exit code."""
        return int(docker("wait", self.container(service), timeout=timeout).strip())

    def final_updates_applied(self, services: list[str]) -> int:
        """Sum of the PS replicas' ``updates_applied``, logged when SIGTERM stops them."""
        self.run("stop", "-t", "10", *services)
        total = 0
        for service in services:
            found = re.findall(r"final stats: updates_applied=(\d+)", self.logs(service))
            if not found:
                raise RuntimeError(
                    f"{service} logged no final stats:\n{self.logs(service)[-2000:]}"
                )
            total += int(found[-1])
        return total

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes of this project still present."""
        return {
            kind: docker(kind, "ls", "-q", *self._label()).split()
            if kind != "container"
            else docker("ps", "-aq", *self._label()).split()
            for kind in ("container", "network", "volume")
        }


def auc_of(log: str) -> float | None:
    """The ``test AUC: x`` line the Adult example's train.py prints last."""
    found = AUC_LINE.findall(log)
    return float(found[-1]) if found else None
