"""The ``RESULT`` keys each benchmark promises, in order: one table for the cheap guard
(tests/test_benchmark_cli.py, default suite) and the whole-run smoke tests (``slow``)."""

from __future__ import annotations

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
