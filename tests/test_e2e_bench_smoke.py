"""Smoke test of the end-to-end benchmark: ``e2e_bench.py --quick`` runs the whole pipeline.

A tiny run (20 batches of the real Census-Income data) through redis-server, one PS,
one embedding worker, the NN worker and a data loader, and the single-process
baseline on the same batches. The test checks the script exits 0 (so every service
exited 0), ends with exactly one parseable ``RESULT`` line with the promised keys,
and writes its JSON with the per-process CPU shares and both sides' step counts.
Numbers are not judged: only that the benchmark still works against the current code.
The whole runs are ``slow`` and ``bench`` (``make test-bench``); the default suite keeps the
cheap guard of the flags and RESULT keys (tests/test_benchmark_cli.py) and the refusals here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import cpu_model, parse_result_line  # noqa: E402

from tests.bench_results import RESULT_KEYS  # noqa: E402

KEYS = RESULT_KEYS["e2e_bench.py"]


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(170)
def test_e2e_bench_quick_runs_the_pipeline_and_prints_one_result_line(tmp_path):
    out_json = tmp_path / "e2e.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--json",
            str(out_json),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=160,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert out.rstrip().splitlines()[-1].startswith("RESULT "), "RESULT is not the last line"
    result = parse_result_line(out)
    assert list(result) == KEYS
    assert all(math.isfinite(v) and v > 0 for v in result.values()), result
    doc = json.loads(out_json.read_text())
    png = out_json.with_suffix(".png")  # benchmarks/plots.py's chart beside the JSON
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"PNG: {png}" in out
    census = doc["results"][0]
    assert census["dataset"] == "census"
    assert census["pyrsia"]["steps"] == census["baseline"]["steps"] == 20
    assert census["pyrsia"]["dense_fused_adam"] is False  # the Adam unless asked
    assert census["pyrsia"]["malloc_tuning"] == "on"  # Pyrsia's default, as a job runs
    # the README's code as written: no DataLoader option, torch's (the launcher's) threads
    assert census["pyrsia"]["loader_options"] == {}
    assert census["pyrsia"]["threads"] == len(os.sched_getaffinity(0))
    assert census["baseline"]["threads"] == census["pyrsia"]["threads"]
    assert f"CPU: {cpu_model()}" in out and "Medians of 1 same-run pair(s)" in out
    assert result["ratio"] == pytest.approx(census["medians"]["pyrsia"]["ratio"], abs=1e-3)
    assert census["pyrsia"]["page_faults"] >= 0 and census["baseline"]["page_faults"] >= 0
    if os.confstr("CS_GNU_LIBC_VERSION"):  # TrainCtx and both services tuned their malloc
        logs = tmp_path / "logs"
        for log in [
            *logs.glob("nn-*.log"),
            *logs.glob("embedding_worker-*.log"),
            *logs.glob("embedding_ps-*.log"),
        ]:
            assert "freed heap memory: kept" in log.read_text(), log.name
    assert set(census["pyrsia"]["exit_codes"].values()) == {0}
    assert {"nn_worker", "embedding_worker", "embedding_ps", "data_loader", "redis"} <= set(
        census["pyrsia"]["cpu"]
    )


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(500)
def test_e2e_bench_quick_with_two_nn_worker_ranks_whole_and_split_batches(tmp_path):
    out_json = tmp_path / "e2e.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--nn-workers",
            "2",
            "--rank-batch",
            "whole,split",
            "--json",
            str(out_json),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=480,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    census = json.loads(out_json.read_text())["results"][0]
    base = census["baseline"]
    two = census["pyrsia_sides"]["pyrsia_2ranks"]  # whole 1,024-row batches per rank
    assert two["nn_workers"] == 2 and [r["steps"] for r in two["ranks"]] == [10, 10]
    assert two["steps"] == base["steps"] == 20  # every batch, once
    assert two["rank_batch"] == 1024 and two["dense_lr"] == pytest.approx(2e-3)
    assert set(two["exit_codes"].values()) == {0}
    assert {"nn_worker", "data_loader_0", "data_loader_1"} <= set(two["cpu"])
    split = census["pyrsia_sides"]["pyrsia_2ranks_split"]  # each rank half of every batch
    assert [r["steps"] for r in split["ranks"]] == [20, 20]
    assert split["samples"] == base["samples"] == 20 * 1024  # the same rows, once
    assert split["rank_batch"] == 512 and split["dense_lr"] == pytest.approx(1e-3)
    assert set(split["exit_codes"].values()) == {0}


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(300)
def test_e2e_bench_quick_with_fused_adam_runs_both_sides_and_the_fused_reference(tmp_path):
    out_json = tmp_path / "e2e.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--fused-adam",
            "--threads",
            "1",
            "--json",
            str(out_json),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    census = json.loads(out_json.read_text())["results"][0]
    assert census["pyrsia"]["dense_fused_adam"] is True
    assert census["pyrsia"]["steps"] == census["baseline"]["steps"] == 20
    fused = census["baseline_fused_adam"]  # the reference: the same baseline, fused Adam
    assert fused["steps"] == 20 and fused["fused_adam"] and 0.5 < fused["auc"] <= 1.0
    assert census["baseline"]["fused_adam"] is False  # the yardstick keeps the Adam
    assert [q["threads"] for q in census["fused_adam_pairs"]] == [1]
    assert "Pyrsia with fused Adam vs the baseline with fused Adam" in proc.stdout


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(300)
def test_e2e_bench_quick_with_malloc_tuning_on_and_off_runs_both(tmp_path):
    out_json, logs = tmp_path / "e2e.json", tmp_path / "logs"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--malloc-tuning",
            "on,off",
            "--threads",
            "1",
            "--json",
            str(out_json),
            "--log-dir",
            str(logs),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    sides = json.loads(out_json.read_text())["results"][0]["pyrsia_sides"]
    assert sides["pyrsia"]["malloc_tuning"] == "on" and sides["pyrsia"]["steps"] == 20
    assert sides["pyrsia_malloc_off"]["malloc_tuning"] == "off"
    assert sides["pyrsia_malloc_off"]["steps"] == 20
    # the off side runs last: its NN worker left malloc alone
    assert "freed heap memory: off (PERSIA_MALLOC_TUNING=0)" in (logs / "nn-1.log").read_text()


def test_e2e_bench_rejects_a_split_that_does_not_divide_the_batch():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--nn-workers",
            "3",
            "--rank-batch",
            "split",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--rank-batch split: the ranks must divide the batch 1024, got [3]" in proc.stdout


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(200)
def test_e2e_bench_quick_embedded_mode_with_malloc_tuning_on_and_off_runs_both(tmp_path):
    """``--modes embedded`` honours ``--malloc-tuning`` too (it used to run only the tuned
    side, silently), and ``--settings``: the tuned rows beside the README's defaults."""
    out_json, logs = tmp_path / "e2e.json", tmp_path / "logs"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--modes",
            "embedded",
            "--malloc-tuning",
            "on,off",
            "--settings",
            "defaults,tuned",
            "--json",
            str(out_json),
            "--log-dir",
            str(logs),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=190,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    sides = json.loads(out_json.read_text())["results"][0]["pyrsia_sides"]
    assert set(sides) == {
        "pyrsia_embedded",
        "pyrsia_embedded_malloc_off",
        "pyrsia_embedded_tuned",
        "pyrsia_embedded_malloc_off_tuned",
    }
    assert sides["pyrsia_embedded"]["loader_options"] == {}  # the README's DataLoader
    tuned = {"embedding_staleness": 8, "reproducible": True}
    assert sides["pyrsia_embedded_tuned"]["loader_options"] == tuned
    assert sides["pyrsia_embedded"]["malloc_tuning"] == "on"
    assert sides["pyrsia_embedded_malloc_off"]["malloc_tuning"] == "off"
    assert sides["pyrsia_embedded"]["steps"] == sides["pyrsia_embedded_malloc_off"]["steps"] == 20
    # the off side runs last: its process left malloc alone
    assert (
        "freed heap memory: off (PERSIA_MALLOC_TUNING=0)"
        in (logs / "embedded-default.log").read_text()
    )


def test_a_run_with_more_torch_threads_than_cores_says_so():
    from e2e_bench import oversubscribed

    cores = len(os.sched_getaffinity(0))
    assert oversubscribed(cores) == ""
    assert oversubscribed(2 * cores) == (
        f" (oversubscribed: {2 * cores} torch threads on {cores} cores)"
    )


def test_threads_default_to_torchs_own_and_settings_name_the_rows():
    """``--threads default`` (0: torch's own, on each side) is the default; a thread count
    must be positive and distinct; ``--settings`` takes defaults and tuned."""
    from e2e_cli import parse_args

    _, args = parse_args([], "")
    assert args.threads == [0] and args.settings == ["defaults"]
    _, args = parse_args(["--threads", "default,1,2", "--settings", "defaults,tuned"], "")
    assert args.threads == [0, 1, 2] and args.settings == ["defaults", "tuned"]
    for bad in (["--threads", "0"], ["--threads", "default,default"], ["--settings", "fast"]):
        with pytest.raises(SystemExit):
            parse_args(bad, "")
