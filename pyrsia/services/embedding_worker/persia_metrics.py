"""PERSIA's embedding-worker metrics, with PERSIA's names, labels and meaning.

Served on the worker's ``/metrics`` beside Pyrsia's ``pyrsia_ew_*`` series
(``pyrsia.shared.persia_compat``; the list is in ``docs/guides/observability.md``):

    staleness                          batches whose embeddings are out and gradients not back
    num_pending_batches                batches buffered, waiting for their lookup
    batch_unique_indices_rate{feat}    distinct ids / ids of a slot in the last sampled batch
    nan_count{feat}                    slot gradients with NaN/inf (skipped), cumulative
    lookup_preprocess_time_cost_sec    last batch: hashing, dedup, routing to PS replicas
    lookup_rpc_time_cost_sec           last batch: the PS lookups, network included
    lookup_postprocess_time_cost_sec   last batch: pooling (the embedding sums)
    lookup_total_time_cost_sec         last batch: the three above
    update_gradient_time_cost_sec      last batch's gradients: fan-out and the PS updates

The times are what the last batch took (PERSIA's gauges are set per batch); recording them
costs a few clock reads per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pyrsia.shared.persia_compat import LABELS, cumulative, gauge


class WorkerPersiaMetrics(Collector):
    """The values a worker records as it goes, and PERSIA's families built from them."""

    def __init__(self, labels: Callable[[], list[str]], levels: Callable[[], tuple[int, int]]):
        """``labels``: ``[instance, ip_addr]``; ``levels``: (staleness, pending batches) now."""
        self.labels, self.levels = labels, levels
        self.preprocess_s = self.rpc_s = self.postprocess_s = self.total_s = self.update_s = 0.0
        self.unique_rate: dict[str, float] = {}
        self.nan: dict[str, int] = {}

    def looked_up(self, preprocess_s: float, rpc_s: float, postprocess_s: float) -> None:
        """One batch's lookup times."""
        self.preprocess_s, self.rpc_s, self.postprocess_s = preprocess_s, rpc_s, postprocess_s
        self.total_s = preprocess_s + rpc_s + postprocess_s

    def unique_rates(self, names: list[str], ids: list[float], uniques: list[float]) -> None:
        """A sampled batch's distinct-id share per slot."""
        for name, n, u in zip(names, ids, uniques, strict=True):
            self.unique_rate[name] = u / n if n else 0.0

    def nan_skipped(self, names: list[str]) -> None:
        for name in names:
            self.nan[name] = self.nan.get(name, 0) + 1

    def collect(self) -> Iterator:
        labels = self.labels()
        staleness, pending = self.levels()
        yield gauge(
            "staleness",
            "batches whose embeddings were looked up for training and whose gradients are not applied yet (PERSIA's staleness)",
            labels,
            staleness,
        )
        yield gauge(
            "num_pending_batches",
            "batches sent to this embedding worker and still waiting for their lookup (the forward buffer)",
            labels,
            pending,
        )
        family = GaugeMetricFamily(
            "batch_unique_indices_rate",
            "distinct ids / ids of each slot in the last sampled batch",
            labels=[*LABELS, "feat"],
        )
        for name, rate in sorted(self.unique_rate.items()):
            family.add_metric([*labels, name], rate)
        yield family
        yield cumulative(
            "nan_count",
            "slot gradients with NaN or inf, skipped instead of pushed to the PS (cumulative)",
            [([*labels, n], v) for n, v in sorted(self.nan.items())],
            extra=["feat"],
        )
        yield gauge(
            "lookup_preprocess_time_cost_sec",
            "seconds the last batch's preprocessing took (id hashing, dedup, routing to PS replicas)",
            labels,
            self.preprocess_s,
        )
        yield gauge(
            "lookup_rpc_time_cost_sec",
            "seconds the last batch's PS lookups took, network included",
            labels,
            self.rpc_s,
        )
        yield gauge(
            "lookup_postprocess_time_cost_sec",
            "seconds the last batch's postprocessing took (pooling: the embedding sums)",
            labels,
            self.postprocess_s,
        )
        yield gauge(
            "lookup_total_time_cost_sec",
            "seconds of the last batch's preprocessing, PS lookups and postprocessing",
            labels,
            self.total_s,
        )
        yield gauge(
            "update_gradient_time_cost_sec",
            "seconds the last batch's gradient update took (fan-out and PS updates)",
            labels,
            self.update_s,
        )
