"""Plain Kubernetes manifests for a :class:`~persia._k8s.spec.PersiaJobSpec`.

PERSIA ran an operator that turned a PersiaJob into pods. Pyrsia writes the objects
themselves, so ``kubectl apply -f`` on any cluster runs the job without an operator:

- Redis (the registry): a Deployment and a Service ``<job>-redis:6379``.
- Embedding PS and embedding workers: a StatefulSet each (the pod ordinal, label
  ``apps.kubernetes.io/pod-index`` of Kubernetes 1.28+, is the replica index) with a
  headless Service; ports 8888 and 8887 as in PERSIA.
- NN workers and data loaders: an Indexed Job each (the completion index is the
  node rank / replica index); the NN workers' headless Service gives pod 0 the DNS name
  the other nodes rendezvous at.
- With ``enableMetrics`` (PERSIA's default true): a Prometheus push gateway Deployment and
  Service ``<job>-metrics-gateway:9091``, named in ``PERSIA_METRICS_GATEWAY_ADDR``.

Every Pyrsia container binds 0.0.0.0 and advertises its pod IP, finds the others
through ``PERSIA_REDIS_URL``, reads ``PERSIA_AUTH_TOKEN`` from the job's Secret (generated
with a random token unless an existing one is named), and gets the job's env, then its
role's env.
"""

from __future__ import annotations

from typing import Any

from persia._k8s.spec import PersiaJobSpec, RoleSpec
from pyrsia.shared.constants import DEFAULT_EMBEDDING_WORKER_PORT, DEFAULT_PS_PORT
from pyrsia.shared.errors import InvalidInputError

DEFAULT_IMAGE = "pyrsia:latest"
REDIS_IMAGE = "redis:7"
GATEWAY_IMAGE = "prom/pushgateway:v1.9.0"
REDIS_PORT = 6379
GATEWAY_PORT = 9091
NN_MASTER_PORT = 29500
LOG_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "critical": "CRITICAL",
}
"""PERSIA's (Rust) log level names -> Python's."""
JOB_LABEL = "persia-job"
ROLE_LABEL = "persia-role"


def _labels(job: PersiaJobSpec, role: str) -> dict[str, str]:
    return {JOB_LABEL: job.name, ROLE_LABEL: role}


def _meta(job: PersiaJobSpec, name: str, role: str) -> dict[str, Any]:
    return {"name": name, "namespace": job.namespace, "labels": _labels(job, role)}


def _service(job: PersiaJobSpec, name: str, role: str, port: int, *, headless: bool) -> dict:
    spec: dict[str, Any] = {
        "selector": _labels(job, role),
        "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True  # pods find each other before they are ready
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, name, role), "spec": spec}


def auth_secret_name(job: PersiaJobSpec) -> str:
    return f"{job.name}-auth"


def _auth_secret(job: PersiaJobSpec, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, auth_secret_name(job), "auth"),
        "type": "Opaque",
        "stringData": {"token": token},
    }


def _common_env(job: PersiaJobSpec, secret: str) -> list[dict[str, Any]]:
    token_ref = {"secretKeyRef": {"name": secret, "key": "token"}}
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PERSIA_ADVERTISE_HOST", "value": "$(POD_IP)"},
        {"name": "PERSIA_BIND_HOST", "value": "0.0.0.0"},
        {"name": "PERSIA_REDIS_URL", "value": f"redis://{job.name}-redis:{REDIS_PORT}/0"},
        {"name": "PERSIA_JOB_ID", "value": job.name},
        {"name": "PERSIA_EMBEDDING_CONFIG", "value": job.embedding_config_path},
        {"name": "PERSIA_GLOBAL_CONFIG", "value": job.global_config_path},
        {"name": "LOG_LEVEL", "value": LOG_LEVELS[job.log_level]},
        {"name": "PERSIA_AUTH_TOKEN", "valueFrom": token_ref},
    ]
    if job.enable_metrics:
        env.append(
            {
                "name": "PERSIA_METRICS_GATEWAY_ADDR",
                "value": f"{job.name}-metrics-gateway:{GATEWAY_PORT}",
            }
        )
    if job.nn_worker_entry:
        env.append({"name": "PERSIA_NN_WORKER_ENTRY", "value": job.nn_worker_entry})
    if job.data_loader_entry:
        env.append({"name": "PERSIA_DATALOADER_ENTRY", "value": job.data_loader_entry})
    return env


def _container(
    job: PersiaJobSpec,
    role: RoleSpec,
    name: str,
    args: list[str],
    extra_env: list[dict],
    secret: str,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": role.image or DEFAULT_IMAGE,
        "imagePullPolicy": job.image_pull_policy,
        "command": ["persia-launcher"],
        "args": args,
        "env": [*_common_env(job, secret), *extra_env, *job.env, *role.env],
    }
    if role.resources:
        container["resources"] = role.resources
    if role.volume_mounts:
        container["volumeMounts"] = list(role.volume_mounts)
    return container


def _pod_template(job: PersiaJobSpec, role_name: str, container: dict, **spec: Any) -> dict:
    pod_spec: dict[str, Any] = {"containers": [container], **spec}
    if job.volumes:
        pod_spec["volumes"] = list(job.volumes)
    return {"metadata": {"labels": _labels(job, role_name)}, "spec": pod_spec}


