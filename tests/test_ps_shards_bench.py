"""Smoke test of ``benchmarks/ps_shards_bench.py``: a tiny run times every shard setting on
both batch shapes and prints its RESULT line. Its flags and RESULT keys are guarded in the
default suite by tests/test_benchmark_cli.py."""

from __future__ import annotations

import json

import pytest

from tests.bench_results import refusal, smoke_result


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(180)
def test_ps_shards_bench_times_every_setting(tmp_path):
    out_json = tmp_path / "shards.json"
    smoke_result("ps_shards_bench.py", "--rounds", "1", "--batches", "2", "--json", str(out_json))
    rows = json.loads(out_json.read_text())["rows"]
    assert {(r["shape"], r["shards"]) for r in rows} == {
        (shape, shards) for shape in ("census", "criteo") for shards in (1, 8, 64)
    }


def test_ps_shards_bench_refuses_an_empty_run():
    stderr = refusal("ps_shards_bench.py", "--rounds", "0")
    assert "--rounds, --batches: expected >= 1, got 0, 40" in stderr
