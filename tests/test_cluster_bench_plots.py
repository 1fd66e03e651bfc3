"""benchmarks/cluster_bench.py --plot-from: a saved run's two PNGs, drawn without namespaces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "cluster_bench.py"

pytestmark = pytest.mark.timeout(120)


def _row(rtt: float, via_proxy: bool, staleness: int, samples: float, wait: float) -> dict:
    return {
        "rtt_target_ms": rtt,
        "via_proxy": via_proxy,
        "rate": "10gbit",
        "staleness": staleness,
        "rtt_p50_ms": rtt + 0.1,
        "rtt_p90_ms": rtt + 0.3,
        "samples_per_s": samples,
        "auc": 0.944,
        "wait_ms_p50": wait,
        "wait_ms_p90": wait,
        "proxy_cpu_s": 0.0,
    }


def _plot(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), "--plot-from", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
        timeout=100,
    )


def test_plot_from_a_saved_run_writes_both_pngs_beside_it(tmp_path):
    pytest.importorskip("matplotlib")
    saved = tmp_path / "cluster_bench-x.json"
    rows = [
        _row(0.0, False, 8, 20000, 0.1),
        _row(0.0, True, 8, 12000, 0.1),
        _row(2.0, True, 8, 12500, 0.1),
        _row(0.0, True, 1, 5400, 18.0),
        _row(2.0, True, 1, 7000, 27.0),
    ]
    saved.write_text(json.dumps({"rows": rows}))
    run = _plot(saved)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "vs 0 ms relay" in run.stdout  # the table again
    for name in ("cluster_bench-x.png", "cluster_bench-x-wait.png"):
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 5000, name  # axes, lines and labels, not an empty canvas
        assert f"wrote {png}" in run.stdout


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (json.dumps({"benchmark": "e2e"}), "no rows"),
        ("[1, 2]", "no rows"),
        ("{not json", "cannot read"),
    ],
    ids=["no-rows", "not-an-object", "not-json"],
)
def test_plot_from_a_file_that_is_not_a_saved_run_is_refused_naming_the_flag(tmp_path, text, says):
    saved = tmp_path / "other.json"
    saved.write_text(text)
    run = _plot(saved)
    assert run.returncode == 2
    assert "--plot-from" in run.stderr and says in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.glob("*.png"))
