"""Smoke test of the feed-rate benchmark (``benchmarks/feed_rate.py``, issue 30).

A tiny run (a few 256-row batches of the Criteo-shaped synthetic set, ``--dense sleep``)
through redis-server, one PS, one embedding worker, the NN worker and a data loader, and
the 2-thread baseline on the same batches. Checks that the script exits 0, ends with one
parseable ``RESULT`` line, writes the JSON with every promised field (CPU model, samples/s,
the NN worker's CPU outside the dense step, each service's CPU per batch, the NN workers
one core feeds, the ratio to the baseline) and the PNG beside it. Numbers are not judged
(a loaded machine makes them anything): only that they are there and finite.
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

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _finite_positive(value: float) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(300)
def test_feed_rate_sleep_run_writes_json_fields_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    out_json = tmp_path / "feed.json"
    out = _run_tiny(tmp_path, out_json)
    assert out.rstrip().splitlines()[-1].startswith("RESULT "), "RESULT is not the last line"
    result = parse_result_line(out)
    assert list(result) == ["feed_samples_per_s", "baseline_samples_per_s", "ratio"]
    assert all(_finite_positive(v) for v in result.values()), result
    doc = json.loads(out_json.read_text())
    assert doc["machine"]["cpu_model"]
    (criteo,) = doc["results"]
    assert criteo["dataset"] == "criteo"
    configs = {(c["ps_replicas"], c["ew_replicas"]): c for c in criteo["configs"]}
    assert list(configs) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # --ps-replicas x --ew-replicas
    config, sharded = configs[1, 1], configs[2, 2]
    assert config["dense"] == "sleep" and config["batch"] == 256 and config["steps"] == 8
    _check_replicas_tracked(sharded)
    for name in ("criteo/sleep/256/ps2 ", "criteo/sleep/256/ew2 ", "criteo/sleep/256/ps2/ew2 "):
        assert name in out, name
    _check_config_figures(config)
    (baseline,) = criteo["baselines"]
    assert baseline["batch"] == 256 and baseline["threads"] == 2
    png = out_json.with_suffix(".png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert f"PNG: {png}" in out


def _run_tiny(tmp_path: Path, out_json: Path) -> str:
    """A few 256-row Criteo batches, sleep dense step, 1 and 2 PS shards x 1 and 2 embedding
    workers; its output (the script exited 0)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "feed_rate.py"),
            "--dense",
            "sleep",
            "--dense-ms",
            "1",
            "--datasets",
            "criteo",
            "--criteo-rows",
            "3000",
            "--batches",
            "256",
            "--max-steps",
            "8",
            "--ps-replicas",
            "1,2",
            "--ew-replicas",
            "1,2",
            "--json",
            str(out_json),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def _check_replicas_tracked(sharded: dict) -> None:
    """Both PS shards and both embedding workers ran, were tracked, and sum to the service."""
    for role, key, names in (
        ("embedding_ps", "ps_shards_cpu_ms_per_batch", {"embedding_ps.0", "embedding_ps.1"}),
        (
            "embedding_worker",
            "ew_replicas_cpu_ms_per_batch",
            {"embedding_worker.0", "embedding_worker.1"},
        ),
    ):
        replicas = sharded[key]  # both replicas ran and were tracked
        assert set(replicas) == names  # (an 8-step window may read 0)
        assert all(v >= 0 for v in replicas.values())
        assert sum(replicas.values()) == pytest.approx(sharded["services_cpu_ms_per_batch"][role])


def _check_config_figures(config: dict) -> None:
    """One configuration's promised figures: finite and positive where they must be."""
    for key in (
        "samples_per_s",
        "baseline_samples_per_s",
        "ratio",
        "nn_cpu_ms_per_batch",
        "nn_cpu_ms_outside_dense",
    ):
        assert _finite_positive(config[key]), (key, config[key])
    assert set(config["services_cpu_ms_per_batch"]) == {
        "embedding_ps",
        "embedding_worker",
        "data_loader",
    }
    assert all(v >= 0 for v in config["services_cpu_ms_per_batch"].values())
    assert set(config["nn_workers_fed_per_core"]) == {"embedding_ps", "embedding_worker"}
    assert config["ratio"] == pytest.approx(
        config["samples_per_s"] / config["baseline_samples_per_s"]
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--ps-replicas", "0", "--ps-replicas: expected distinct positive integers"),
        ("--ew-replicas", "1,1", "--ew-replicas: expected distinct positive integers"),
        ("--dense", "tpu", "--dense: expected distinct values among ('sleep', 'cpu', 'cuda')"),
    ],
)
def test_feed_rate_refuses_a_bad_flag(flag, value, message):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "feed_rate.py"), flag, value],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stdout


def test_the_chart_has_a_bar_per_replica_configuration(tmp_path, monkeypatch):
    import feed_report
    import plots

    drawn = {}
    monkeypatch.setattr(
        plots,
        "save_bar_chart",
        lambda path, labels, series, **kw: drawn.update(labels=labels, series=series) or path,
    )

    def config(ps: int, ew: int, rate: float, services: str = "working tree") -> dict:
        return {
            "dataset": "criteo",
            "dense": "sleep",
            "batch": 1024,
            "ps_replicas": ps,
            "ew_replicas": ew,
            "services": services,
            "samples_per_s": rate,
        }

    configs = [
        config(1, 1, 100.0),
        config(4, 2, 200.0),
        config(4, 2, 220.0),
        config(4, 2, 999.0, services="abc1234"),
    ]
    results = [
        {
            "dataset": "criteo",
            "configs": configs,
            "baselines": [{"batch": 1024, "samples_per_s": 40.0}],
        }
    ]
    feed_report.plot(results, tmp_path / "chart.png")
    assert drawn["labels"] == ["criteo 1024"]
    assert drawn["series"] == {  # the working tree's median per configuration
        "dense sleep": [100.0],
        "dense sleep ps4 ew2": [210.0],
        "baseline (2 threads)": [40.0],
    }
