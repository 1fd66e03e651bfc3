"""The Adult job across simulated hosts: every process on its own host, a bridge between.

:class:`ClusterJob` places each process of a job in its own host of a
:class:`~tests.cluster.netns.Network`, the way compose or Kubernetes would place them:

    host    process                                            address
    redis   redis-server (bound to the host's address)         redis:6379
    ps<i>   persia-launcher embedding-parameter-server         ps<i>:8888
    ew<i>   persia-launcher embedding-worker                   ew<i>:8887
    nn<r>   persia-launcher nn-worker train.py (node r)        ingress: nn<r>:<any port>
    dl<i>   persia-launcher data-loader data_loader.py         (a client only)

Every server binds its host's address (``PERSIA_BIND_HOST``, not 0.0.0.0, so a service
that dialled an address other than the one advertised would fail) and advertises the
host's *name* (``PERSIA_ADVERTISE_HOST``), which every other host resolves through its
``/etc/hosts``. The job holds one ``PERSIA_AUTH_TOKEN`` (the bind rule: a non-loopback
bind needs one). The NN-worker nodes rendezvous at ``nn0`` (``--nnodes 2 --master-addr
nn0``) and all-reduce with gloo over the bridge. Each host runs in a working directory of
its own (``hosts/<name>/``); checkpoints go to ``shared/ckpt`` by absolute path, the
volume every host mounts.

The job ends as the Procfile's does: when every NN-worker node has exited, the servers
get SIGTERM and must exit 0 (``final stats`` lines give the PS replicas' acknowledged
updates).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_lib
import yaml

from pyrsia.shared.constants import ROLE_NN_WORKER, service_key
from pyrsia.shared.registry import ServiceRecord
from tests.cluster.layout import (  # noqa: F401  (re-exported: the tests import them here)
    EW_PORT,
    FULL,
    MASTER_PORT,
    PS_PORT,
    REDIS_PORT,
    Layout,
    host_argv,
)
from tests.cluster.netns import Network

REPO = Path(__file__).resolve().parents[2]
ADULT = REPO / "examples" / "adult_income"
_STEPS = re.compile(rb"^pyrsia_nn_worker_steps (\S+)$", re.MULTILINE)


@dataclass
class ClusterResult:
    """What one run printed, parsed per host."""

    codes: dict[str, int | None]
    logs: dict[str, str]
    seconds: float
    auc: float | None = None
    steps: dict[str, int] = field(default_factory=dict)  # nn host -> trained steps
    updates_applied: int | None = None  # summed over PS replicas that logged final stats
    resumed_step: int | None = None
    timed_out: bool = False  # the NN workers had not finished in time: stopped by SIGTERM

    def tail(self, n: int = 2500) -> str:
        return "\n".join(
            f"--- {h} (rc={self.codes.get(h)}) ---\n{t[-n:]}" for h, t in self.logs.items()
        )


class ClusterJob:
    """One run of the Adult job over ``net``; several runs may share ``checkpoint_dir``."""

    def __init__(
        self,
        net: Network,
        workdir: Path,
        layout: Layout = FULL,
        *,
        name: str = "run",
        every_n_steps: int = 0,
        resume: bool = False,
        extra_env: dict[str, str] | None = None,
        job_id: str | None = None,
        token: str | None = None,
    ):
        self.net = net
        self.workdir = workdir
        self.layout = layout
        self.name = name
        self.every_n_steps = every_n_steps
        self.resume = resume
        self.extra_env = extra_env or {}
        self.job_id = job_id or f"cluster-{uuid.uuid4().hex[:8]}"
        self.token = token or secrets.token_hex(16)
        self.shared = workdir / "shared"
        self.checkpoint_dir = self.shared / "ckpt"
        self.procs: dict[str, subprocess.Popen] = {}
        self.started = 0.0
        self.timed_out = False
        self._nn_addresses: dict[int, str] = {}

    # --- files and environment ----------------------------------------------------------
    def _global_config(self) -> Path:
        config = yaml.safe_load((ADULT / "config" / "global_config.yml").read_text())
        common = config.setdefault("common_config", {})
        common.setdefault("metrics_config", {})["enable_metrics"] = False  # no push gateway
        if self.every_n_steps:
            common.setdefault("checkpointing_config", {}).update(
                checkpoint_dir=str(self.checkpoint_dir),
                checkpoint_every_n_steps=self.every_n_steps,
                keep_checkpoints=2,
            )
        path = self.shared / f"{self.name}.global_config.yml"
        path.write_text(yaml.safe_dump(config))
        return path

    def env(self, host: str) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", "/root"),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "LOG_LEVEL": "INFO",
            "PERSIA_REDIS_URL": f"redis://redis:{REDIS_PORT}/0",
            "PERSIA_JOB_ID": self.job_id,
            "PERSIA_AUTH_TOKEN": self.token,
            "PERSIA_BIND_HOST": self.net.hosts[host].address,
            "PERSIA_ADVERTISE_HOST": host,
            "PERSIA_EMBEDDING_CONFIG": str(ADULT / "config" / "embedding_config.yml"),
            "PERSIA_GLOBAL_CONFIG": str(self._config_path),
            "PERSIA_NN_WORKER_ENTRY": str(ADULT / "train.py"),
            "PERSIA_DATALOADER_ENTRY": str(ADULT / "data_loader.py"),
            "PERSIA_CHECKPOINT_ROOT": str(self.shared),
            # a checkout run by path (PYTHONPATH) rather than the installed one: hosts too
            **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},
            **self.extra_env,
        }

    def argv(self, host: str) -> list[str]:
        """What ``host`` runs (``layout.host_argv``)."""
        return host_argv(self.layout, host, self.net.hosts[host].address, self.resume)

    # --- running ------------------------------------------------------------------------
    def prepare(self) -> ClusterJob:
        """Write the job's files (done by :meth:`start`)."""
        self.shared.mkdir(parents=True, exist_ok=True)
        self._config_path = self._global_config()
        return self

    def start(self) -> ClusterJob:
        self.prepare()
        self.started = time.monotonic()
        for host in self.layout.hosts():
            self.start_host(host)
            if host == "redis":
                self.wait_redis()
        return self

    def start_host(self, host: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``host``'s process (``env``: instead of :meth:`env`)."""
        home = self.workdir / "hosts" / host
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(host), "ab")  # noqa: SIM115 - the child owns it
        try:
            proc = self.net.popen(
                host,
                self.argv(host),
                cwd=home,
                env=env or self.env(host),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        self.procs[host] = proc
        return proc

    def log_path(self, host: str) -> Path:
        return self.workdir / f"{self.name}.{host}.log"

    def log_text(self, host: str) -> str:
        path = self.log_path(host)
        return path.read_text(errors="replace") if path.exists() else ""

    def redis_client(self) -> redis_lib.Redis:
        address = self.net.hosts["redis"].address
        return redis_lib.Redis(
            host=address, port=REDIS_PORT, socket_timeout=2, socket_connect_timeout=2
        )

    def wait_redis(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            client = self.redis_client()
            try:
                if client.ping():
                    return
            except redis_lib.RedisError:
                time.sleep(0.05)
            finally:
                client.close()
        raise RuntimeError(f"redis did not answer on its host:\n{self.log_text('redis')}")

    def record(self, role: str, index: int) -> ServiceRecord | None:
        client = self.redis_client()
        try:
            raw = client.get(service_key(self.job_id, role, index))
        except redis_lib.RedisError:
            return None
        finally:
            client.close()
        return ServiceRecord.from_json(raw) if raw else None

    def get(self, address: str, path: str, timeout: float = 2.0) -> bytes:
        """GET ``path`` of a service at its advertised ``host:port`` (with the job's token)."""
        host, port = address.rsplit(":", 1)
        url = f"http://{self.net.address_of(host)}:{port}{path}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.read()

    def step(self, rank: int = 0) -> int | None:
        """NN-worker rank ``rank``'s finished training step (its ingress' gauge)."""
        address = self._nn_addresses.get(rank)
        if address is None:  # found once: a cut Redis must not blind the watch
            record = self.record(ROLE_NN_WORKER, rank)
            if record is None:
                return None
            address = self._nn_addresses[rank] = record.address
        try:
            found = _STEPS.search(self.get(address, "/metrics", timeout=1.0))
        except OSError:
            return None
        return int(float(found[1])) if found else None

    def wait_for_step(self, step: int, rank: int = 0, timeout_s: float = 240.0) -> int:
        deadline = time.monotonic() + timeout_s
        current = None
        while time.monotonic() < deadline:
            current = self.step(rank)
            if current is not None and current >= step:
                return current
            if not self.trainers_running():
                raise AssertionError(f"the job ended before step {step} (last seen {current})")
            time.sleep(0.02)
        raise TimeoutError(f"step {step} not reached in {timeout_s}s (at {current})")

    def trainers_running(self) -> bool:
        return any(p.poll() is None for h, p in self.procs.items() if h.startswith("nn"))

    def wait(self, timeout_s: float = 300.0) -> ClusterResult:
        """Wait for the NN-worker nodes and the data loaders, then stop the servers."""
        deadline = self.started + timeout_s
        clients = [h for h in self.procs if h.startswith(("nn", "dl"))]
        while time.monotonic() < deadline:
            done = [h for h in clients if self.procs[h].poll() is not None]
            failed = [h for h in done if self.procs[h].returncode != 0]
            nn_done = all(self.procs[h].poll() is not None for h in clients if h.startswith("nn"))
            if len(done) == len(clients) or failed or nn_done:
                break
            time.sleep(0.1)
        # like honcho: once a process has failed (or time is up), the others are stopped
        self.timed_out = time.monotonic() >= deadline
        # a data loader lingers after the NN workers deregister (DATA_LOADER_LINGER_S), as
        # under honcho, which stops it with SIGTERM when the NN worker exits: so do we
        for host in clients:
            self._signal(host, signal.SIGTERM)
        grace = time.monotonic() + 20
        for host in clients:
            self._wait_exit(host, max(0.1, grace - time.monotonic()))
        self.stop_servers()
        return self.result()

    def _signal(self, host: str, sig: int) -> None:
        proc = self.procs[host]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def _wait_exit(self, host: str, timeout_s: float) -> int:
        proc = self.procs[host]
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(host, signal.SIGKILL)
            return proc.wait(timeout=10)

    def stop_servers(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every server that still runs (data path first, Redis last)."""
        order = [h for h in self.procs if h.startswith(("ew", "ps"))] + ["redis"]
        for host in order:
            if host in self.procs:
                self._signal(host, signal.SIGTERM)
                self._wait_exit(host, timeout_s)

    def stop(self) -> None:
        """Tear-down: stop everything this run started (the Network deletes the rest)."""
        for host in self.procs:
            if host != "redis":
                self._signal(host, signal.SIGTERM)
        for host in list(self.procs):
            if host != "redis":
                self._wait_exit(host, 10)
        if "redis" in self.procs:
            self._signal("redis", signal.SIGTERM)
            self._wait_exit("redis", 10)

    def kill(self, host: str) -> None:
        self._signal(host, signal.SIGKILL)

    def result(self) -> ClusterResult:
        logs = {h: self.log_text(h) for h in self.procs}
        result = ClusterResult(
            codes={h: p.poll() for h, p in self.procs.items()},
            logs=logs,
            seconds=time.monotonic() - self.started,
            timed_out=self.timed_out,
        )
        if m := re.search(r"test AUC: ([\d.]+)", logs.get("nn0", "")):
            result.auc = float(m[1])
        for host, text in logs.items():
            if host.startswith("nn") and (m := re.search(r"trained (\d+) steps", text)):
                result.steps[host] = int(m[1])
            if host == "nn0" and (m := re.search(r"resumed from \S+: step (\d+)", text)):
                result.resumed_step = int(m[1])
        applied = [
            int(x)
            for h, t in logs.items()
            if h.startswith("ps")
            for x in re.findall(r"final stats: updates_applied=(\d+)", t)
        ]
        result.updates_applied = sum(applied) if len(applied) == self.layout.ps else None
        return result
