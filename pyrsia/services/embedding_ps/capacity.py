"""The bounds of an embedding store's size: its capacity and its number of internal shards.

A shard's entry indices are int32, so ``ceil(capacity / num_shards)`` must stay under
``2**31 - 1``; at most 64 shards (one lock and one thread each). ``EmbeddingStore`` checks
both here once, before it allocates anything. :func:`internal_shards` chooses the count a
PS replica (or embedded mode's store) gets from ``num_hashmap_internal_shards`` and its
thread count.
"""

from __future__ import annotations

import math

import numpy as np

from pyrsia.shared.constants import MAX_ENTRIES_PER_SHARD, MAX_INTERNAL_SHARDS
from pyrsia.shared.errors import InvalidInputError


def _is_int(value: object) -> bool:
    """An int or numpy integer, not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def internal_shards(configured: int | None, threads: int, capacity: int) -> int:
    """Internal shards of a store worked by ``threads`` threads: ``num_hashmap_internal_shards``
    when the job sets it (raised to one per thread, at most MAX_INTERNAL_SHARDS), else one
    per thread, or as many as ``capacity`` needs (each holds at most MAX_ENTRIES_PER_SHARD).

    Shards exist so that threads can work a batch at once; each non-empty one costs every
    lookup and update a fixed ~5 us of Python and a kernel call. With the key unset (PERSIA's
    default of 100 meant 64 shards) a one-thread store spent 330 us instead of 40 looking up
    600 ids, and 210 instead of 90 updating them (``benchmarks/ps_shards_bench.py``).
    """
    if configured is None:
        return min(MAX_INTERNAL_SHARDS, max(threads, math.ceil(capacity / MAX_ENTRIES_PER_SHARD)))
    return max(threads, min(configured, MAX_INTERNAL_SHARDS))


def check_capacity(capacity: object, num_shards: object) -> None:
    """Raise ``InvalidInputError`` naming the field unless ``capacity`` (vectors) and
    ``num_shards`` (``num_hashmap_internal_shards``) make a store the kernels can index."""
    if not _is_int(capacity) or not 0 < capacity < 2**31 * 64:
        raise InvalidInputError("capacity", "a positive integer", capacity)
    if not _is_int(num_shards) or not 0 < num_shards <= 64:
        raise InvalidInputError("num_hashmap_internal_shards", "an integer in [1, 64]", num_shards)
    per_shard = math.ceil(capacity / num_shards)
    if per_shard > MAX_ENTRIES_PER_SHARD:
        raise InvalidInputError(
            "capacity", f"at most {MAX_ENTRIES_PER_SHARD} vectors per internal shard", capacity
        )
