"""PERSIA behaviours kept: default ports, bind hosts, DDP find_unused_parameters, Bagua
options, the NATS hint, threadpool_worker_size."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from persia.distributed import BaguaDistributedOption, DDPOption
from pyrsia.services.embedding_ps.main import build_parser as ps_parser
from pyrsia.services.embedding_worker.main import build_parser as worker_parser
from pyrsia.shared.errors import InvalidInputError, RegistryError
from pyrsia.shared.registry import RegistrySettings
from pyrsia.shared.settings import Settings

REPO = Path(__file__).resolve().parents[1]


# --- ports and bind hosts ------------------------------------------------------------------
def test_default_ports_are_persias(monkeypatch):
    monkeypatch.delenv("PERSIA_BIND_HOST", raising=False)
    assert worker_parser().parse_args([]).port == 8887  # PERSIA's middleware / embedding worker
    assert ps_parser().parse_args([]).port == 8888  # PERSIA's embedding server


def test_bind_loopback_by_default_and_all_interfaces_when_told():
    from pyrsia.shared.cli import ServerOptions

    def host(parser, flags: list[str], environ: dict[str, str]) -> str:
        args = parser().parse_args(flags)
        options = ServerOptions.from_replica_flags(args, Settings.from_env(environ))
        return options.host

    token = {"PERSIA_AUTH_TOKEN": "t" * 32}  # a non-loopback bind needs it
    assert host(ps_parser, [], {}) == "127.0.0.1"
    assert host(worker_parser, [], {}) == "127.0.0.1"
    assert host(ps_parser, [], {"PERSIA_BIND_HOST": "0.0.0.0", **token}) == "0.0.0.0"
    assert host(worker_parser, ["--host", "10.0.0.5"], token) == "10.0.0.5"


def test_containers_bind_all_interfaces():
    assert "PERSIA_BIND_HOST=0.0.0.0" in (REPO / "Dockerfile").read_text()
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        # the job's servers; the `monitoring` profile's services (Prometheus, Grafana and the
        # targets writer, a client) are not Pyrsia servers
        if name != "redis" and "profiles" not in service:
            assert service["environment"]["PERSIA_BIND_HOST"] == "0.0.0.0", name


def test_compose_uses_the_default_ports():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if name.startswith("embedding_parameter_server"):
            assert "--port 8888" in service["command"], name
        if name.startswith("embedding_worker"):
            assert "--port 8887" in service["command"], name


# --- DDP -----------------------------------------------------------------------------------
DDP_SCRIPT = """
import sys, torch
from persia.distributed import DDPOption
option = DDPOption(initialization_method="file", backend="gloo", sync_file=sys.argv[1], **OPTIONS)

class Skips(torch.nn.Module):  # one layer is never used in forward
    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    def forward(self, x):
        return self.used(x)

model, _ = option.convert2distributed_model(Skips(), world_size=1, rank_id=0)
print("find_unused", model.find_unused_parameters)
for _ in range(3):
    model(torch.ones(2, 3)).sum().backward()
print("trained")
torch.distributed.destroy_process_group()
"""


def run_ddp(tmp_path: Path, options: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(DDP_SCRIPT).replace("**OPTIONS", options)
    return subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "sync")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ddp_finds_unused_parameters_by_default_as_persia(tmp_path):
    assert DDPOption(backend="gloo").find_unused_parameters is True
    proc = run_ddp(tmp_path, "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["find_unused", "True", "trained"]


def test_ddp_find_unused_parameters_false_is_honoured(tmp_path):
    proc = run_ddp(tmp_path, "find_unused_parameters=False")
    assert "find_unused False" in proc.stdout
    # torch's reducer refuses the second step of a model with an unused parameter
    assert proc.returncode != 0 and "trained" not in proc.stdout
    assert "did not receive grad" in proc.stderr
    with pytest.raises(InvalidInputError, match="find_unused_parameters"):
        DDPOption(backend="gloo", find_unused_parameters="yes")


# --- Bagua -----------------------------------------------------------------------------------
def test_bagua_options_reach_bagua_environment_and_algorithm():
    option = BaguaDistributedOption(
        "async",
        master_port=29000,
        default_bucket_size=1024,
        autotune_level=1,
        is_output_autotune_log=True,
        sync_interval_ms=50,
        warmup_steps=3,
    )
    assert option.options == {"sync_interval_ms": 50, "warmup_steps": 3}
    variables = option.bagua_environment("10.1.2.3")
    assert variables["MASTER_ADDR"] == "10.1.2.3" and variables["MASTER_PORT"] == "29000"
    assert variables["BAGUA_DEFAULT_BUCKET_SIZE"] == "1024"
    assert variables["BAGUA_AUTOTUNE"] == "1"
    assert variables["BAGUA_IS_OUTPUT_AUTOTUNE_LOG"] == "1"
    assert variables["AUTO_TUNE_SERVER_ADDR"] == "10.1.2.3:29501"
    assert variables["BAGUA_AUTOTUNE_MAX_SAMPLES"] == "60"  # PERSIA's default
    qadam = BaguaDistributedOption("qadam", lr=0.01, warmup_steps=10, hierarchical=False)
    assert qadam.options == {"lr": 0.01, "warmup_steps": 10, "hierarchical": False}


@pytest.mark.parametrize(
    ("algorithm", "options", "refused"),
    [
        ("gradient_allreduce", {"sync_interval_ms": 5}, "sync_interval_ms"),  # async's option
        ("decentralized", {"lr": 0.1}, "lr"),
        ("bytegrad", {"bucket_size": 1}, "bucket_size"),
    ],
)
def test_bagua_options_that_cannot_reach_bagua_are_refused(algorithm, options, refused):
    with pytest.raises(InvalidInputError) as info:
        BaguaDistributedOption(algorithm, **options)
    assert refused in str(info.value) and algorithm in str(info.value)


# --- NATS ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["PERSIA_NATS_URL", "PERSIA_NATS_IP"])
def test_nats_without_redis_is_one_clear_line(name):
    nats = {name: "nats://persia-nats-service:4222"}
    with pytest.raises(RegistryError) as info:
        RegistrySettings.from_env(Settings.from_env(nats))
    message = str(info.value)
    assert "\n" not in message
    assert name in message and "Redis" in message and "PERSIA_REDIS_URL=redis://" in message
    both = Settings.from_env({**nats, "PERSIA_REDIS_URL": "redis://somewhere:6379/0"})
    assert RegistrySettings.from_env(both).redis_url == "redis://somewhere:6379/0"


def test_service_started_with_nats_only_exits_with_that_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PERSIA_REDIS_URL"}
    env.update(PERSIA_NATS_URL="nats://nats:4222", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "pyrsia.services.embedding_ps", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "PERSIA_REDIS_URL" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
