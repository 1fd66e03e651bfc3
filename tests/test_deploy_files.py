"""The launch files are wired right: Procfiles, honcho env, docker compose, Dockerfile.

No Docker engine runs on the test machines, so this proves the wiring instead of
running it: every command is a valid ``persia-launcher`` invocation, every variable
resolves, every dependency exists, and replica indices cover 0..n-1 for each role.
"""

from __future__ import annotations

import importlib
import re
import shlex
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from persia.launcher import SUBCOMMANDS

TRAINING_COMMANDS = set(SUBCOMMANDS) - {
    "serve",
    "convert-checkpoint",
    "status",
    "run",
    "prometheus-targets",
}
"""What a training job runs (serving an exported model is a job of its own: README "Serving";
converting a PERSIA checkpoint is a one-off command; status only looks at a running job;
run starts all of these itself, on one machine; prometheus-targets feeds a Prometheus, under
compose's ``monitoring`` profile: tests/test_prometheus_monitoring.py)."""

REPO = Path(__file__).resolve().parent.parent
VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def substitute(text: str, env: dict[str, str], where: str) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1)
        assert name in env, f"{where}: ${name} does not resolve"
        return env[name]

    return VAR.sub(one, text)


def check_launcher_command(argv: list[str], where: str) -> tuple[str, dict]:
    """Parse argv (without the program name) with the subcommand's own parser."""
    assert argv and argv[0] in SUBCOMMANDS, f"{where}: unknown persia-launcher command {argv[:1]}"
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    try:
        args = module.build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way of saying no
        pytest.fail(f"{where}: invalid flags {argv}: exit {exc.code}")
    return argv[0], vars(args)


def check_replicas(found: dict[str, list[tuple[int, int]]], where: str) -> None:
    for role, pairs in found.items():
        sizes = {size for _, size in pairs}
        assert len(sizes) == 1, f"{where}: {role} replicas disagree on --replica-size: {sizes}"
        assert sorted(i for i, _ in pairs) == list(range(sizes.pop())), (
            f"{where}: {role} indices {pairs}"
        )


@pytest.mark.parametrize("procfile", ["Procfile", "Procfile.multi"])
def test_procfiles_are_valid_launcher_invocations(procfile):
    env = read_env(REPO / ".honcho.env")
    replicas: dict[str, list[tuple[int, int]]] = defaultdict(list)
    roles = set()
    for n, line in enumerate((REPO / procfile).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, _, command = line.partition(":")
        argv = shlex.split(substitute(command, env, f"{procfile}:{n}"))
        # `exec` so that honcho's SIGTERM reaches the service itself, not a shell around it
        assert argv[0] == "exec", f"{procfile}:{n}: start the command with exec"
        argv = argv[1:]
        if argv[0] == "persia-launcher":
            role, args = check_launcher_command(argv[1:], f"{procfile}:{n} ({name})")
            roles.add(role)
            if "replica_index" in args:
                replicas[role].append((args["replica_index"], args["replica_size"]))
        else:
            assert argv[:3] == ["python", "-m", "pyrsia.shared.redis_local"], (
                f"{procfile}:{n}: {argv}"
            )
    assert roles == TRAINING_COMMANDS, f"{procfile} runs {roles}"
    check_replicas(replicas, procfile)


def test_honcho_env_names_files_that_exist():
    env = read_env(REPO / ".honcho.env")
    for key in (
        "PERSIA_EMBEDDING_CONFIG",
        "PERSIA_GLOBAL_CONFIG",
        "PERSIA_NN_WORKER_ENTRY",
        "PERSIA_DATALOADER_ENTRY",
    ):
        assert (REPO / env[key]).is_file(), f".honcho.env {key}={env[key]} does not exist"
    assert env["PERSIA_REDIS_URL"].endswith(f":{env['REDIS_PORT']}/0")
    assert (REPO / ".env").resolve() == (REPO / ".honcho.env").resolve()


def test_compose_wiring():
    env = read_env(REPO / ".docker.env")
    raw = (REPO / "docker-compose.yml").read_text()
    compose = yaml.safe_load(substitute(raw, env, "docker-compose.yml"))
    services = compose["services"]
    assert services["redis"]["image"].startswith("redis")
    replicas: dict[str, list[tuple[int, int]]] = defaultdict(list)
    roles = set()
    for name, svc in services.items():
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on missing service {dep}"
        if name == "redis" or svc.get("profiles"):
            continue  # the monitoring profile: tests/test_prometheus_monitoring.py
        assert svc.get("build") == "." and svc["restart"] in ("on-failure", "no"), name
        assert any(v.endswith(":/workspace") for v in svc["volumes"]), (
            f"{name} mounts no /workspace"
        )
        role, args = check_launcher_command(shlex.split(svc["command"]), f"compose {name}")
        roles.add(role)
        if "replica_index" in args:
            replicas[role].append((args["replica_index"], args["replica_size"]))
    assert roles == TRAINING_COMMANDS
    check_replicas(replicas, "docker-compose.yml")
    # the files the containers are told to use exist in the mounted folder
    for key in (
        "PERSIA_EMBEDDING_CONFIG",
        "PERSIA_GLOBAL_CONFIG",
        "PERSIA_NN_WORKER_ENTRY",
        "PERSIA_DATALOADER_ENTRY",
    ):
        rel = env[key].removeprefix("/workspace/")
        assert (REPO / "examples/adult_income" / rel).is_file(), f"{key}={env[key]}"


def test_dockerfile_installs_the_project_and_runs_the_launcher():
    text = (REPO / "Dockerfile").read_text()
    assert (
        "ARG TORCH_INDEX_URL" in text and "ARG BASE_IMAGE" in text
    )  # CPU default, CUDA by build arg
    assert 'ENTRYPOINT ["persia-launcher"]' in text
    for folder in ("persia", "pyrsia"):
        assert f"COPY {folder} ./{folder}" in text
