"""The Adult job under ``docker compose``, across containers (``make compose-test``).

Redis, 2 PS replicas, 1 embedding worker, the NN worker with 2 ranks and 1 data loader, each
in its own container on the compose network, finding each other only through the Redis
registry and compose's DNS (no host networking). In order:

1. an unfaulted run with the ``monitoring`` profile: Prometheus (Debian's package) scrapes
   every role through the registry-fed target file; each rank waits for a final scrape
   (``PYRSIA_FINAL_SCRAPE_S``), so the highest ``pyrsia_nn_worker_steps`` Prometheus holds
   for it is the steps it trained; the test AUC must be >= 0.89; the PS replicas'
   acknowledged updates are counted at their stop;
2. a second run with a PS container killed (``docker kill``) right after the step-50
   checkpoint: the job stops by itself, naming the lost replica; it is then started again
   with ``PERSIA_RESUME=1``, resumes from the checkpoint and completes: AUC >= 0.89 and no
   acknowledged update lost (checkpoint total + the resumed run's = the unfaulted run's);
3. ``docker compose down --volumes`` leaves no container, network or volume of the project.

Needs a Docker engine and the images of ``make images``; skips, saying why, without them.
Figures go to ``bench_results/compose.json``.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.compose.project import (
    OFFLINE_IMAGES,
    REPO,
    ComposeProject,
    auc_of,
    compose_cli,
    docker,
)

pytestmark = [pytest.mark.compose, pytest.mark.timeout(2400)]

AUC_MIN = 0.89
CHECKPOINT_EVERY = 50
PS = ["embedding_parameter_server_0", "embedding_parameter_server_1"]
JOB = ["redis", *PS, "embedding_worker_0", "nn_worker", "data_loader_0"]
JOB_TIMEOUT_S = 900
RESULTS = REPO / "bench_results" / "compose.json"
ROLES = {"embedding_parameter_server", "embedding_worker", "nn_worker"}
FINAL_SCRAPE_S = 60
"""Each rank's wait for its final scrape: the target file's refresh (5 s) and Prometheus's
first scrape of a new target (within its 5 s interval), many times over."""


def _skip_reason() -> str | None:
    if shutil.which("docker") is None:
        return "the docker command is not installed (make compose-test installs it as root)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers (make compose-test starts dockerd when run as root)"
    if compose_cli() is None:
        return "neither the docker compose plugin nor docker-compose is installed"
    missing = [
        i
        for i in OFFLINE_IMAGES.values()
        if subprocess.run(["docker", "image", "inspect", i], capture_output=True).returncode
    ]
    return f"images {missing} are not built: run make images" if missing else None


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    workspace = tmp_path_factory.mktemp("compose") / "adult_income"
    shutil.copytree(
        REPO / "examples/adult_income",
        workspace,
        ignore=shutil.ignore_patterns("*.npz", "ckpt", "__pycache__"),
    )
    config = workspace / "config/global_config.yml"
    data = yaml.safe_load(config.read_text())
    data["common_config"]["checkpointing_config"].update(
        checkpoint_dir="/workspace/ckpt",
        checkpoint_every_n_steps=CHECKPOINT_EVERY,
        keep_checkpoints=5,
    )
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    subprocess.run([sys.executable, "data_prep.py"], cwd=workspace, check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    variables = {
        **OFFLINE_IMAGES,
        "PERSIA_WORKSPACE": str(workspace),
        "NPROC_PER_NODE": "2",
        "PERSIA_RESUME": "0",
        "PROMETHEUS_PORT": str(port),
    }
    compose = ComposeProject(compose_cli(), f"pyrsiatest{int(time.time())}", variables)
    compose.workspace = workspace
    print(f"\ncompose: {' '.join(compose.cli)}, project {compose.name}, workspace {workspace}")
    yield compose
    compose.run("--profile", "monitoring", "down", "--volumes", "--remove-orphans")


def _record(key: str, value: object) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[key] = value
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))


def _get(port: str, path: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return json.loads(answer.read())["data"]
    except OSError:
        return None  # Prometheus still starting


def _query(port: str, promql: str) -> list[dict]:
    data = _get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    return [] if data is None else data["result"]


def _targets(port: str) -> list[str]:
    """Each target Prometheus knows: role, health and its last scrape's error."""
    data = _get(port, "/api/v1/targets") or {"activeTargets": []}
    return [
        f"{t['labels'].get('role')}/{t['labels'].get('replica_index')} {t['scrapeUrl']}: "
        f"{t['health']} {t.get('lastError', '')}".rstrip()
        for t in data["activeTargets"]
    ]


def _trained_steps(log: str) -> dict[str, tuple[int, int]]:
    """Each rank's steps from the example's log: (trained, shadow steps at the end)."""
    trained = {m[1]: int(m[2]) for m in re.finditer(r"rank (\d+): trained (\d+) steps", log)}
    shadow = {m[1]: int(m[2]) for m in re.finditer(r"rank (\d+): (\d+) shadow step", log)}
    return {rank: (n, shadow.get(rank, 0)) for rank, n in trained.items()}


