"""The cheap guard of every benchmark's command line and ``RESULT`` line (default suite).

The whole benchmark runs (``--quick``) start services and train: on a loaded 2-core machine
they outlast request deadlines, so they are ``slow`` and ``bench`` (``make test-bench``).
What breaks most often when the code moves under a benchmark is its import, its flags and the
keys of its ``RESULT`` line; those are checked here in a few seconds: ``--help`` exits 0 and
lists ``--json``, each promised key is printed by the script's code,
and a line of those keys parses.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_results import RESULT_KEYS

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

from _common import parse_result_line  # noqa: E402


def _run_all(extra: list[str]) -> dict[str, subprocess.CompletedProcess]:
    """Every benchmark with ``extra`` flags, started together (each only imports its modules
    and parses its flags)."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(BENCH_DIR / name), *extra],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in RESULT_KEYS
    }
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=90)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.mark.timeout(120)
def test_every_benchmark_parses_its_flags():
    for name, proc in _run_all(["--help"]).items():
        assert proc.returncode == 0, f"{name} --help:\n{proc.stderr[-2000:]}"
        assert "--json" in proc.stdout, f"{name} --help does not list --json"


def _printed(key: str, source: str) -> bool:
    """``key={`` in an f-string, ``"key": `` in a dict, or ``f"ratio_{proc}"`` for ``ratio_ew``."""
    head = key.rsplit("_", 1)[0]
    return bool(re.search(rf'\b{key}(=\{{|": )', source) or re.search(rf'f"{head}_\{{', source))


@pytest.mark.parametrize("name", list(RESULT_KEYS))
def test_every_promised_result_key_is_printed_by_the_benchmark(name):
    source = (BENCH_DIR / name).read_text()
    missing = [k for k in RESULT_KEYS[name] if not _printed(k, source)]
    assert not missing, f"{name} no longer prints {missing} on its RESULT line"
    line = "RESULT " + " ".join(f"{k}={i + 0.5}" for i, k in enumerate(RESULT_KEYS[name]))
    assert list(parse_result_line(f"table\n{line}\n")) == RESULT_KEYS[name]
