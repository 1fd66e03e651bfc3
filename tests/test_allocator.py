"""The training process keeps freed heap memory (pyrsia/shared/allocator.py).

Each case runs in a fresh interpreter: malloc's thresholds are per process, and the
scenario needs glibc's defaults as they are at start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrsia.shared import allocator
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings

REPO = Path(__file__).resolve().parent.parent

# A step's temporaries: 64 blocks of 1.5 MB (96 MB) taken, written and freed, five times.
# glibc's defaults give the freed top of the heap back to the kernel (it exceeds twice the
# largest block freed so far), so every step faults its pages in again.
STEPS_SCRIPT = """
import json, resource, sys
import numpy as np
from pyrsia.shared.allocator import keep_freed_memory
from pyrsia.shared.settings import Settings

outcome = keep_freed_memory(Settings.from_env()) if sys.argv[1] == "call" else "not called"

def step():
    blocks = [np.ones(1536 * 256, dtype=np.float32) for _ in range(64)]
    del blocks

step()  # the first step grows the heap; the next ones show what is reused
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"outcome": outcome, "faults": faults}))
"""

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="the thresholds are glibc's",
)


def run_steps(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in allocator.USER_MALLOC_ENV}
    clean.pop("GLIBC_TUNABLES", None)
    clean.pop("PERSIA_MALLOC_TUNING", None)
    done = subprocess.run(
        [sys.executable, "-c", STEPS_SCRIPT, mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "PYTHONPATH": str(REPO), **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    pages_per_step = 96 * 256  # 96 MB of 4 KB pages
    plain = run_steps("none")
    assert min(plain["faults"]) > pages_per_step // 2, plain  # the scenario reproduces
    kept = run_steps("call")
    assert kept["outcome"].startswith("kept"), kept
    assert max(kept["faults"]) < pages_per_step // 50, kept


@glibc_only
def test_opting_out_and_the_users_own_settings_leave_malloc_alone():
    off = run_steps("call", PERSIA_MALLOC_TUNING="0")
    assert off["outcome"].startswith("off"), off
    assert min(off["faults"]) > 96 * 256 // 2, off
    users = run_steps("call", MALLOC_TRIM_THRESHOLD_="131072")
    assert users["outcome"] == "left to the environment (MALLOC_TRIM_THRESHOLD_ is set)"
    tunables = run_steps("call", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert tunables["outcome"] == "left to the environment (GLIBC_TUNABLES is set)"


@pytest.mark.parametrize("value", ["yes", "2", "on"])
def test_a_bad_setting_is_refused_by_name(value):
    settings = Settings.from_env({"PERSIA_MALLOC_TUNING": value})
    with pytest.raises(ConfigError, match=f"PERSIA_MALLOC_TUNING must be 0 or 1, got '{value}'"):
        allocator.malloc_tuning_enabled(settings)


@pytest.mark.parametrize(("value", "enabled"), [("", True), ("1", True), (" 0 ", False)])
def test_the_setting_defaults_to_on(value, enabled):
    settings = Settings.from_env({"PERSIA_MALLOC_TUNING": value})
    assert allocator.malloc_tuning_enabled(settings) is enabled


@pytest.mark.parametrize("command", ["embedding-parameter-server", "embedding-worker"])
def test_a_service_with_a_bad_setting_refuses_to_start_and_names_it(job_env, command):
    config = REPO / "examples" / "adult_income" / "config" / "embedding_config.yml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.launcher",
            command,
            "--port",
            "0",
            "--embedding-config",
            str(config),
        ],
        cwd=REPO,
        env={**os.environ, **job_env, "PERSIA_MALLOC_TUNING": "yes"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "PERSIA_MALLOC_TUNING must be 0 or 1, got 'yes'" in done.stderr
