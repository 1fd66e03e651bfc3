"""The NN-worker launcher, once its ranks have ended, finishes giving back its job slot even
when a stop signal arrives meanwhile: ``persia-launcher run`` sends SIGTERM to every process
when another one fails, and a second traceback from torch's signal handler (still installed
after the agent returned) would bury the rank's own error."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, signal, time
    from pyrsia.services.nn_worker.launch import ignore_stop_signals

    def torch_handler(signum, frame):  # what torch's elastic agent leaves installed
        raise RuntimeError(f"got signal {signum}")

    signal.signal(signal.SIGTERM, torch_handler)
    signal.signal(signal.SIGINT, torch_handler)
    ignore_stop_signals()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # the slot's give-back would run here
    print("slot given back")
    """
)


def test_a_stop_signal_after_the_ranks_ended_does_not_interrupt_the_give_back():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "slot given back"
    assert "Traceback" not in proc.stderr