def _ordinal_env() -> list[dict[str, Any]]:
    # A StatefulSet pod's ordinal is the label apps.kubernetes.io/pod-index (Kubernetes 1.28+).
    return [
        {
            "name": "REPLICA_INDEX",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
            },
        }
    ]


def _server(
    job: PersiaJobSpec, key: str, role_name: str, command: str, port: int, secret: str
) -> list[dict]:
    role = job.roles[key]
    name = f"{job.name}-{role_name}"
    args = [
        command,
        "--replica-index",
        "$(REPLICA_INDEX)",
        "--replica-size",
        str(role.replicas),
        "--port",
        str(port),
    ]
    container = _container(job, role, role_name, args, _ordinal_env(), secret)
    container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    # a TCP probe: /health answers 401 without the job's token (PERSIA_AUTH_TOKEN)
    container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 2}
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(job, name, role_name),
        "spec": {
            "serviceName": name,
            "replicas": role.replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _labels(job, role_name)},
            "template": _pod_template(job, role_name, container),
        },
    }
    return [_service(job, name, role_name, port, headless=True), stateful_set]


def _indexed_job(
    job: PersiaJobSpec,
    role_name: str,
    role: RoleSpec,
    args: list[str],
    secret: str,
    **pod_spec: Any,
) -> dict:
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    env = [{"name": "REPLICA_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index}}}]
    container = _container(job, role, role_name, args, env, secret)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(job, f"{job.name}-{role_name}", role_name),
        "spec": {
            "completionMode": "Indexed",
            "completions": role.replicas,
            "parallelism": role.replicas,
            "backoffLimit": 0 if job.restart_policy == "Never" else 3,
            "template": _pod_template(
                job, role_name, container, restartPolicy=job.restart_policy, **pod_spec
            ),
        },
    }


def _nn_worker(job: PersiaJobSpec, secret: str) -> list[dict]:
    role = job.roles["nnWorker"]
    name = f"{job.name}-nn-worker"
    master = f"{name}-0.{name}.{job.namespace}.svc.cluster.local"
    args = [
        "nn-worker",
        "$(PERSIA_NN_WORKER_ENTRY)",
        "--nproc-per-node",
        str(role.nproc_per_node),
        "--nnodes",
        str(role.replicas),
        "--node-rank",
        "$(REPLICA_INDEX)",
        "--master-addr",
        master if role.replicas > 1 else "127.0.0.1",
        "--master-port",
        str(NN_MASTER_PORT),
    ]
    manifest = _indexed_job(job, "nn-worker", role, args, secret, subdomain=name)
    return [_service(job, name, "nn-worker", NN_MASTER_PORT, headless=True), manifest]


def _data_loader(job: PersiaJobSpec, secret: str) -> list[dict]:
    role = job.roles["dataloader"]
    args = [
        "data-loader",
        "$(PERSIA_DATALOADER_ENTRY)",
        "--replica-index",
        "$(REPLICA_INDEX)",
        "--replica-size",
        str(role.replicas),
    ]
    return [_indexed_job(job, "data-loader", role, args, secret)]


def _single(job: PersiaJobSpec, role_name: str, image: str, port: int, args: list[str]) -> list:
    name = f"{job.name}-{role_name}"
    container = {
        "name": role_name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(job, name, role_name),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _labels(job, role_name)},
            "template": {
                "metadata": {"labels": _labels(job, role_name)},
                "spec": {"containers": [container]},
            },
        },
    }
    return [_service(job, name, role_name, port, headless=False), deployment]


def build_manifests(
    job: PersiaJobSpec, *, auth_token: str | None = None, auth_secret: str | None = None
) -> list[dict[str, Any]]:
    """Every object of the job, in the order ``kubectl apply`` should create them.

    Every Pyrsia container reads ``PERSIA_AUTH_TOKEN`` from the Secret ``auth_secret``
    (one that already exists) or, by default, from a generated Secret ``<job>-auth``
    holding ``auth_token`` (services bound to 0.0.0.0 require a token).
    """
    if auth_secret is None and not auth_token:
        raise InvalidInputError(
            "auth_token",
            "auth_token (a new Secret) or auth_secret",
            message="build_manifests: pass auth_token (a new Secret) or auth_secret",
        )
    secret = auth_secret or auth_secret_name(job)
    objects = [] if auth_secret else [_auth_secret(job, auth_token or "")]
    objects += _single(job, "redis", REDIS_IMAGE, REDIS_PORT, ["--save", "", "--appendonly", "no"])
    if job.enable_metrics:
        objects += _single(job, "metrics-gateway", GATEWAY_IMAGE, GATEWAY_PORT, [])
    if "embeddingParameterServer" in job.roles:
        objects += _server(
            job,
            "embeddingParameterServer",
            "embedding-ps",
            "embedding-parameter-server",
            DEFAULT_PS_PORT,
            secret,
        )
    if "embeddingWorker" in job.roles:
        objects += _server(
            job,
            "embeddingWorker",
            "embedding-worker",
            "embedding-worker",
            DEFAULT_EMBEDDING_WORKER_PORT,
            secret,
        )
    if "nnWorker" in job.roles:
        objects += _nn_worker(job, secret)
    if "dataloader" in job.roles:
        objects += _data_loader(job, secret)
    return objects
