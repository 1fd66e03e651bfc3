"""Smoke test of ``benchmarks/embedded_engine_bench.py``: a tiny run replays the engine path
(prepare, lookup, tensors, gradient payload, gradients) and prints its RESULT line. Its flags
and RESULT keys are guarded in the default suite by tests/test_benchmark_cli.py."""

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
def test_embedded_engine_bench_times_every_phase(tmp_path):
    out_json = tmp_path / "engine.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "embedded_engine_bench.py"),
            "--batches",
            "3",
            "--passes",
            "1",
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
    result = parse_result_line(proc.stdout)
    assert list(result) == RESULT_KEYS["embedded_engine_bench.py"]
    assert all(v > 0 for v in result.values())
    phases = {p["phase"] for p in json.loads(out_json.read_text())["phases"]}
    assert phases == {"build", "prepare", "lookup", "tensors", "backward", "payload", "gradients"}


def test_embedded_engine_bench_refuses_an_empty_run():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "embedded_engine_bench.py"), "--passes", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--batches, --passes: expected >= 1" in proc.stderr
