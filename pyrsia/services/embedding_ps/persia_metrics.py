"""PERSIA's embedding-PS metrics, with PERSIA's names, labels and meaning.

Served on the PS's ``/metrics`` beside Pyrsia's ``pyrsia_ps_*`` series
(``pyrsia.shared.persia_compat``; the list is in ``docs/guides/observability.md``):

    index_miss_count               training-lookup ids not found stored (admitted or refused),
                                   cumulative
    index_miss_ratio               the share of them in the last training lookup
    lookup_hashmap_time_cost_sec   seconds the last lookup took in the store
    gradient_id_miss_count         gradient ids whose entry was not found (evicted), cumulative
    set_embedding_time_cost_sec    seconds the last /load took

The store's training-lookup counters are read before and after each training lookup (a few
integer reads); with lookups running at once the ratio mixes theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from pyrsia.shared.persia_compat import cumulative, gauge

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.engine import EmbeddingStore


def misses(counters: dict[str, int]) -> tuple[int, int]:
    """(ids not found stored, ids looked up) of the store's training-lookup counters."""
    missed = counters["admitted"] + counters["refused"]
    return missed, missed + counters["hits"]


class PSPersiaMetrics(Collector):
    """The values the PS routes record, and PERSIA's families built from them."""

    def __init__(self, store: EmbeddingStore, labels: Callable[[], list[str]]):
        self.store, self.labels = store, labels
        self.miss_ratio = self.lookup_s = self.set_embedding_s = 0.0
        self.gradient_id_misses = 0

    def looked_up(self, before: dict[str, int] | None, seconds: float) -> None:
        """One lookup's time; for a training lookup, ``before`` is the store's counters
        before it (the ratio is of the ids it added)."""
        self.lookup_s = seconds
        if before is not None:
            missed_0, seen_0 = misses(before)
            missed_1, seen_1 = misses(self.store.lookup_counters())
            self.miss_ratio = (missed_1 - missed_0) / (seen_1 - seen_0) if seen_1 > seen_0 else 0.0

    def collect(self) -> Iterator:
        labels = self.labels()
        missed, _ = misses(self.store.lookup_counters())
        yield cumulative(
            "index_miss_count",
            "training-lookup ids not found stored on this embedding PS (admitted or refused), cumulative",
            [(labels, missed)],
        )
        yield gauge(
            "index_miss_ratio",
            "share of the last training lookup's ids not found stored",
            labels,
            self.miss_ratio,
        )
        yield gauge(
            "lookup_hashmap_time_cost_sec",
            "seconds the last lookup took in the store (the hash table)",
            labels,
            self.lookup_s,
        )
        yield cumulative(
            "gradient_id_miss_count",
            "gradient ids whose entry was not found (evicted since its lookup), cumulative",
            [(labels, self.gradient_id_misses)],
        )
        yield gauge(
            "set_embedding_time_cost_sec",
            "seconds the last checkpoint load (/load) took",
            labels,
            self.set_embedding_s,
        )
