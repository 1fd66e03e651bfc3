"""persia-k8s-utils: a PersiaJob YAML (PERSIA's k8s example shape) -> plain Kubernetes manifests.

No cluster runs here, so the manifests are checked against the Kubernetes schema
essentials that can be checked offline: apiVersion/kind pairs, object names, selectors
matching pod labels, Services selecting pods, ports, env entries and $(VAR) references,
restart policies, volumes; every container command is a valid persia-launcher
invocation; and the YAML round-trips through PyYAML.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from persia.k8s_utils import generate
from persia.launcher import SUBCOMMANDS
from pyrsia.shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "data" / "persia_job_adult.yml"
KINDS = {
    "Secret": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# variables Kubernetes itself puts into every container of an Indexed Job / any pod
IMPLICIT_ENV = {"JOB_COMPLETION_INDEX"}


def manifests(text: str | None = None, **kw) -> list[dict]:
    out, _ = generate(text if text is not None else JOB.read_text(), **kw)
    docs = list(yaml.safe_load_all(out))
    assert list(yaml.safe_load_all(yaml.safe_dump_all(docs, sort_keys=False))) == docs
    return docs


def pod_templates(docs: list[dict]) -> list[tuple[dict, dict]]:
    return [(d, d["spec"]["template"]) for d in docs if d["kind"] not in ("Service", "Secret")]


def check_container(container: dict, volumes: set[str], secrets: set[str], where: str) -> None:
    assert DNS_LABEL.match(container["name"]), where
    assert isinstance(container["image"], str) and container["image"], where
    defined = set(IMPLICIT_ENV)
    for entry in container.get("env", []):
        assert re.match(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", entry["name"]), where
        assert ("value" in entry) != ("valueFrom" in entry), f"{where}: {entry}"
        if "value" in entry:
            assert isinstance(entry["value"], str), f"{where}: {entry}"
            # Kubernetes expands $(VAR) only for variables defined earlier in the list
            for ref in ENV_REF.findall(entry["value"]):
                assert ref in defined, f"{where}: {entry['name']} uses $({ref}) before it is set"
        else:
            assert set(entry["valueFrom"]) <= {"fieldRef", "secretKeyRef", "configMapKeyRef"}
            assert len(entry["valueFrom"]) == 1, f"{where}: {entry}"
            if "secretKeyRef" in entry["valueFrom"]:
                assert entry["valueFrom"]["secretKeyRef"]["name"] in secrets, where
        defined.add(entry["name"])
    for arg in [*container.get("command", []), *container.get("args", [])]:
        assert isinstance(arg, str), f"{where}: {arg!r} must be a string"
        for ref in ENV_REF.findall(arg):
            assert ref in defined, f"{where}: argument $({ref}) is not an env variable"
    for port in container.get("ports", []):
        assert 0 < port["containerPort"] < 65536 and port["protocol"] in ("TCP", "UDP"), where
    for mount in container.get("volumeMounts", []):
        assert mount["name"] in volumes and mount["mountPath"].startswith("/"), where


def launcher_args(container: dict) -> list[str]:
    env = {e["name"]: e.get("value", "0") for e in container["env"]}
    env["REPLICA_INDEX"] = "0"
    return [ENV_REF.sub(lambda m: env.get(m.group(1), "0"), a) for a in container["args"]]


def test_objects_have_kubernetes_schema_essentials():
    docs = manifests()
    for doc in docs:
        body = {"type", "stringData"} if doc["kind"] == "Secret" else {"spec"}
        assert set(doc) == {"apiVersion", "kind", "metadata"} | body, doc.get("kind")
        assert KINDS[doc["kind"]] == doc["apiVersion"]
        meta = doc["metadata"]
        assert DNS_LABEL.match(meta["name"]) and len(meta["name"]) <= 63
        assert meta["namespace"] == "recsys"
        assert meta["labels"]["persia-job"] == "adult-income"
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(set(names)) == len(names)  # no duplicates
    templates = pod_templates(docs)
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    for doc, template in templates:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        labels = template["metadata"]["labels"]
        if doc["kind"] in ("Deployment", "StatefulSet"):
            selector = doc["spec"]["selector"]["matchLabels"]
            assert selector.items() <= labels.items(), where
            assert template["spec"].get("restartPolicy", "Always") == "Always", where
        if doc["kind"] == "Job":
            assert doc["spec"]["completionMode"] == "Indexed"
            assert doc["spec"]["completions"] == doc["spec"]["parallelism"] >= 1
            assert template["spec"]["restartPolicy"] in ("Never", "OnFailure"), where
        volumes = {v["name"] for v in template["spec"].get("volumes", [])}
        for container in template["spec"]["containers"]:
            check_container(container, volumes, secrets, where)
    # every Service selects the pods of some workload, on a port they expose (or, headless,
    # gives them DNS names); StatefulSets name an existing headless Service
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for service in services.values():
        matched = [
            t
            for _, t in templates
            if service["spec"]["selector"].items() <= t["metadata"]["labels"].items()
        ]
        assert matched, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert 0 < port["port"] < 65536
            exposed = {
                p["containerPort"]
                for t in matched
                for c in t["spec"]["containers"]
                for p in c.get("ports", [])
            }
            assert service["spec"].get("clusterIP") == "None" or port["targetPort"] in exposed
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            assert services[doc["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


def test_roles_replicas_ports_and_commands():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in manifests()}
    ps = docs[("StatefulSet", "adult-income-embedding-ps")]
    worker = docs[("StatefulSet", "adult-income-embedding-worker")]
    nn = docs[("Job", "adult-income-nn-worker")]
    loader = docs[("Job", "adult-income-data-loader")]
    assert ("Deployment", "adult-income-redis") in docs and (
        "Service",
        "adult-income-redis",
    ) in docs
    assert ("Deployment", "adult-income-metrics-gateway") in docs  # enableMetrics defaults true
    assert ps["spec"]["replicas"] == 2 and worker["spec"]["replicas"] == 1
    assert nn["spec"]["completions"] == 2 and loader["spec"]["completions"] == 1
    containers = {
        name: d["spec"]["template"]["spec"]["containers"][0]
        for name, d in (("ps", ps), ("worker", worker), ("nn", nn), ("loader", loader))
    }
    assert containers["ps"]["ports"][0]["containerPort"] == 8888  # PERSIA's PS port
    # a TCP probe: /health needs the job's token once PERSIA_AUTH_TOKEN is set
    assert containers["ps"]["readinessProbe"]["tcpSocket"] == {"port": 8888}
    assert containers["worker"]["ports"][0]["containerPort"] == 8887  # PERSIA's worker port
    for name, container in containers.items():
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PERSIA_REDIS_URL"] == "redis://adult-income-redis:6379/0", name
        assert env["PERSIA_BIND_HOST"] == "0.0.0.0" and env["PERSIA_JOB_ID"] == "adult-income"
        assert env["PERSIA_METRICS_GATEWAY_ADDR"] == "adult-income-metrics-gateway:9091"
        assert env["LOG_LEVEL"] == "DEBUG" and env["OMP_NUM_THREADS"] == "2"
        assert "PERSIA_NATS_IP" not in env  # dropped: Pyrsia uses Redis
        (auth,) = [e for e in container["env"] if e["name"] == "PERSIA_AUTH_TOKEN"]
        assert auth["valueFrom"]["secretKeyRef"] == {"name": "adult-income-auth", "key": "token"}
        assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/workspace"}]
        # a valid invocation for the subcommand's own parser
        argv = launcher_args(container)
        module = __import__(SUBCOMMANDS[argv[0]][0], fromlist=["build_parser"])
        module.build_parser().parse_args(argv[1:])
    assert containers["nn"]["image"] == "pyrsia-cuda:latest"
    assert containers["nn"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    nn_args = containers["nn"]["args"]
    assert nn_args[nn_args.index("--nnodes") + 1] == "2"
    assert nn_args[nn_args.index("--master-addr") + 1] == (
        "adult-income-nn-worker-0.adult-income-nn-worker.recsys.svc.cluster.local"
    )
    assert nn["spec"]["template"]["spec"]["subdomain"] == "adult-income-nn-worker"
    env = {e["name"]: e.get("value") for e in containers["nn"]["env"]}
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_persias_older_role_names_and_image_override():
    text = JOB.read_text()
    for old, new in (
        ("embeddingServer", "embeddingParameterServer"),
        ("middlewareServer", "embeddingWorker"),
        ("trainer", "nnWorker"),
        ("trainerPyEntryPath", "nnWorkerPyEntryPath"),
    ):
        text = text.replace(f"  {new}:", f"  {old}:")
    docs = manifests(text, image="registry.local/pyrsia:1")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("StatefulSet") == 2 and kinds.count("Job") == 2
    images = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in docs
        if d["kind"] in ("StatefulSet", "Job")
    }
    assert images["adult-income-embedding-ps"] == "registry.local/pyrsia:1"
    assert images["adult-income-nn-worker"] == "pyrsia-cuda:latest"  # its own image wins


def test_existing_auth_secret_is_referenced_not_generated():
    docs = manifests(auth_secret="team-token")
    assert not any(d["kind"] == "Secret" for d in docs)
    for _, template in pod_templates(docs):
        for container in template["spec"]["containers"]:
            refs = [
                e["valueFrom"]["secretKeyRef"]["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            ]
            assert refs in ([], ["team-token"])
    # two runs generate different tokens
    first, second = (generate(JOB.read_text())[0] for _ in range(2))
    assert first != second


def test_metrics_off_means_no_gateway():
    text = JOB.read_text().replace("  logLevel: debug", "  logLevel: debug\n  enableMetrics: false")
    docs = manifests(text)
    assert not any("metrics-gateway" in d["metadata"]["name"] for d in docs)
    for _, template in pod_templates(docs):
        names = {e["name"] for c in template["spec"]["containers"] for e in c.get("env", [])}
        assert "PERSIA_METRICS_GATEWAY_ADDR" not in names


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("replicas: 2\n    resources", "replicas: 0\n    resources"),
            "spec.embeddingParameterServer.replicas: expected a positive integer, got 0",
        ),
        (("name: adult-income\n", "name: Adult_Income\n"), "metadata.name: expected a DNS label"),
        (("  logLevel: debug", "  logLevel: loud"), "spec.logLevel: expected trace or debug"),
        (("  logLevel: debug", "  logLevel: debug\n  gpuCount: 3"), "spec.gpuCount: unknown key"),
        (("  nnWorkerPyEntryPath: /workspace/train.py\n", ""), "spec.nnWorkerPyEntryPath"),
        (('value: "2"', "value: 2"), "spec.env[1].value: expected a string"),
        (("kind: PersiaJob", "kind: Job"), "no PersiaJob document"),
    ],
)
def test_bad_job_files_name_the_key(edit, message):
    text = JOB.read_text()
    assert edit[0] in text
    with pytest.raises(ConfigError) as info:
        generate(text.replace(edit[0], edit[1], 1), source="job.yml")
    assert message in str(info.value)
    assert str(info.value).startswith("job.yml")


def test_cli_writes_the_file_and_fails_in_one_line(tmp_path):
    out = tmp_path / "manifests.yml"
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.k8s_utils",
            "gencrd",
            "--job",
            str(JOB),
            "--output",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(list(yaml.safe_load_all(out.read_text()))) == 12
    assert "skipped a NatsCluster document" in ok.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text(
        JOB.read_text().replace("replicas: 2\n    resources", "replicas: -1\n    resources")
    )
    failed = subprocess.run(
        [sys.executable, "-m", "persia.k8s_utils", "manifests", "--job", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 2 and failed.stdout == ""
    assert failed.stderr.strip().count("\n") == 0 and "replicas" in failed.stderr
