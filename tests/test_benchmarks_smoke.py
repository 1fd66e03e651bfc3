"""Smoke test of the service benchmarks: each runs end to end at a tiny size (``--quick``).

The scripts run one after another as subprocesses (each starts its own redis-server and
services; run together, four sets of services on a loaded 2-core machine starved each
other past a 60 s request deadline); the test checks they exit 0, print exactly one parseable ``RESULT`` line with
the promised keys, and write their JSON. Numbers are not judged here: only that the
scripts still work against the current code. These runs are ``slow`` and ``bench`` (``make
test-bench``): under load they outlast request deadlines; the default suite keeps the cheap
guard of their flags and RESULT keys (tests/test_benchmark_cli.py).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import parse_result_line  # noqa: E402

from tests.bench_results import RESULT_KEYS, SERVICE_BENCHES  # noqa: E402

BENCHES = {name: RESULT_KEYS[name] for name in SERVICE_BENCHES}


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(600)
def test_benchmarks_quick_print_a_parseable_result_line(tmp_path):
    started = time.monotonic()
    outputs, codes = {}, {}
    for name in BENCHES:
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / name),
                "--quick",
                "--json",
                str(tmp_path / f"{name}.json"),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=240,
        )
        outputs[name], codes[name] = proc.stdout, proc.returncode
    for name, keys in BENCHES.items():
        out = outputs[name]
        assert codes[name] == 0, f"{name} failed:\n{out[-3000:]}"
        assert out.rstrip().splitlines()[-1].startswith("RESULT "), f"{name}: RESULT is not last"
        result = parse_result_line(out)
        assert list(result) == keys, f"{name}: {result}"
        assert all(math.isfinite(v) and v > 0 for v in result.values()), f"{name}: {result}"
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert "machine" in doc
        png = tmp_path / f"{name}.png"  # benchmarks/plots.py's chart beside the JSON
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"PNG: {png}" in out, (
            f"{name}: no PNG"
        )
    print(f"benchmarks quick: {time.monotonic() - started:.1f}s")


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(300)
def test_contention_benchmark_quick_prints_its_result_line(tmp_path):
    """The baseline alone and beside a side load, 1 and 2 threads (benchmarks/contention_bench.py)."""
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "contention_bench.py"),
            "--quick",
            "--json",
            str(tmp_path / "contention.json"),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = parse_result_line(out.stdout)
    assert set(result) == {
        "two_threads_alone",
        "two_threads_loaded",
        "two_threads_beside_idle_class",
        "one_thread_alone",
        "two_processes",
    }
    assert all(v > 0 for v in result.values())
