"""PERSIA's metric names, served beside Pyrsia's own so PERSIA's Grafana board and alerts work.

PERSIA's services pushed Prometheus series without a prefix (``staleness``,
``index_miss_count``, ``lookup_rpc_time_cost_sec`` ...), each with the labels ``instance``
(``rep_<replica index>``) and ``ip_addr`` (the process's address). The embedding PS and the
embedding worker serve that set with PERSIA's meaning (``docs/guides/observability.md``,
"PERSIA's metric names"); this module builds the families and their two labels.

PERSIA's counters were exposed by its Rust client without a ``_total`` suffix, and its board
queries those names; Prometheus's Python client writes a counter only with the suffix, so
they are served untyped under PERSIA's exact name (their values only grow: ``rate()`` works).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from pyrsia.shared.service_state import ServiceState

LABELS = ("instance", "ip_addr")


def persia_labels(state: ServiceState) -> list[str]:
    """``[instance, ip_addr]`` of this service: ``rep_<replica_index>`` and the host it
    registered (or ``""`` before it has)."""
    details = state.details
    address = str(details.get("address", ""))
    return [f"rep_{details.get('replica_index', 0)}", address.rsplit(":", 1)[0]]


def gauge(
    name: str, doc: str, labels: Sequence[str], value: float, extra: Sequence[str] = ()
) -> GaugeMetricFamily:
    """A one-sample gauge ``name{instance, ip_addr}``; ``extra`` names more labels (whose
    values then follow in ``labels``)."""
    family = GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])
    family.add_metric(list(labels), value)
    return family


def cumulative(
    name: str, doc: str, samples: Sequence[tuple[Sequence[str], float]], extra: Sequence[str] = ()
) -> Metric:
    """PERSIA's counter ``name`` (exact name, untyped: see the module docstring)."""
    family = Metric(name, doc, "unknown")
    for label_values, value in samples:
        family.add_sample(name, dict(zip([*LABELS, *extra], label_values, strict=True)), value)
    return family
