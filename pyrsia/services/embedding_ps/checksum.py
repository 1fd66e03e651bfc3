"""A checksum of everything a PS replica stores, for tests that prove nothing changed.

``store_checksum(store)`` hashes, per embedding width in increasing order, the stored ids
sorted and their full rows (embedding and optimizer state) in that order, with BLAKE2b.
It does not depend on hash-table layout, internal shards or LRU order, only on which ids
are stored and their values. The PS serves it at ``POST/GET /checksum``; the fuzz suite
compares it before and after a burst of malformed requests. Cost: one pass over the
table (sort + hash), fine for test-sized tables and an occasional operator check.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.bulk import BulkStore


def store_checksum(store: BulkStore) -> dict:
    """``{"entries": n, "checksum": hex}`` of ``store``'s ids and rows."""
    digest = hashlib.blake2b(digest_size=16)
    entries = 0
    for dim, (ids, rows) in sorted(store.export_entries().items()):
        order = np.argsort(ids, kind="stable")
        digest.update(np.int64(dim).tobytes())
        digest.update(np.int64(ids.shape[0]).tobytes())
        digest.update(np.ascontiguousarray(ids[order]).tobytes())
        digest.update(np.ascontiguousarray(rows[order]).tobytes())
        entries += int(ids.shape[0])
    return {"entries": entries, "checksum": digest.hexdigest()}
