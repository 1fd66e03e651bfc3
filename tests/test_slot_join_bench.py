"""Smoke test of ``benchmarks/slot_join_bench.py``: a tiny run times both joins in both
phases and prints its RESULT line. Its flags and RESULT keys are guarded in the default
suite by tests/test_benchmark_cli.py."""

from __future__ import annotations

import json

import pytest

from tests.bench_results import refusal, smoke_result


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(180)
def test_slot_join_bench_times_both_joins(tmp_path):
    out_json = tmp_path / "join.json"
    smoke_result("slot_join_bench.py", "--calls", "2", "--json", str(out_json))
    rows = json.loads(out_json.read_text())["rows"]
    assert {(r["phase"], r["side"]) for r in rows} == {
        (phase, side)
        for phase in ("forward", "forward + backward")
        for side in ("columns", "slot by slot")
    }


def test_slot_join_bench_refuses_an_empty_run():
    assert "--calls: expected >= 1, got 0" in refusal("slot_join_bench.py", "--calls", "0")
