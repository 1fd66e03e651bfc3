"""Every socket an NN-worker job listens on follows the bind rule (README Security).

Without ``PERSIA_AUTH_TOKEN`` and ``--insecure`` a job may listen on loopback only: the
services, each rank's batch ingress, torch's rendezvous store on ``MASTER_PORT`` (the
launcher's agent hosts it), the DDP store rank 0 hosts on ``DDPOption.master_port``, and
gloo's pair sockets. The job runs two gloo ranks through ``persia-launcher nn-worker``;
once both have trained a step, the listening sockets of the launcher's whole process tree
and of the services are read from /proc and must all be 127.0.0.1 or ::1.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.listening_sockets import descendants, is_loopback, listening
from tests.nn_helpers import job_services
from tests.rank_launch import nn_worker_argv
from tests.redis_server import free_port

TRAIN_SCRIPT = """
import os, sys, time, torch
from pathlib import Path
from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.distributed import DDPOption
from persia.embedding.optim import Adagrad
from persia.env import get_rank
from tests.nn_helpers import SmallModel, make_batch

class Rank(IterableDataset):
    def __iter__(self):
        for k in range(2):
            yield make_batch([100 * get_rank() + k, 7 + k], seed=10 * get_rank() + k)

model = SmallModel()
option = DDPOption(backend="gloo", master_port=int(sys.argv[2]))
with TrainCtx(Adagrad(lr=0.05), torch.optim.SGD(model.parameters(), lr=0.5), model=model,
              mixed_precision=False, distributed_option=option) as ctx:
    for batch in DataLoader(Rank()):
        output, labels = ctx.forward(batch)
        ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
        Path(sys.argv[1], f"ready{get_rank()}").touch()
        deadline = time.monotonic() + 120
        while not Path(sys.argv[1], "stop").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        break
"""


@pytest.mark.timeout(300)
def test_nn_worker_job_listens_on_loopback_only(redis_server, tmp_path):
    unset = (
        "PERSIA_AUTH_TOKEN",
        "PERSIA_INSECURE",
        "PERSIA_BIND_HOST",
        "GLOO_SOCKET_IFNAME",
        "PERSIA_ADVERTISE_HOST",
        "MASTER_ADDR",
    )
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(PERSIA_REDIS_URL=redis_server.url, PERSIA_JOB_ID=f"bind-{uuid.uuid4().hex[:8]}")
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    repo = Path(__file__).resolve().parents[1]
    master_port, ddp_port = free_port(), free_port()
    with (
        job_services(env, tmp_path / "svc") as services,
        open(tmp_path / "nn.log", "wb") as log_file,
    ):
        launcher = subprocess.Popen(
            nn_worker_argv(
                script, 2, master_port=master_port, script_args=(str(tmp_path), str(ddp_port))
            ),
            cwd=repo,
            env={**env, "PYTHONPATH": str(repo)},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 180
            while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
                assert launcher.poll() is None, (tmp_path / "nn.log").read_text()[-4000:]
                assert time.monotonic() < deadline, (tmp_path / "nn.log").read_text()[-4000:]
                time.sleep(0.1)
            pids = descendants(launcher.pid) + [p.proc.pid for p in services]
            sockets = listening(pids)
        finally:
            (tmp_path / "stop").touch()
            code = launcher.wait(timeout=60)
    log = (tmp_path / "nn.log").read_text()
    assert code == 0, log[-4000:]
    ports = {port for _, _, port in sockets}
    assert master_port in ports, (sockets, "torch's rendezvous store not found")
    assert ddp_port in ports, (sockets, "rank 0's DDP store not found")
    exposed = [s for s in sockets if not is_loopback(s[1])]
    assert not exposed, f"listening beyond loopback (pid, address, port): {exposed}; all: {sockets}"


@pytest.mark.parametrize("master", ["127.0.0.1", "localhost"])
def test_several_nodes_with_a_loopback_master_addr_are_refused_on_node_0(master, monkeypatch):
    """Node 0's rendezvous store listens where --master-addr resolves on node 0; loopback
    there (127.0.0.1, or a hostname Debian maps to 127.0.1.1) leaves the other nodes waiting
    with no error, so node 0 refuses at once naming the address (tests/cluster shows the
    127.0.1.1 case across real network namespaces)."""
    from pyrsia.services.nn_worker.launch import RankOptions, _check_security, build_parser
    from pyrsia.shared.errors import UsageError
    from pyrsia.shared.settings import Settings

    settings = Settings.from_env({"PERSIA_AUTH_TOKEN": "t" * 32})
    args = build_parser().parse_args(
        ["train.py", "--nnodes", "2", "--node-rank", "0", "--master-addr", master]
    )
    ranks = RankOptions.from_flags(args, settings)
    with pytest.raises(UsageError, match="resolves to a loopback address on node 0.*127.0.0.1"):
        _check_security(ranks, args.insecure, args.max_request_bytes, settings)
    one_node = build_parser().parse_args(["train.py", "--master-addr", master])
    one = RankOptions.from_flags(one_node, settings)
    _check_security(one, one_node.insecure, one_node.max_request_bytes, settings)  # loopback ok


def test_the_launcher_hands_its_flags_to_the_ranks():
    """The limit flags lie over the launcher's settings and, with --insecure, the cap,
    --resume and --verbose, are what it exports for the ranks torch's agent starts."""
    from pyrsia.services.nn_worker.launch import (
        RankOptions,
        _check_security,
        build_parser,
        rank_environment,
    )
    from pyrsia.shared.cli import ENV_FLAGS, flag_settings
    from pyrsia.shared.constants import (
        ENV_BODY_TIMEOUT_S,
        ENV_INSECURE,
        ENV_MAX_CONNECTIONS,
        ENV_MAX_MESSAGE_BYTES,
        ENV_RESUME,
        ENV_VERBOSE,
    )
    from pyrsia.shared.settings import Settings

    flags = ["--body-timeout-s", "2.5", "--max-connections", "7", "--insecure"]
    flags += ["--max-request-bytes", "1024", "--resume", "--verbose"]
    args = build_parser().parse_args(["train.py", *flags])
    settings = flag_settings(args, Settings.from_env({ENV_BODY_TIMEOUT_S: "9"}))
    assert settings.text(ENV_BODY_TIMEOUT_S) == "2.5"  # the flag wins over the variable
    ranks = RankOptions.from_flags(args, settings)
    handed = _check_security(ranks, args.insecure, args.max_request_bytes, settings)
    exported = rank_environment(getattr(args, ENV_FLAGS), handed, resume=True, verbose=True)
    assert exported == {
        ENV_BODY_TIMEOUT_S: "2.5",
        ENV_MAX_CONNECTIONS: "7",
        ENV_INSECURE: "1",
        ENV_MAX_MESSAGE_BYTES: "1024",
        ENV_RESUME: "1",
        ENV_VERBOSE: "1",
    }
