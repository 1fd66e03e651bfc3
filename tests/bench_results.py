"""The ``RESULT`` keys each benchmark promises, in order: one table for the cheap guard
(tests/test_benchmark_cli.py, default suite) and the whole-run smoke tests (``slow``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RESULT_KEYS: dict[str, list[str]] = {
    "ps_bench.py": [
        "engine_lookup_ids_per_s",
        "engine_adagrad_update_ids_per_s",
        "http_lookup_ids_per_s",
        "bytes_per_entry_ratio",
    ],
    "ew_bench.py": ["ew_samples_per_s", "ew_ids_per_s"],
    "ps_growth_bench.py": ["in_place_s", "copy_s", "ratio"],
    "request_cpu_bench.py": [
        "ew_cpu_ms_per_step",
        "ps_cpu_ms_per_step",
        "client_cpu_ms_per_step",
        "ratio_ew",
        "ratio_ps",
        "ratio_client",
    ],
    "e2e_bench.py": [
        "pyrsia_samples_per_s",
        "baseline_samples_per_s",
        "ratio",
        "pyrsia_auc",
        "baseline_auc",
    ],
    "feed_rate.py": ["feed_samples_per_s", "baseline_samples_per_s", "ratio"],
    "embedded_engine_bench.py": [
        "engine_cpu_ms_per_batch",
        "prepare_cpu_ms",
        "lookup_cpu_ms",
        "tensors_cpu_ms",
        "payload_cpu_ms",
        "gradients_cpu_ms",
    ],
    "ps_shards_bench.py": ["unset_cpu_us", "persia_default_cpu_us", "ratio"],
    "slot_join_bench.py": ["columns_us", "slot_by_slot_us", "ratio"],
    "contention_bench.py": [
        "two_threads_alone",
        "two_threads_loaded",
        "two_threads_beside_idle_class",
        "one_thread_alone",
        "two_processes",
    ],
}

# the four service benchmarks that tests/test_benchmarks_smoke.py runs one after another
SERVICE_BENCHES = ("ps_bench.py", "ew_bench.py", "ps_growth_bench.py", "request_cpu_bench.py")


def run_benchmark(script: str, *flags: str, timeout: float = 170) -> subprocess.CompletedProcess:
    """``benchmarks/<script> <flags>`` run from the repository root, stdout and stderr kept
    apart (``.stdout`` holds the table and the RESULT line)."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def smoke_result(script: str, *flags: str) -> dict[str, float]:
    """A benchmark's RESULT after a run that must succeed and print every promised key
    (:data:`RESULT_KEYS`) with a positive value."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from _common import parse_result_line

    proc = run_benchmark(script, *flags)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = parse_result_line(proc.stdout)
    assert list(result) == RESULT_KEYS[script]
    assert all(v > 0 for v in result.values()), result
    return result


def refusal(script: str, *flags: str) -> str:
    """What a benchmark prints on stderr when it refuses ``flags`` (exit status 2)."""
    proc = run_benchmark(script, *flags, timeout=60)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stderr
