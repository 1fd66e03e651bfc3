"""The embedding PS's Prometheus metrics, defined once per app and served at ``/metrics``.

``server.create_app`` builds them into the app's registry: per-operation id counts and
request latencies (the route handlers update the children :func:`request_metrics` returns),
the entry count and training-lookup counters read from the store at each scrape
(:class:`LookupCounters`), and an Infer replica's incremental-loader gauges
(:func:`loader_gauges`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.engine import EmbeddingStore
    from pyrsia.services.embedding_ps.incremental import LoaderStats


class LookupCounters(Collector):
    """``pyrsia_ps_lookup_{hits,admitted,refused,evicted}_total``: the store's training-lookup
    counters (EmbeddingStore.lookup_counters), read at each scrape."""

    def __init__(self, store: EmbeddingStore):
        self.store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = self.store.lookup_counters()
        yield CounterMetricFamily(
            "pyrsia_ps_lookup_hits", "training-lookup ids found stored", value=c["hits"]
        )
        yield CounterMetricFamily(
            "pyrsia_ps_lookup_admitted",
            "training-lookup ids given a new entry",
            value=c["admitted"],
        )
        yield CounterMetricFamily(
            "pyrsia_ps_lookup_refused",
            "training-lookup ids refused by admit_probability (they read zeros)",
            value=c["refused"],
        )
        yield CounterMetricFamily(
            "pyrsia_ps_lookup_evicted",
            "entries evicted (least recently used) to make room for admitted ids",
            value=c["evicted"],
        )


def request_metrics(
    registry: CollectorRegistry, store: EmbeddingStore
) -> dict[str, tuple[prom.Counter, prom.Histogram]]:
    """Register the store's metrics in ``registry``; returns op -> its (ids, latency) children
    for the ops ``lookup_train``, ``lookup_eval`` and ``update``."""
    entries = prom.Gauge("pyrsia_ps_entries", "embedding entries held", registry=registry)
    entries.set_function(lambda: len(store))
    ids = prom.Counter("pyrsia_ps_ids", "ids processed", ["op"], registry=registry)
    registry.register(LookupCounters(store))
    latency = prom.Histogram(
        "pyrsia_ps_request_seconds", "time to serve a request", ["op"], registry=registry
    )
    # op -> its (ids, latency) children, made once: labels() costs a lock and a lookup per call
    return {
        op: (ids.labels(op=op), latency.labels(op=op))
        for op in ("lookup_train", "lookup_eval", "update")
    }


def loader_gauges(registry: CollectorRegistry, counts: LoaderStats) -> None:
    """Register gauges of an Infer replica's incremental loader ``counts``, read at each scrape."""
    prom.Gauge(
        "pyrsia_ps_incremental_packets_applied", "incremental packets applied", registry=registry
    ).set_function(lambda: counts.packets_applied)
    prom.Gauge(
        "pyrsia_ps_incremental_packets_torn", "torn incremental packets skipped", registry=registry
    ).set_function(lambda: counts.packets_skipped_torn)
    prom.Gauge(
        "pyrsia_ps_incremental_delay_seconds",
        "age of the last packet applied when it was applied",
        registry=registry,
    ).set_function(lambda: counts.last_delay_s)
