"""A rank whose exit path is stuck after SIGTERM still ends, within SIGTERM_DEADLINE_S, with exit 1."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pyrsia.shared.constants import SIGTERM_DEADLINE_S

REPO = Path(__file__).resolve().parent.parent

STUCK = """
import os, signal, time
from pyrsia.services.nn_worker.termination import TerminationGuard
TerminationGuard().install()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
except SystemExit:
    while True:  # an exit path that never returns (as a call to a dead Redis could)
        time.sleep(0.05)
"""

CLEAN = """
import os, signal, time
from pyrsia.services.nn_worker.termination import TerminationGuard
TerminationGuard().install()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
"""


def run(script: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    return done, time.monotonic() - start


def test_a_stuck_exit_ends_at_the_deadline_with_the_stacks_and_exit_1():
    done, seconds = run(STUCK)
    assert done.returncode == 1, done.stderr[-2000:]
    assert SIGTERM_DEADLINE_S <= seconds < SIGTERM_DEADLINE_S + 20
    assert "has not stopped" in done.stderr
    assert "Thread" in done.stderr and "File" in done.stderr  # faulthandler's stacks
    assert "time.sleep" in done.stderr or "<string>" in done.stderr  # where it was stuck


def test_a_clean_exit_after_sigterm_is_0_and_the_watchdog_stays_silent():
    done, seconds = run(CLEAN)
    assert done.returncode == 0, done.stderr[-2000:]
    assert seconds < SIGTERM_DEADLINE_S + 20
    assert "has not stopped" not in done.stderr
    assert "training stopped, exit 0" in done.stderr


MID_LOG_LINE = """
import logging, os, signal, sys, time
from pyrsia.shared.progress_lines import ProgressLines
from pyrsia.services.nn_worker.termination import TerminationGuard

class SlowPipe:  # a pipe its reader drains slowly: a write waits
    def write(self, text):
        time.sleep(0.2)
        return sys.__stderr__.write(text)
    def flush(self):
        sys.__stderr__.flush()

logging.basicConfig(stream=ProgressLines(SlowPipe()), level=logging.INFO, force=True)
TerminationGuard().install()
signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
signal.setitimer(signal.ITIMER_REAL, 0.1)  # SIGALRM mid-write: a SIGTERM, in the write
logging.getLogger("train").error("training stopped; a line on its way out")
time.sleep(60)
"""


def test_sigterm_in_the_middle_of_a_log_line_still_ends_the_rank():
    # the handler's own log line used to wait for the stream's lock the interrupted write
    # held, in the same thread: the rank hung with the job's output pipe (honcho never ended)
    done, seconds = run(MID_LOG_LINE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert seconds < SIGTERM_DEADLINE_S + 20
    assert "SIGTERM: stopping training" in done.stderr
    assert "training stopped, exit 0" in done.stderr
