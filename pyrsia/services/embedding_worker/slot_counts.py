"""Ids looked up per slot, counted in numpy arrays and read as Prometheus counters at a scrape.

A labelled ``prometheus_client.Counter`` costs a lock and a Python call per ``inc``: one to
three per slot and batch (99 on a sampled Census-Income batch) on the lookup path, for
metrics that are read once per scrape (and never in embedded mode). Here a batch adds its
counts with one numpy call, and :meth:`SlotIdCounts.collect` turns the arrays into the
counters ``pyrsia_ew_slot_ids_total``, ``pyrsia_ew_sampled_slot_ids_total`` and
``pyrsia_ew_sampled_slot_unique_ids_total`` (label ``slot``) when the registry is read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_FAMILIES = (
    ("pyrsia_ew_slot_ids", "ids looked up per slot"),
    (
        "pyrsia_ew_sampled_slot_ids",
        "ids per slot in sampled batches (with the next metric: the unique-id rate per slot)",
    ),
    ("pyrsia_ew_sampled_slot_unique_ids", "distinct ids per slot in sampled batches"),
)
IDS, SAMPLED_IDS, SAMPLED_UNIQUE_IDS = range(3)


class SlotIdCounts(Collector):
    """Per-slot id counters (see the module docstring); slots are numbered as first seen
    (the names come from batches whose slots the schema has checked, so they are bounded)."""

    def __init__(self) -> None:
        self._position: dict[str, int] = {}
        self._names: list[str] = []
        self._values = np.zeros((len(_FAMILIES), 0), np.float64)
        self._lock = threading.Lock()  # a scrape may run on another thread than the lookups

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """The rows of ``names`` (distinct slot names), new names given one."""
        position = self._position
        if any(name not in position for name in names):
            with self._lock:
                for name in names:
                    if name not in position:
                        position[name] = len(self._names)
                        self._names.append(name)
                grown = np.zeros((len(_FAMILIES), len(self._names)), np.float64)
                grown[:, : self._values.shape[1]] = self._values
                self._values = grown
        return np.fromiter((position[name] for name in names), np.intp, len(names))

    def add(
        self,
        names: Sequence[str],
        ids: np.ndarray,
        sampled_unique: np.ndarray | None = None,
    ) -> None:
        """Count a batch: ``ids[i]`` ids of slot ``names[i]``; on a sampled batch also
        ``sampled_unique[i]`` distinct ones (and ``ids`` again as the sampled ids)."""
        rows = self.positions(names)
        with self._lock:
            values = self._values
            values[IDS, rows] += ids
            if sampled_unique is not None:
                values[SAMPLED_IDS, rows] += ids
                values[SAMPLED_UNIQUE_IDS, rows] += sampled_unique

    def describe(self) -> Iterator[CounterMetricFamily]:
        for name, documentation in _FAMILIES:
            yield CounterMetricFamily(name, documentation, labels=["slot"])

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            names, values = list(self._names), self._values.copy()
        for family, (name, documentation) in enumerate(_FAMILIES):
            metric = CounterMetricFamily(name, documentation, labels=["slot"])
            for slot, value in zip(names, values[family], strict=True):
                metric.add_metric([slot], float(value))
            yield metric
