"""benchmarks/cluster_bench.py end to end at its smallest (``--quick``: 20k Census rows,
RTT 0 direct, 0 and 0.5 ms through the relay, one rate)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cluster.job import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_cluster_bench_quick_prints_its_table_and_json(netns_reason, tmp_path):
    if netns_reason is not None:
        pytest.skip(f"cluster in a box needs network namespaces: {netns_reason}")
    out = tmp_path / "cluster_bench.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "cluster_bench.py"),
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "vs 0 ms relay" in run.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rtt_target_ms"], r["via_proxy"]) for r in rows] == [
        (0.0, False),
        (0.0, True),
        (0.5, True),
    ]
    assert all(r["samples_per_s"] > 0 and 0.5 < r["auc"] <= 1 for r in rows), rows
    assert 0.25 < rows[2]["rtt_p50_ms"] < 1.5, rows[2]  # the relay gives about the RTT asked
