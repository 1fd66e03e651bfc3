"""Smoke test of ``benchmarks/ps_shards_bench.py``: a tiny run times every shard setting on
both batch shapes and prints its RESULT line. Its flags and RESULT keys are guarded in the
default suite by tests/test_benchmark_cli.py."""

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
def test_ps_shards_bench_times_every_setting(tmp_path):
    out_json = tmp_path / "shards.json"
    bench = REPO / "benchmarks" / "ps_shards_bench.py"
    proc = subprocess.run(
        [sys.executable, str(bench), "--rounds", "1", "--batches", "2", "--json", str(out_json)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = parse_result_line(proc.stdout)
    assert list(result) == RESULT_KEYS["ps_shards_bench.py"]
    assert all(v > 0 for v in result.values())
    rows = json.loads(out_json.read_text())["rows"]
    assert {(r["shape"], r["shards"]) for r in rows} == {
        (shape, shards) for shape in ("census", "criteo") for shards in (1, 8, 64)
    }


def test_ps_shards_bench_refuses_an_empty_run():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ps_shards_bench.py"), "--rounds", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--rounds, --batches: expected >= 1, got 0, 40" in proc.stderr
