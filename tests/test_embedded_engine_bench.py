"""Smoke test of ``benchmarks/embedded_engine_bench.py``: a tiny run replays the engine path
(prepare, lookup, tensors, gradient payload, gradients) and prints its RESULT line. Its flags
and RESULT keys are guarded in the default suite by tests/test_benchmark_cli.py."""

from __future__ import annotations

import json

import pytest

from tests.bench_results import refusal, smoke_result


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(180)
def test_embedded_engine_bench_times_every_phase(tmp_path):
    out_json = tmp_path / "engine.json"
    flags = ("--batches", "3", "--passes", "1", "--json", str(out_json))
    smoke_result("embedded_engine_bench.py", *flags)
    phases = {p["phase"] for p in json.loads(out_json.read_text())["phases"]}
    assert phases == {"build", "prepare", "lookup", "tensors", "backward", "payload", "gradients"}


def test_embedded_engine_bench_refuses_an_empty_run():
    stderr = refusal("embedded_engine_bench.py", "--passes", "0")
    assert "--batches, --passes: expected >= 1" in stderr