def _prometheus_saw_the_job(compose: ComposeProject, log: str, timeout_s: float = 60) -> dict:
    """After the job: every role was scraped (``up == 1`` at least once), and the highest
    ``pyrsia_nn_worker_steps`` Prometheus holds for each rank is the steps it trained: the
    ranks waited for a final scrape (``PYRSIA_FINAL_SCRAPE_S``). The query results."""
    port = compose.variables["PROMETHEUS_PORT"]
    expected = _trained_steps(log)
    assert expected, log[-3000:]
    deadline = time.monotonic() + timeout_s
    while True:
        up = _query(port, "max_over_time(up[1h]) == 1")
        roles = {r["metric"].get("role") for r in up}
        steps = {
            r["metric"].get("replica_index"): float(r["value"][1])
            for r in _query(port, "max_over_time(pyrsia_nn_worker_steps[1h])")
        }
        final = all(
            rank in steps and n <= steps[rank] <= n + shadow
            for rank, (n, shadow) in expected.items()
        )
        if ROLES <= roles and final:
            return {"up": [r["metric"] for r in up], "pyrsia_nn_worker_steps": steps}
        if time.monotonic() >= deadline:
            break
        time.sleep(2)
    pytest.fail(
        f"Prometheus: roles scraped {sorted(roles)} (expected {sorted(ROLES)}); highest "
        f"pyrsia_nn_worker_steps per rank {steps}, trained (steps, shadow steps) {expected}; "
        "its targets:\n" + "\n".join(_targets(port)) + "\nnn_worker's log:\n" + log[-3000:]
    )


def _finish(compose: ComposeProject, label: str, started: float) -> tuple[float, int, str]:
    code = compose.wait("nn_worker", JOB_TIMEOUT_S)
    log = compose.logs("nn_worker")
    auc = auc_of(log)
    print(f"{label}: nn_worker exit {code}, AUC {auc}, {time.monotonic() - started:.1f} s from up")
    assert code == 0 and auc is not None, log[-3000:]
    assert auc >= AUC_MIN, f"{label}: test AUC {auc} < {AUC_MIN}"
    return auc, compose.final_updates_applied(PS), log


def _kill_a_ps_after_a_checkpoint(project: ComposeProject, ckpt: Path) -> dict:
    """The job up, PS 1's container killed once the step-50 checkpoint is complete; the NN
    worker must stop with an error naming the replica. Its exit code, how long it took to
    stop and what it said."""
    shutil.rmtree(ckpt, ignore_errors=True)
    started = time.monotonic()
    project.run("up", "-d", "--no-build", *JOB)
    first = ckpt / f"step_{CHECKPOINT_EVERY:010d}" / "MANIFEST.json"
    while not first.exists():
        assert time.monotonic() - started < JOB_TIMEOUT_S, "no step-50 checkpoint"
        time.sleep(0.1)
    docker("kill", project.container(PS[1]))
    killed = time.monotonic()
    code = project.wait("nn_worker", JOB_TIMEOUT_S)
    stopped_s = time.monotonic() - killed
    log = project.logs("nn_worker")
    said = [line for line in log.splitlines() if "PS replica 1" in line or "resume" in line]
    print(
        f"PS 1 killed {killed - started:.1f} s after up; nn_worker exit {code} "
        f"{stopped_s:.1f} s later, saying:\n" + "\n".join(said[-4:])
    )
    assert code != 0 and any("PS replica 1" in line for line in said), log[-3000:]
    project.run("down")  # the checkpoints stay: they are in the mounted workspace
    return {"exit_code": code, "stopped_s": round(stopped_s, 1), "said": said[-4:]}


def _resume_and_count_lost_updates(
    project: ComposeProject, ckpt: Path, unfaulted_updates: int, killed: dict
) -> None:
    """The same job again with ``PERSIA_RESUME=1``: it resumes from the newest complete
    checkpoint and holds every update the unfaulted run acknowledged."""
    started = time.monotonic()
    project.run("up", "-d", "--no-build", *JOB, PERSIA_RESUME="1")
    auc, resumed_updates, log = _finish(project, "resumed run", started)
    resumed = [line for line in log.splitlines() if "resumed from" in line]
    assert resumed, log[-3000:]
    manifest = json.loads(
        (
            ckpt
            / resumed[0].split("resumed from ")[1].split(":")[0].rsplit("/", 1)[1]
            / "MANIFEST.json"
        ).read_text()
    )
    held = manifest["updates_applied_total"] + resumed_updates
    print(
        f"resumed: {resumed[0].split('] ')[-1]}; acknowledged updates held {held}, "
        f"unfaulted {unfaulted_updates}, lost {unfaulted_updates - held}"
    )
    _record(
        "ps_killed",
        {
            "auc": auc,
            **killed,
            "resumed_from_step": manifest["step"],
            "lost_updates": unfaulted_updates - held,
            "resumed_seconds": round(time.monotonic() - started, 1),
        },
    )
    assert held == unfaulted_updates


def test_adult_job_across_containers_survives_a_killed_ps(project: ComposeProject):
    ckpt = Path(project.workspace) / "ckpt"
    # 1. unfaulted, with Prometheus
    started = time.monotonic()
    project.run(
        "--profile",
        "monitoring",
        "up",
        "-d",
        "--no-build",
        *JOB,
        "prometheus",
        PYRSIA_FINAL_SCRAPE_S=str(FINAL_SCRAPE_S),
    )
    auc, unfaulted_updates, log = _finish(project, "unfaulted run", started)
    scraped = _prometheus_saw_the_job(project, log)
    print(
        f"prometheus: every role scraped; pyrsia_nn_worker_steps {scraped['pyrsia_nn_worker_steps']}"
    )
    _record(
        "unfaulted",
        {
            "auc": auc,
            "updates_applied": unfaulted_updates,
            "seconds": round(time.monotonic() - started, 1),
            "prometheus": scraped,
        },
    )
    project.run("--profile", "monitoring", "down", "--volumes")

    # 2. a PS container killed after the step-50 checkpoint, then the job resumed
    killed = _kill_a_ps_after_a_checkpoint(project, ckpt)
    _resume_and_count_lost_updates(project, ckpt, unfaulted_updates, killed)

    # 3. nothing left behind
    project.run("--profile", "monitoring", "down", "--volumes", "--remove-orphans")
    assert project.leftovers() == {"container": [], "network": [], "volume": []}
