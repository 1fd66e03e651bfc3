"""An NN-worker rank's cumulative series are Prometheus counters (issue 49, item 5).

``rate()`` and ``increase()`` treat a counter's reset (a restarted rank) as a reset; on a
gauge they do not. The series that only grow are typed ``counter`` (exposed with
``_total``); the step number and the per-second rate stay gauges.
"""

from __future__ import annotations

import prometheus_client as prom

from pyrsia.services.nn_worker.rank_stats import RankStats, register_rank_metrics

COUNTERS = (
    "pyrsia_nn_worker_samples",
    "pyrsia_nn_worker_lookup_wait_seconds",
    "pyrsia_nn_worker_skipped_embedding_updates",
    "pyrsia_nn_worker_step_phase_seconds",
)


def _exposition() -> tuple[dict[str, str], str]:
    stats = RankStats()
    stats.samples, stats.skipped_updates, stats.lookup_wait_s = 12, 1, 0.5
    registry = prom.CollectorRegistry()
    register_rank_metrics(stats, registry)
    text = prom.generate_latest(registry).decode()
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    return types, text


def test_cumulative_series_are_counters_with_their_values():
    types, text = _exposition()
    for name in COUNTERS:
        assert types.get(f"{name}_total") == "counter", (name, types)
    assert "pyrsia_nn_worker_samples_total 12.0" in text
    assert "pyrsia_nn_worker_skipped_embedding_updates_total 1.0" in text
    assert "pyrsia_nn_worker_lookup_wait_seconds_total 0.5" in text
    assert 'pyrsia_nn_worker_step_phase_seconds_total{phase="autograd"} 0.0' in text


def test_levels_stay_gauges():
    types, _ = _exposition()
    for name in (
        "pyrsia_nn_worker_steps",
        "pyrsia_nn_worker_samples_per_second",
        "pyrsia_nn_worker_loss",
        "pyrsia_nn_worker_gradients_in_flight",
    ):
        assert types[name] == "gauge", name
