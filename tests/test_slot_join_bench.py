"""Smoke test of ``benchmarks/slot_join_bench.py``: a tiny run times both joins in both
phases and prints its RESULT line. Its flags and RESULT keys are guarded in the default
suite by tests/test_benchmark_cli.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_results import RESULT_KEYS

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import parse_result_line  # noqa: E402


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(180)
def test_slot_join_bench_times_both_joins(tmp_path):
    out_json = tmp_path / "join.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "slot_join_bench.py"),
            "--calls",
            "2",
            "--json",
            str(out_json),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "Warning" not in proc.stdout, proc.stdout[-4000:]
    result = parse_result_line(proc.stdout)
    assert list(result) == RESULT_KEYS["slot_join_bench.py"]
    assert all(v > 0 for v in result.values())
    rows = json.loads(out_json.read_text())["rows"]
    assert {(r["phase"], r["side"]) for r in rows} == {
        (phase, side)
        for phase in ("forward", "forward + backward")
        for side in ("columns", "slot by slot")
    }


def test_slot_join_bench_refuses_an_empty_run():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "slot_join_bench.py"), "--calls", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--calls: expected >= 1, got 0" in proc.stderr
