"""``make demo`` and ``make venv`` do what the getting-started pages say.

``make demo`` runs the Adult example through ``persia-launcher run`` (its own Redis and free
ports: tests/test_launcher_run.py runs that same command line end to end), and the install
step compiles the numba kernels, so the first job does not.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _recipe(*target: str) -> list[list[str]]:
    """The commands ``make -n`` would run (nothing runs), each split like a shell would."""
    # --no-print-directory: under `make test` the child make would print "make[1]: Leaving
    # directory ..." lines (MAKELEVEL is inherited), which are not commands
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", *target],
        cwd=REPO,
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    return [
        shlex.split(line)
        for line in out.replace("\\\n", " ").splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_make_demo_runs_the_adult_job_through_persia_launcher_run():
    last = _recipe("demo")[-1]
    assert last[:2] == [".venv/bin/persia-launcher", "run"], last
    flags = dict(zip(last[2::2], last[3::2], strict=True))
    assert set(flags) == {"--nn-worker", "--data-loader", "--embedding-config", "--global-config"}
    for flag, path in flags.items():
        assert (REPO / path).is_file(), (flag, path)


def test_the_install_step_compiles_the_kernels():
    commands = _recipe("-B", ".venv/.installed")
    install = max(i for i, c in enumerate(commands) if c[:2] == [".venv/bin/pip", "install"])
    warm = [i for i, c in enumerate(commands) if c[-2:] == ["-m", "pyrsia.services.warmup"]]
    assert warm and warm[0] > install, commands  # after the project is installed
