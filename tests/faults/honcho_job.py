"""The Adult job under honcho with the repository's own Procfile, for fault injection.

:class:`HonchoJob` writes an env file (free ports, its own job id, a global config with
periodic checkpoints into ``checkpoint_dir``), starts ``honcho start`` on the real
``Procfile`` (with ``--resume`` appended to the nn_worker and data_loader lines when
resuming), finds the process behind each Procfile entry among honcho's descendants
(so that a test kills only what it started), and parses the job's log: test AUC, trained
steps, each PS replica's final ``updates_applied``, the step it resumed from.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.faults.step_watch import StepWatch
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]
ADULT_GLOBAL_CONFIG = REPO / "examples" / "adult_income" / "config" / "global_config.yml"
RESUMED_ENTRIES = ("nn_worker", "data_loader")

# Procfile entry -> how to recognize its process (and not its wrappers) in /proc
_MATCHERS = {
    "redis": lambda argv: Path(argv[0]).name.startswith("redis-server"),
    # the Procfile's redis entry itself: the supervisor that restarts redis-server
    "redis_supervisor": lambda argv: "pyrsia.shared.redis_local" in argv,
    "embedding_parameter_server": lambda argv: "embedding-parameter-server" in argv,
    "embedding_worker": lambda argv: "embedding-worker" in argv,
    "data_loader": lambda argv: "data-loader" in argv,
    # the rank process torchrun starts: runs train.py itself, not the launcher
    "nn_worker_rank": lambda argv: (
        any(a.endswith("train.py") for a in argv) and "nn-worker" not in argv
    ),
}


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class JobResult:
    """What one honcho run printed, parsed."""

    returncode: int
    log: str
    seconds: float
    auc: float | None = None
    steps: int | None = None
    total_steps: int | None = None  # summed over the NN-worker ranks
    resumed_step: int | None = None
    updates_applied: int | None = None  # sum over PS replicas that exited cleanly
    stops: dict[str, str] = field(default_factory=dict)


class HonchoJob:
    """One honcho run of the Adult job; several runs may share ``checkpoint_dir``."""

    def __init__(
        self,
        workdir: Path,
        checkpoint_dir: Path,
        *,
        every_n_steps: int = 50,
        resume: bool = False,
        name: str = "run",
        procfile: str = "Procfile",
        extra_env: dict[str, str] | None = None,
    ):
        self.workdir = workdir
        self.checkpoint_dir = checkpoint_dir
        self.every_n_steps = every_n_steps
        self.resume = resume
        self.name = name
        self.procfile = procfile
        self.extra_env = extra_env or {}
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.redis_url = ""
        self.job_id = ""

    def _files(self) -> tuple[Path, Path]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(ADULT_GLOBAL_CONFIG.read_text())
        checkpointing = config.setdefault("common_config", {}).setdefault(
            "checkpointing_config", {}
        )
        checkpointing.update(
            checkpoint_dir=str(self.checkpoint_dir),
            checkpoint_every_n_steps=self.every_n_steps,
            keep_checkpoints=2,
        )
        global_config = self.workdir / f"{self.name}.global_config.yml"
        global_config.write_text(yaml.safe_dump(config))
        redis_port = free_port()
        self.job_id = f"faults-{uuid.uuid4().hex[:8]}"
        self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
        overrides = {
            "REDIS_PORT": str(redis_port),
            "PS_PORT": str(free_port()),
            "EMBEDDING_WORKER_PORT": str(free_port()),
            "PERSIA_JOB_ID": self.job_id,
            "PERSIA_REDIS_URL": self.redis_url,
            "PERSIA_GLOBAL_CONFIG": str(global_config),
            "MASTER_PORT": str(free_port()),  # torchrun's rendezvous: not the shared 29500
            **self.extra_env,
        }
        lines = (REPO / ".honcho.env").read_text().splitlines()
        kept = [line for line in lines if line.split("=", 1)[0] not in overrides]
        env_file = self.workdir / f"{self.name}.env"
        env_file.write_text("\n".join(kept + [f"{k}={v}" for k, v in overrides.items()]) + "\n")
        procfile = self.workdir / f"{self.name}.Procfile"
        out = []
        for line in (REPO / self.procfile).read_text().splitlines():
            entry = line.split(":", 1)[0]
            # fixed ports (Procfile.multi) would collide with other jobs on this machine;
            # the services register the port they bound, so 0 works the same
            line = re.sub(r"--port \d+", "--port 0", line)
            if self.resume and entry.rstrip("_0123456789") in RESUMED_ENTRIES:
                line += " --resume"
            out.append(line)
        procfile.write_text("\n".join(out) + "\n")
        return env_file, procfile

    def start(self) -> HonchoJob:
        env_file, procfile = self._files()
        bin_dir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1",
        }
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "honcho",
                    "-e",
                    str(env_file),
                    "-f",
                    str(procfile),
                    "-d",
                    str(REPO),
                    "start",
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started = time.monotonic()
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def steps(self, rank: int = 0) -> StepWatch:
        """A watch on NN-worker rank ``rank``'s training step (see :mod:`step_watch`)."""
        return StepWatch(self.redis_url, self.job_id, rank)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pid_of(self, entry: str, timeout_s: float = 60.0, replica_index: int | None = None) -> int:
        """The pid of a Procfile entry's process (``nn_worker_rank``: a training rank)."""
        assert self.proc is not None
        kind = _MATCHERS[entry]

        def match(argv: list[str]) -> bool:
            if not kind(argv):
                return False
            if replica_index is None:
                return True
            flag = "--replica-index"
            return flag in argv and argv[argv.index(flag) + 1] == str(replica_index)

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pid in _descendants(self.proc.pid):
                if match(_argv(pid)):
                    return pid
            time.sleep(0.1)
        raise TimeoutError(f"no {entry} process under honcho after {timeout_s}s")

    def kill(self, entry: str, replica_index: int | None = None) -> int:
        pid = self.pid_of(entry, replica_index=replica_index)
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_for_log(self, pattern: str, timeout_s: float = 300.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            found = regex.search(self.log_text())
            if found:
                return found
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise TimeoutError(f"{pattern!r} not in the job log:\n{self.log_text()[-3000:]}")

    def stop(self) -> None:
        """Tear-down: if honcho still runs, stop its job (SIGINT) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait(self, timeout_s: float = 600.0) -> JobResult:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)  # honcho stops its processes on SIGINT
            code = self.proc.wait(timeout=30)
        return parse(code, self.log_text(), time.monotonic() - self.started)


def parse(code: int, text: str, seconds: float) -> JobResult:
    result = JobResult(code, text, seconds)
    if m := re.search(r"test AUC: ([\d.]+)", text):
        result.auc = float(m[1])
    if m := re.search(r"trained (\d+) steps", text):
        result.steps = int(m[1])
        result.total_steps = sum(int(n) for n in re.findall(r"rank \d+: trained (\d+) steps", text))
    if m := re.search(r"resumed from \S+: step (\d+)", text):
        result.resumed_step = int(m[1])
    applied = [int(x) for x in re.findall(r"final stats: updates_applied=(\d+)", text)]
    result.updates_applied = sum(applied) if applied else None
    result.stops = dict(re.findall(r"system\s*\| (\w+)\.1 stopped \(rc=(-?\d+)\)", text))
    return result
