"""The NN-worker launcher sleeps while its ranks train (pyrsia/services/nn_worker/launch.py).

``persia-launcher nn-worker`` shares the machine with its ranks' training threads. Torch's
agent checks on the ranks every ``--monitor-interval`` (torchrun's default: 0.1 s, ten
wake-ups a second); the launcher asks for ``NN_AGENT_MONITOR_INTERVAL_S`` instead, and its
job-lease thread sleeps between heartbeats. A real launcher, a real rank (a script that
sleeps), the kernel's count of the launcher's wake-ups over one second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyrsia.shared.constants import NN_AGENT_MONITOR_INTERVAL_S
from tests.redis_server import free_port
from tests.service_procs import REPO


def _wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid`` so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as fh:
                total += next(
                    int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt")
                )
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return total


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except FileNotFoundError:
        return []


@pytest.mark.timeout(120)
def test_the_launcher_wakes_a_few_times_a_second_while_its_rank_runs(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(8)\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PERSIA_JOB_ID": "launcher-wakeups",
           # no Redis listens there: the launcher goes on without a job lease, as it says
           "PERSIA_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}  # fmt: skip
    launcher = subprocess.Popen(
        [sys.executable, "-m", "persia.launcher", "nn-worker", str(script),
         "--nproc-per-node", "1", "--master-port", str(free_port())],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not _children(launcher.pid) and launcher.poll() is None:
            assert time.monotonic() < deadline, "the rank did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # past the rank's start
        before = _wakeups(launcher.pid)
        time.sleep(1.0)
        woke = _wakeups(launcher.pid) - before
        assert launcher.poll() is None, launcher.stdout.read().decode() if launcher.stdout else ""
        assert woke <= 2 / NN_AGENT_MONITOR_INTERVAL_S + 2, f"the launcher woke {woke} times in 1 s"
        out, _ = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, out.decode()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
