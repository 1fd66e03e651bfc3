"""The runtime's loop thread runs torch ops serially, so it never opens a second OpenMP team
beside the training thread's (pyrsia/shared/serial_ops.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, os, threading
import torch
torch.set_num_threads(2)
from pyrsia.shared.runtime import get_runtime

def threads():
    return len(os.listdir("/proc/self/task"))

big = torch.randn(200_000, 16)
index = torch.randint(0, 200_000, (400_000,))
big.index_select(0, index)  # the training thread's team exists from here on
before = threads()
runtime = get_runtime()
with_runtime = threads()

async def on_loop():
    out = big.index_select(0, index)  # large enough to go parallel with 2 threads
    return torch.get_num_threads(), int(out.shape[0])

loop_threads, rows = runtime.run(on_loop())
after = threads()
later = []
t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
t.start(); t.join()
print(json.dumps({"before": before, "with_runtime": with_runtime, "after": after,
                  "loop": loop_threads, "rows": rows, "main": torch.get_num_threads(),
                  "later": later[0]}))
"""


@pytest.mark.skipif(
    "parallel backend: OpenMP" not in torch.__config__.parallel_info(),
    reason="only torch's OpenMP backend gives each calling thread its own team",
)
def test_loop_thread_ops_are_serial_and_open_no_second_team():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["rows"] == 400_000
    assert seen["loop"] == 1  # the loop thread's own setting
    assert seen["main"] == 2  # the training thread keeps its parallelism
    assert seen["later"] == 2  # and threads started afterwards get the process default
    # The parallel op on the loop thread started no OpenMP worker of its own: the only new
    # threads are those the runtime itself starts (its loop thread, its warm-up thread).
    assert seen["after"] <= seen["with_runtime"]
