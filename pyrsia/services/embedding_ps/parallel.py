"""One PS replica's batch spread over its cores: the thread count, the split, the runner.

A batch's ids fall into the store's internal shards (``mix64(id) % num_shards``); each shard
has its own lock and arrays, and the kernels release the GIL, so shards can be worked on at
the same time. This module does that for ``ShardSet.run``::

    ids ──split_positions──▶ positions per shard, each in batch order (one counting sort)
          ──ShardRunner.run──▶ the shards dealt to ``threads`` groups of about equal ids;
                                the calling thread works one group, pool threads the others

The result is the serial one bit for bit: a shard's ids are worked in batch order by one
thread whichever thread it is, and shards share no array (``out`` and ``applied`` are
written at disjoint rows; counters are integers summed afterwards).

The thread count comes from the cores this process may run on (``os.sched_getaffinity``),
at most :data:`MAX_THREADS`, unless a setting names it (:func:`resolve_threads`); on a node
with fewer than :data:`PS_PARALLEL_MIN_CORES` usable cores it is one (:func:`default_threads`). A batch
of fewer than :data:`PARALLEL_MIN_IDS` ids runs on the calling thread alone: handing work
to another thread and waiting for it costs tens of microseconds, more than it saves there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numba as nb
import numpy as np

from pyrsia.services.embedding_ps.table import mix64
from pyrsia.shared.constants import (
    MAX_INTERNAL_SHARDS,
    PS_PARALLEL_MIN_CORES,
    PS_PARALLEL_MIN_IDS,
)
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.kernel_cache import drop_if_inlined_changed

drop_if_inlined_changed(__file__, ("table.py",))

MAX_THREADS = MAX_INTERNAL_SHARDS
"""The most threads one PS replica works a batch with, and the most internal shards."""

PARALLEL_MIN_IDS = PS_PARALLEL_MIN_IDS
"""Batches of fewer ids run on the calling thread alone."""


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The thread count when no setting names one: every usable core (at most MAX_THREADS),
    or one on a node with fewer than PS_PARALLEL_MIN_CORES, where the PS shares its few
    cores with the rest of the pipeline and a second thread only adds CPU per batch."""
    cores = usable_cores()
    return 1 if cores < PS_PARALLEL_MIN_CORES else min(cores, MAX_THREADS)


def resolve_threads(requested: int | None, field: str = "threads") -> int:
    """The thread count to use: ``requested`` (checked: an integer in [1, MAX_THREADS]) or,
    when None, :func:`default_threads`. A bad value is an InvalidInputError
    naming ``field``."""
    if requested is None:
        return default_threads()
    return checked_count(requested, field, MAX_THREADS)


def checked_count(value: object, field: str, maximum: int) -> int:
    """``value`` as an int when it is an integer in [1, maximum]; else an InvalidInputError
    naming ``field``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or not 1 <= value <= maximum
    ):
        raise InvalidInputError(field, f"an integer in [1, {maximum}]", value)
    return int(value)


@nb.njit(nogil=True, cache=True)
def split_positions(ids, num_shards):
    """(order, starts): ``order[starts[k]:starts[k + 1]]`` are the positions of the ids of
    internal shard k (``mix64(id) % num_shards``), in batch order (a stable counting sort)."""
    n = ids.shape[0]
    shard = np.empty(n, dtype=np.int64)
    starts = np.zeros(num_shards + 1, dtype=np.int64)
    m = np.uint64(num_shards)
    for i in range(n):
        k = np.int64(mix64(ids[i]) % m)
        shard[i] = k
        starts[k + 1] += 1
    for k in range(num_shards):
        starts[k + 1] += starts[k]
    fill = starts[:num_shards].copy()
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        k = shard[i]
        order[fill[k]] = i
        fill[k] += 1
    return order, starts


def deal(sizes: list[int], groups: int) -> list[list[int]]:
    """Split indices ``0..len(sizes)-1`` into ``min(groups, len(sizes))`` non-empty runs of
    consecutive indices: run k ends where the running total comes nearest to k/groups of
    the whole, so no run exceeds its share by more than one item."""
    groups = min(groups, len(sizes))
    prefix = np.cumsum(sizes)
    bounds = [0]
    for k in range(1, groups):
        target = prefix[-1] * k / groups
        last = len(sizes) - (groups - k)  # leave at least one index to each later run
        end = min(range(bounds[-1] + 1, last + 1), key=lambda j: abs(prefix[j - 1] - target))
        bounds.append(end)
    bounds.append(len(sizes))
    return [list(range(lo, hi)) for lo, hi in zip(bounds, bounds[1:], strict=False)]


class ShardRunner:
    """Runs a function per shard over ``threads`` threads (the caller's and ``threads - 1``
    pool threads, started on first use), or on the calling thread for small batches."""

    def __init__(self, threads: int, min_ids: int | None = None):
        self.threads = resolve_threads(threads)
        self.min_ids = PARALLEL_MIN_IDS if min_ids is None else min_ids
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def run(self, fn: Callable[[int, np.ndarray], Any], parts: list[np.ndarray]) -> list:
        """``[fn(i, parts[i]) for every non-empty part]`` in shard order; in parallel when
        there are several threads, several parts and at least ``min_ids`` positions. Every
        group finishes before the first error (if any) is raised."""
        work = [(i, p) for i, p in enumerate(parts) if p.shape[0]]
        n_ids = sum(p.shape[0] for _, p in work)
        if self.threads < 2 or len(work) < 2 or n_ids < self.min_ids or self._closed:
            return [fn(i, p) for i, p in work]
        runs = deal([p.shape[0] for _, p in work], self.threads)

        def group(run: list[int]) -> list:
            return [fn(*work[j]) for j in run]

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads - 1, "ps-shard")
        futures: list[Future] = [self._pool.submit(group, run) for run in runs[1:]]
        try:
            first = group(runs[0])
        finally:
            for f in futures:  # every group done (or failed) before anything is raised
                f.exception()
        out = first
        for f in futures:
            out.extend(f.result())
        return out

    def close(self) -> None:
        """Stop the pool threads; later runs work on the calling thread."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
