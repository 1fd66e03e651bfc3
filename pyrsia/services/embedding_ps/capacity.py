"""The bounds of an embedding store's size: its capacity and its number of internal shards.

A shard's entry indices are int32, so ``ceil(capacity / num_shards)`` must stay under
``2**31 - 1``; at most 64 shards (one lock and one thread each). ``EmbeddingStore`` checks
both here once, before it allocates anything.
"""

from __future__ import annotations

import math

import numpy as np

from pyrsia.shared.errors import InvalidInputError


def _is_int(value: object) -> bool:
    """An int or numpy integer, not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_capacity(capacity: object, num_shards: object) -> None:
    """Raise ``InvalidInputError`` naming the field unless ``capacity`` (vectors) and
    ``num_shards`` (``num_hashmap_internal_shards``) make a store the kernels can index."""
    if not _is_int(capacity) or not 0 < capacity < 2**31 * 64:
        raise InvalidInputError("capacity", "a positive integer", capacity)
    if not _is_int(num_shards) or not 0 < num_shards <= 64:
        raise InvalidInputError("num_hashmap_internal_shards", "an integer in [1, 64]", num_shards)
    per_shard = math.ceil(capacity / num_shards)
    if per_shard >= 2**31 - 1:
        raise InvalidInputError(
            "capacity", f"at most {2**31 - 2} vectors per internal shard", capacity
        )
