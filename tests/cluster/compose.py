"""docker-compose.yml rendered the way compose renders it: each service's environment and
command, with ``.docker.env``'s variables substituted.

Only what the repository's compose file uses: YAML merge keys (``<<: *pyrsia``, shallow, as
YAML defines them), ``env_file`` then ``environment`` (the latter wins, as in compose),
``${VAR}`` substitution from the ``--env-file``, ``hostname``. Names compose's DNS resolves on
the project network: each service's name, its ``container_name`` and its network aliases
(not its ``hostname``: another container cannot resolve that unless it is also one of these).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SERVERS = {"embedding-parameter-server", "embedding-worker", "nn-worker"}
"""persia-launcher commands that listen (the NN worker's ranks host the batch ingress)."""
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")


def read_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip().strip("'\"")
    return out


def substitute(text: str, variables: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = m[1] or m[3]
        if name in variables and variables[name] != "":
            return variables[name]
        if m[2] is not None:
            return m[2]
        if name not in variables:
            raise KeyError(f"compose variable ${{{name}}} is not set in the env file")
        return ""

    return _VAR.sub(one, text)


@dataclass
class Service:
    name: str
    hostname: str
    command: list[str]
    environment: dict[str, str]
    dns_names: set[str] = field(default_factory=set)

    @property
    def launcher_command(self) -> str | None:
        return self.command[0] if self.command else None

    @property
    def is_pyrsia(self) -> bool:
        """A persia-launcher command (the image's entrypoint), not Redis."""
        return self.launcher_command in SERVERS | {"data-loader"}

    @property
    def is_server(self) -> bool:
        return self.launcher_command in SERVERS

    def flag(self, name: str, default: str | None = None) -> str | None:
        if name in self.command:
            return self.command[self.command.index(name) + 1]
        return default


def render(compose_file: Path, env_file: Path) -> dict[str, Service]:
    """Every service of ``compose_file`` as compose would start it with ``--env-file``."""
    doc = yaml.safe_load(compose_file.read_text())
    variables = read_env_file(env_file)
    services = {}
    for name, spec in doc["services"].items():
        if spec.get("profiles"):
            continue  # started only with --profile (monitoring): not part of the job
        env: dict[str, str] = {}
        files = spec.get("env_file") or []
        for rel in [files] if isinstance(files, str) else files:
            env.update(read_env_file(compose_file.parent / rel))
        raw_env = spec.get("environment") or {}
        if isinstance(raw_env, list):
            raw_env = dict(item.split("=", 1) for item in raw_env)
        env.update({k: substitute(str(v), variables) for k, v in raw_env.items()})
        command = spec.get("command") or []
        if isinstance(command, str):
            command = shlex.split(substitute(command, variables))
        else:
            command = [substitute(str(c), variables) for c in command]
        dns = {name}
        if spec.get("container_name"):
            dns.add(spec["container_name"])
        for net in (
            (spec.get("networks") or {}).values() if isinstance(spec.get("networks"), dict) else []
        ):
            dns.update((net or {}).get("aliases", []))
        services[name] = Service(
            name=name,
            hostname=spec.get("hostname") or f"<container id of {name}>",
            command=command,
            environment=env,
            dns_names=dns,
        )
    return services
