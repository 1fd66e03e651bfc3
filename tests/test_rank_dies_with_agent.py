"""An NN-worker rank ends when its agent (the launcher process that started it) is killed.

torch.distributed.run's agent forwards SIGTERM to its ranks, but a ``kill -9`` of the
agent (the fault suite's, an OOM killer's) left the ranks running train.py forever,
orphaned. Each rank asks the kernel for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``), so TrainCtx drains and the rank exits as on a plain stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_rank_ends_when_its_agent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import time\nprint('training', flush=True)\ntime.sleep(120)\n")
    agent_code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-m", "pyrsia.services.nn_worker.rank_entry",
                                  {str(script)!r}], stdout=subprocess.PIPE, text=True)
        child.stdout.readline()  # the rank's script runs
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    agent = subprocess.Popen([sys.executable, "-c", agent_code], stdout=subprocess.PIPE, text=True)
    try:
        rank_pid = int(agent.stdout.readline())
        assert _alive(rank_pid)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 30
        while _alive(rank_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(rank_pid), "the rank outlived its killed agent"
    finally:
        agent.kill()
        agent.wait(10)
        agent.stdout.close()
        try:
            os.kill(rank_pid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
