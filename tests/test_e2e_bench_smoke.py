"""Smoke test of the end-to-end benchmark: ``e2e_bench.py --quick`` runs the whole pipeline.

A tiny run (20 batches of the real Census-Income data) through redis-server, one PS,
one embedding worker, the NN worker and a data loader, and the single-process
baseline on the same batches. The test checks the script exits 0 (so every service
exited 0), ends with exactly one parseable ``RESULT`` line with the promised keys,
and writes its JSON with the per-process CPU shares and both sides' step counts.
Numbers are not judged: only that the benchmark still works against the current code.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import parse_result_line  # noqa: E402

KEYS = ["pyrsia_samples_per_s", "baseline_samples_per_s", "ratio", "pyrsia_auc", "baseline_auc"]


@pytest.mark.timeout(170)
def test_e2e_bench_quick_runs_the_pipeline_and_prints_one_result_line(tmp_path):
    out_json = tmp_path / "e2e.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "e2e_bench.py"), "--quick", "--json", str(out_json)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=160,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert out.rstrip().splitlines()[-1].startswith("RESULT "), "RESULT is not the last line"
    result = parse_result_line(out)
    assert list(result) == KEYS
    assert all(math.isfinite(v) and v > 0 for v in result.values()), result
    doc = json.loads(out_json.read_text())
    census = doc["results"][0]
    assert census["dataset"] == "census"
    assert census["pyrsia"]["steps"] == census["baseline"]["steps"] == 20
    assert set(census["pyrsia"]["exit_codes"].values()) == {0}
    assert {"nn_worker", "embedding_worker", "embedding_ps", "data_loader", "redis"} <= set(
        census["pyrsia"]["cpu"]
    )
