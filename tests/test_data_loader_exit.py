"""How ``persia-launcher data-loader`` ends once the user's script is done.

A loader usually finishes while the NN workers still train, so it skips interpreter
finalization (~0.65 s of CPU with torch loaded): the script's ``atexit`` handlers run, its
output is flushed, its exit code is kept, and an object that only finalization would
collect is never finalized. A script that leaves a non-daemon thread running gets the
plain exit, which waits for the thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MARKERS = """
import atexit, gc, sys
from pathlib import Path
out = Path(sys.argv[1])
# runs last: from then on any allocation may collect; a collection on the way out must not
# finalize what only finalization would
atexit.register(gc.set_threshold, 1, 1, 1)

class Finalized:  # only interpreter finalization would run this __del__
    def __del__(self):
        (out / "finalized").write_text("yes")

KEEP = Finalized()
atexit.register(lambda: (out / "atexit").write_text("yes"))
print("last words", end="")  # no newline: only a flush gets it out
"""


def run_loader(script: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.launcher",
            "data-loader",
            "--exit-when-done",
            str(script),
            str(out),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_finished_loader_runs_atexit_flushes_and_skips_finalization(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(MARKERS)
    done = run_loader(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("last words")
    assert (tmp_path / "atexit").read_text() == "yes"
    assert not (tmp_path / "finalized").exists()


def test_the_scripts_exit_code_is_the_processes(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(MARKERS + "sys.exit(3)\n")
    done = run_loader(script, tmp_path)
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "atexit").read_text() == "yes"
    assert not (tmp_path / "finalized").exists()


def test_a_thread_left_running_is_waited_for_by_a_plain_exit(tmp_path):
    script = tmp_path / "loader.py"
    late = (
        "import threading, time\n"
        "def late():\n"
        "    time.sleep(0.5)\n"
        "    (out / 'thread').write_text('yes')\n"
        "threading.Thread(target=late).start()\n"
    )
    script.write_text(MARKERS + late)
    done = run_loader(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread").read_text() == "yes"  # the exit waited for it
    assert (tmp_path / "atexit").read_text() == "yes"
    assert (tmp_path / "finalized").read_text() == "yes"  # the plain path: finalization ran
