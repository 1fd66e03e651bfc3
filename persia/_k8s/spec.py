"""A PersiaJob (PERSIA's Kubernetes custom resource) read and validated into dataclasses.

The shape is PERSIA's ``k8s/src/crd.rs`` and ``k8s/example/*.yml``: ``apiVersion:
persia.com/v1``, ``kind: PersiaJob``, ``metadata.{name, namespace}`` and a ``spec`` with
``persiaEnv`` (``PERSIA_GLOBAL_CONFIG``, ``PERSIA_EMBEDDING_CONFIG``,
``PERSIA_NN_WORKER_ENTRY``, ``PERSIA_DATALOADER_ENTRY``), ``enableMetrics``, ``volumes``,
``env``, ``logLevel``, ``restartPolicy``, ``imagePullPolicy`` and one block per role
(``embeddingParameterServer``, ``embeddingWorker``, ``nnWorker`` with ``nprocPerNode``,
``dataloader``), each with ``replicas``, ``resources``, ``volumeMounts``, ``env``, ``image``.

PERSIA's older formats are read too: the four paths at spec level (``globalConfigPath``,
``embeddingConfigPath``, ``nnWorkerPyEntryPath``, ``dataLoaderPyEntryPath``; a file uses one
format or the other, not both) and the oldest role names (``embeddingServer``,
``middlewareServer``, ``trainer``, ``trainerPyEntryPath``), read as the new ones.

Every wrong value or unknown key is a :class:`~pyrsia.shared.errors.ConfigError` naming the file and
the key path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pyrsia.shared.errors import ConfigError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
ROLE_KEYS = ("embeddingParameterServer", "embeddingWorker", "nnWorker", "dataloader")
OLD_NAMES = {
    "embeddingServer": "embeddingParameterServer",
    "middlewareServer": "embeddingWorker",
    "trainer": "nnWorker",
    "trainerPyEntryPath": "nnWorkerPyEntryPath",
}
ROLE_FIELDS = ("replicas", "resources", "volumeMounts", "env", "image", "nprocPerNode")
PERSIA_ENV = {  # spec.persiaEnv key -> the older spec-level key
    "PERSIA_GLOBAL_CONFIG": "globalConfigPath",
    "PERSIA_EMBEDDING_CONFIG": "embeddingConfigPath",
    "PERSIA_NN_WORKER_ENTRY": "nnWorkerPyEntryPath",
    "PERSIA_DATALOADER_ENTRY": "dataLoaderPyEntryPath",
}
SPEC_FIELDS = (
    "persiaEnv",
    "globalConfigPath",
    "embeddingConfigPath",
    "nnWorkerPyEntryPath",
    "dataLoaderPyEntryPath",
    "enableMetrics",
    "volumes",
    "env",
    "logLevel",
    "restartPolicy",
    "imagePullPolicy",
    *ROLE_KEYS,
)
LOG_LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "critical")
NATS_VARIABLES = ("PERSIA_NATS_IP", "PERSIA_NATS_URL")


@dataclass(frozen=True)
class RoleSpec:
    """One role's block: how many replicas and what their containers get."""

    replicas: int
    resources: dict[str, Any] | None = None
    volume_mounts: tuple[dict[str, Any], ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    image: str | None = None
    nproc_per_node: int = 1


@dataclass(frozen=True)
class PersiaJobSpec:
    """A validated PersiaJob."""

    name: str
    namespace: str
    global_config_path: str
    embedding_config_path: str
    nn_worker_entry: str | None = None
    data_loader_entry: str | None = None
    enable_metrics: bool = True
    volumes: tuple[dict[str, Any], ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    log_level: str = "info"
    restart_policy: str = "Never"
    image_pull_policy: str = "Always"
    roles: dict[str, RoleSpec] = field(default_factory=dict)
    dropped_env: tuple[str, ...] = ()
    """PERSIA's NATS variables removed from the env lists (Pyrsia uses Redis)."""


class _Reader:
    """Key-path-aware accessors over one mapping of the YAML."""

    def __init__(self, data: Any, path: str, source: str):
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: {path or 'document'}: expected a mapping, got {data!r}")
        self.data, self.path, self.source = data, path, source

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, expected: str, got: Any) -> ConfigError:
        return ConfigError(f"{self.source}: {self.where(key)}: expected {expected}, got {got!r}")

    def check_known(self, known: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in known:
                raise ConfigError(
                    f"{self.source}: {self.where(str(key))}: unknown key (known: {', '.join(known)})"
                )

    def string(self, key: str, default: str | None = None, *, required: bool = False):
        value = self.data.get(key, default)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a non-empty string", value)
        return value

    def choice(self, key: str, default: str, options: tuple[str, ...]) -> str:
        value = self.data.get(key, default)
        if value not in options:
            raise self.fail(key, " or ".join(options), value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def positive_int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, "a positive integer", value)
        return value

    def mapping_list(self, key: str, required_key: str) -> tuple[dict[str, Any], ...]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(
            isinstance(item, dict) and isinstance(item.get(required_key), str) for item in value
        ):
            raise self.fail(key, f"a list of mappings, each with a {required_key!r}", value)
        return tuple(value)

    def mapping(self, key: str) -> dict[str, Any] | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.fail(key, "a mapping", value)
        return value


def _env_list(reader: _Reader, key: str, dropped: list[str]) -> tuple[dict[str, Any], ...]:
    items = reader.mapping_list(key, "name")
    kept = []
    for i, item in enumerate(items):
        if not ENV_NAME.match(item["name"]):
            raise reader.fail(f"{key}[{i}].name", "an environment variable name", item["name"])
        unknown = sorted(set(item) - {"name", "value", "valueFrom"})
        if unknown:
            raise ConfigError(
                f"{reader.source}: {reader.where(f'{key}[{i}].{unknown[0]}')}: "
                "unknown key (known: name, value, valueFrom)"
            )
        if ("value" in item) == ("valueFrom" in item):
            raise reader.fail(f"{key}[{i}]", "exactly one of value / valueFrom", item)
        if "value" in item and not isinstance(item["value"], str):
            raise reader.fail(f"{key}[{i}].value", "a string (quote numbers)", item["value"])
        if item["name"] in NATS_VARIABLES:
            dropped.append(item["name"])
            continue
        kept.append(dict(item))
    return tuple(kept)


def _role(reader: _Reader, key: str, dropped: list[str]) -> RoleSpec | None:
    raw = reader.mapping(key)
    if raw is None:
        return None
    role = _Reader(raw, reader.where(key), reader.source)
    role.check_known(ROLE_FIELDS if key == "nnWorker" else ROLE_FIELDS[:-1])
    return RoleSpec(
        replicas=role.positive_int("replicas"),
        resources=role.mapping("resources"),
        volume_mounts=role.mapping_list("volumeMounts", "name"),
        env=_env_list(role, "env", dropped),
        image=role.string("image"),
        nproc_per_node=role.positive_int("nprocPerNode", 1) if key == "nnWorker" else 1,
    )


def _paths(spec: _Reader) -> tuple[_Reader, dict[str, str]]:
    """The reader the four config/entry paths come from and, per spec-level key, the key it
    has in that reader: ``spec.persiaEnv`` (PERSIA's current format) or ``spec`` itself."""
    if "persiaEnv" not in spec.data:
        return spec, {old: old for old in PERSIA_ENV.values()}
    for old in PERSIA_ENV.values():
        if old in spec.data:
            raise ConfigError(
                f"{spec.source}: {spec.where(old)}: given with spec.persiaEnv; keep one format "
                f"(spec.persiaEnv.{next(k for k, v in PERSIA_ENV.items() if v == old)}, "
                "PERSIA's current one)"
            )
    env = _Reader(spec.mapping("persiaEnv") or {}, spec.where("persiaEnv"), spec.source)
    env.check_known(tuple(PERSIA_ENV))
    return env, {old: new for new, old in PERSIA_ENV.items()}


def parse_persia_job(document: Any, *, source: str = "job.yml") -> PersiaJobSpec:
    """Validate one PersiaJob document (a parsed YAML mapping)."""
    top = _Reader(document, "", source)
    if document.get("kind") != "PersiaJob":
        raise top.fail("kind", "PersiaJob", document.get("kind"))
    api = document.get("apiVersion")
    if not isinstance(api, str) or not api.startswith("persia.com/"):
        raise top.fail("apiVersion", "persia.com/v1", api)
    meta = _Reader(document.get("metadata"), "metadata", source)
    name = meta.string("name", required=True)
    namespace = meta.string("namespace", "default")
    for key, value in (("name", name), ("namespace", namespace)):
        # role suffixes such as "-embedding-ps" and pod ordinals must still fit 63 characters
        if not DNS_LABEL.match(value) or len(value) > 40:
            raise meta.fail(key, "a DNS label of at most 40 characters ([a-z0-9-])", value)
    raw_spec = document.get("spec")
    if isinstance(raw_spec, dict):
        raw_spec = {OLD_NAMES.get(k, k): v for k, v in raw_spec.items()}
    spec = _Reader(raw_spec, "spec", source)
    spec.check_known(SPEC_FIELDS)
    dropped: list[str] = []
    roles = {key: role for key in ROLE_KEYS if (role := _role(spec, key, dropped)) is not None}
    if not roles:
        raise ConfigError(f"{source}: spec: no role given (any of {', '.join(ROLE_KEYS)})")
    paths, key = _paths(spec)
    job = PersiaJobSpec(
        name=name,
        namespace=namespace,
        global_config_path=paths.string(key["globalConfigPath"], required=True),
        embedding_config_path=paths.string(key["embeddingConfigPath"], required=True),
        nn_worker_entry=paths.string(key["nnWorkerPyEntryPath"]),
        data_loader_entry=paths.string(key["dataLoaderPyEntryPath"]),
        enable_metrics=spec.boolean("enableMetrics", True),
        volumes=spec.mapping_list("volumes", "name"),
        env=_env_list(spec, "env", dropped),
        log_level=spec.choice("logLevel", "info", LOG_LEVELS),
        restart_policy=spec.choice("restartPolicy", "Never", ("Never", "OnFailure")),
        image_pull_policy=spec.choice(
            "imagePullPolicy", "Always", ("Always", "IfNotPresent", "Never")
        ),
        roles=roles,
        dropped_env=tuple(dropped),
    )
    if "nnWorker" in roles and not job.nn_worker_entry:
        raise paths.fail(key["nnWorkerPyEntryPath"], "the train.py path (nnWorker is given)", None)
    if "dataloader" in roles and not job.data_loader_entry:
        raise paths.fail(key["dataLoaderPyEntryPath"], "the data_loader.py path", None)
    return job
