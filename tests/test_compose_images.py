"""What `make images` and `make compose-test` rely on, checked without a Docker engine.

The compose file takes every image from a variable (registry images by default, the Debian
builds of ``make images`` offline), runs on its own network, stops the job when a PS dies and
resumes with ``PERSIA_RESUME``; the Dockerfile keeps its registry default and installs from
``docker/wheelhouse`` with no index when that holds wheels; the scripts refuse bad arguments
and find the apt mirror from the machine's apt sources. The job itself across containers:
tests/compose (``make compose-test``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.test_deploy_files import read_env

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts/docker"


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_every_image_comes_from_a_variable_with_the_registry_default():
    services, env = _compose()["services"], read_env(REPO / ".docker.env")
    assert services["redis"]["image"] == "${REDIS_IMAGE}" and env["REDIS_IMAGE"] == "redis:7"
    assert services["prometheus"]["image"] == "${PROMETHEUS_IMAGE}"
    assert env["PROMETHEUS_IMAGE"].startswith("prom/prometheus:")
    assert services["grafana"]["image"] == "${GRAFANA_IMAGE}"
    assert services["prometheus"]["ports"] == ["${PROMETHEUS_PORT}:9090"]
    # Debian's redis-server has no entry script turning protected mode off, as redis:7's does
    assert services["redis"]["command"][:3] == ["redis-server", "--protected-mode", "no"]
    assert (REPO / env["PERSIA_WORKSPACE"] / "train.py").is_file()


def test_the_job_runs_on_the_compose_network_and_a_lost_ps_stops_it():
    services = _compose()["services"]
    for name, service in services.items():
        assert "network_mode" not in service, f"{name}: the containers use compose's network"
        if name.startswith("embedding_parameter_server_"):
            # a PS restarted by Docker would come back empty while the job goes on
            assert service["restart"] == "no", name
    for name in ("nn_worker", "data_loader_0"):
        assert services[name]["environment"]["PERSIA_RESUME"] == "${PERSIA_RESUME}", name
    assert read_env(REPO / ".docker.env")["PERSIA_RESUME"] == "0"


def test_dockerfile_keeps_the_registry_default_and_installs_offline_from_the_wheelhouse():
    text = (REPO / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in text
    assert "COPY docker/wheelhouse/ /opt/wheelhouse/" in text
    assert "pip install --no-index --find-links /opt/wheelhouse" in text
    # the warm-up compiles the installed package's kernels, not the source tree's
    assert "cd / && python -m pyrsia.services.warmup" in text
    lines = (REPO / ".dockerignore").read_text().splitlines()
    ignore = [line for line in lines if line and not line.startswith("#")]
    assert ignore[0] == "*" and "!docker/wheelhouse" in ignore  # no .venv or .git in the context
    assert (REPO / "docker/wheelhouse/README.md").is_file()  # the folder COPY needs
    redis = (REPO / "docker/redis.Dockerfile").read_text()
    assert "apt-get install -y --no-install-recommends redis-server" in redis
    prometheus = (REPO / "docker/prometheus.Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/prometheus"]' in prometheus


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    "script, args",
    [
        ("images.sh", ["--only", "grafana"]),
        ("images.sh", ["--cache"]),
        ("images.sh", ["extra"]),
        ("base_image.sh", ["--suite"]),
        ("wheelhouse.sh", ["--bogus"]),
        ("dockerd.sh", ["--timeout", "soon"]),
        ("compose_test.sh", ["/nonexistent/python"]),
        ("debian_mirror.sh", ["--help"]),
    ],
)
def test_scripts_refuse_bad_arguments_with_usage(script, args):
    done = _script(script, *args)
    assert done.returncode == 2, (script, args, done.stdout, done.stderr)
    assert "usage:" in done.stderr or "not an executable Python" in done.stderr


def test_debian_mirror_is_read_from_the_apt_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    deb822 = tmp_path / "sources.list.d/debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.invalid/debian/\nSuites: bookworm\n"
    )
    done = _script("debian_mirror.sh", str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "http://mirror.invalid/debian\n")
    deb822.unlink()
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://one.invalid/debian bookworm main\n"
    )
    assert _script("debian_mirror.sh", str(tmp_path)).stdout == "http://one.invalid/debian\n"
    (tmp_path / "sources.list").write_text("# nothing\n")
    done = _script("debian_mirror.sh", str(tmp_path))
    assert done.returncode == 1 and "--mirror URL" in done.stderr
