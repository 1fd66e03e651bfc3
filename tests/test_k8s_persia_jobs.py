"""PERSIA's PersiaJob formats, each read by ``persia-k8s-utils gencrd``, and its other commands.

PERSIA's job format changed over time (``k8s/src/crd.rs`` in PersiaML/PERSIA): the current one
puts the config and entry paths under ``spec.persiaEnv`` (``PERSIA_GLOBAL_CONFIG``,
``PERSIA_EMBEDDING_CONFIG``, ``PERSIA_NN_WORKER_ENTRY``, ``PERSIA_DATALOADER_ENTRY``); an older
one had ``globalConfigPath`` ... at spec level; the oldest also used other role names. The
fixtures in ``tests/data/persia_k8s/`` are hand-written with the structure of each of PERSIA's
``k8s/example/*.yml`` versions (the file header names the upstream path and commit).
PERSIA's ``operator`` and ``server`` need a controller Pyrsia does not have: they exit 2 with
the commands to use instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from persia.k8s_utils import generate
from persia.launcher import SUBCOMMANDS
from pyrsia.shared.errors import ConfigError
from tests.test_k8s_manifests import check_container, launcher_args, pod_templates

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "data" / "persia_k8s"
CURRENT = FIXTURES / "adult_income_persia_env.yml"
JOBS = sorted(FIXTURES.glob("*.yml"))


def _manifests(text: str) -> list[dict]:
    out, notes = generate(text, source="job.yml")
    docs = list(yaml.safe_load_all(out))
    assert any("NatsCluster" in n for n in notes)
    return docs


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_each_persia_job_format_produces_runnable_manifests(path):
    docs = _manifests(path.read_text())
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert by_name[("StatefulSet", "ctr-train-embedding-ps")]["spec"]["replicas"] == 2
    assert by_name[("StatefulSet", "ctr-train-embedding-worker")]["spec"]["replicas"] == 1
    assert by_name[("Job", "ctr-train-nn-worker")]["spec"]["completions"] == 1
    assert by_name[("Job", "ctr-train-data-loader")]["spec"]["completions"] == 1
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    for doc, template in pod_templates(docs):
        volumes = {v["name"] for v in template["spec"].get("volumes", [])}
        for container in template["spec"]["containers"]:
            where = f"{doc['kind']}/{doc['metadata']['name']}"
            check_container(container, volumes, secrets, where)
            if container.get("command") != ["persia-launcher"]:
                continue  # redis, the metrics gateway
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["PERSIA_GLOBAL_CONFIG"] == "/home/ctr/config/global_config.yml", where
            assert env["PERSIA_EMBEDDING_CONFIG"] == "/home/ctr/config/embedding_config.yml"
            assert env["PERSIA_NN_WORKER_ENTRY"] == "/home/ctr/train.py"
            assert env["PERSIA_DATALOADER_ENTRY"].startswith("/home/ctr/data_")
            assert not {"PERSIA_NATS_IP", "PERSIA_NATS_URL"} & set(env)
            argv = launcher_args(container)
            module = __import__(SUBCOMMANDS[argv[0]][0], fromlist=["build_parser"])
            module.build_parser().parse_args(argv[1:])
    nn = by_name[("Job", "ctr-train-nn-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert nn["args"][nn["args"].index("--nproc-per-node") + 1] == "2"
    assert nn["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_persia_env_and_spec_level_paths_give_the_same_job():
    def containers(path: Path) -> list:
        docs = [d for d in _manifests(path.read_text()) if d["kind"] != "Secret"]
        for d in docs:  # the generated token differs from run to run
            for c in d["spec"].get("template", {}).get("spec", {}).get("containers", []):
                c["env"] = [e for e in c.get("env", []) if e["name"] != "ENABLE_CUDA"]
        return docs

    assert containers(CURRENT) == containers(FIXTURES / "adult_income_config_paths.yml")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("PERSIA_GLOBAL_CONFIG: /home", "PERSIA_GLOBAL_CONFIGS: /home"),
            "spec.persiaEnv.PERSIA_GLOBAL_CONFIGS: unknown key (known: PERSIA_GLOBAL_CONFIG,",
        ),
        (
            ("    PERSIA_GLOBAL_CONFIG: /home/ctr/config/global_config.yml\n", ""),
            "spec.persiaEnv.PERSIA_GLOBAL_CONFIG: expected a non-empty string, got None",
        ),
        (
            (
                "PERSIA_EMBEDDING_CONFIG: /home/ctr/config/embedding_config.yml",
                "PERSIA_EMBEDDING_CONFIG: 3",
            ),
            "spec.persiaEnv.PERSIA_EMBEDDING_CONFIG: expected a non-empty string, got 3",
        ),
        (
            ("    PERSIA_NN_WORKER_ENTRY: /home/ctr/train.py\n", ""),
            "spec.persiaEnv.PERSIA_NN_WORKER_ENTRY: expected the train.py path",
        ),
        (
            ("  persiaEnv:\n", "  globalConfigPath: /x.yml\n  persiaEnv:\n"),
            "spec.globalConfigPath: given with spec.persiaEnv",
        ),
        (
            ("    nprocPerNode: 2", '    nprocPerNode: "2"'),
            "spec.nnWorker.nprocPerNode: expected a positive integer, got '2'",
        ),
        (
            ("  dataloader:\n    replicas: 1", "  dataloader:\n    replicas: one"),
            "spec.dataloader.replicas: expected a positive integer, got 'one'",
        ),
        (
            ("      - name: ENABLE_CUDA\n", "      - name: ENABLE_CUDA\n        valu: x\n"),
            "spec.nnWorker.env[1].valu: unknown key (known: name, value, valueFrom)",
        ),
        (
            ("    nprocPerNode: 2", "    nprocPerNode: 2\n    gpus: 2"),
            "spec.nnWorker.gpus: unknown key",
        ),
    ],
)
def test_bad_current_format_jobs_name_the_key(edit, message):
    text = CURRENT.read_text()
    assert edit[0] in text
    with pytest.raises(ConfigError) as info:
        generate(text.replace(edit[0], edit[1], 1), source="job.yml")
    assert str(info.value).startswith("job.yml: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spec", "persiaEnv"), "/home/ctr", "spec.persiaEnv: expected a mapping, got '/home/ctr'"),
        (("spec", "persiaEnv"), None, "spec.persiaEnv.PERSIA_GLOBAL_CONFIG: expected a non-empty"),
        (("spec", "env"), {"name": "A"}, "spec.env: expected a list of mappings"),
        (("spec", "nnWorker", "resources"), ["cpu"], "spec.nnWorker.resources: expected a mapping"),
        (("spec", "enableMetrics"), "yes", "spec.enableMetrics: expected true or false"),
        (("spec", "embeddingWorker"), 2, "spec.embeddingWorker: expected a mapping, got 2"),
    ],
)
def test_wrong_types_in_the_current_format_name_the_key(path, value, message):
    documents = list(yaml.safe_load_all(CURRENT.read_text()))
    node = documents[0]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError) as info:
        generate(yaml.safe_dump_all(documents), source="job.yml")
    assert str(info.value).startswith("job.yml: ")
    assert message in str(info.value)


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "persia.k8s_utils", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
    )


def test_gencrd_takes_the_job_file_as_argument_for_a_kubectl_pipe():
    done = _cli("gencrd", str(CURRENT))
    assert done.returncode == 0, done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout)]
    assert kinds.count("StatefulSet") == 2 and kinds.count("Job") == 2


def test_gencrd_without_a_job_says_no_crd_is_needed():
    # PERSIA's `persia-k8s-utils gencrd --output jobs.persia.com.yaml` wrote the CRD
    done = _cli("gencrd", "--output", "jobs.persia.com.yaml")
    assert done.returncode == 2 and done.stdout == ""
    assert "no CustomResourceDefinition" in done.stderr
    assert "persia-k8s-utils gencrd job.yml | kubectl apply -f -" in done.stderr
    assert not (REPO / "jobs.persia.com.yaml").exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ("operator",),
            [
                "persia-k8s-utils gencrd job.yml | kubectl apply -f -",
                "kubectl delete all,secret -l persia-job=<job name>",
            ],
        ),
        (
            ("server", "--port", "8080"),
            [
                "persia-k8s-utils gencrd job.yml | kubectl apply -f -",
                "kubectl get pods -l persia-job=<job name>",
                "/apply",
                "/listpods",
            ],
        ),
    ],
)
def test_operator_and_server_exit_2_with_the_commands_to_use(argv, says):
    done = _cli(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert "Pyrsia needs no operator" in done.stderr
    for text in says:
        assert text in done.stderr, done.stderr
