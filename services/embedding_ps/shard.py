"""One internal shard of the PS store: the arrays the kernels work on, their growth, and a lock.

Arrays grow geometrically (factor 1.25, never past the shard's capacity) before each kernel call,
by enough for the worst case of that call, so the compiled kernels never allocate. The hash table
is a power of two kept at most 3/4 full and rebuilt when it doubles.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from services.embedding_ps import kernels as K

GROWTH = 1.25
MIN_ROWS = 1024
MAX_LOAD = 0.75
MIN_BITS = 10


def _grown(current: int, needed: int, cap: int) -> int:
    """New length >= needed: geometric growth, at least MIN_ROWS, at most cap."""
    return min(cap, max(needed, math.ceil(current * GROWTH), MIN_ROWS))


def _resize(a: np.ndarray, n: int, fill=None) -> np.ndarray:
    out = (
        np.empty((n,) + a.shape[1:], dtype=a.dtype)
        if fill is None
        else np.full((n,) + a.shape[1:], fill, dtype=a.dtype)
    )
    m = min(n, a.shape[0])
    out[:m] = a[:m]
    return out


class Arena:
    """Rows of one vector width: ``data[r] = [embedding (dim) | optimizer state]``, plus free rows."""

    def __init__(self, dim: int, width: int):
        self.dim = dim
        self.width = width
        self.data = np.empty((0, width), dtype=np.float32)
        self.free = np.empty(0, dtype=np.int32)
        self.ameta = np.zeros(2, dtype=np.int64)  # rows used (high-water mark), free count

    @property
    def live(self) -> int:
        return int(self.ameta[K.A_USED] - self.ameta[K.A_FREE])

    def reserve(self, n_new: int, cap: int) -> None:
        used, nfree = int(self.ameta[K.A_USED]), int(self.ameta[K.A_FREE])
        needed = min(cap, used + max(0, n_new - nfree))
        if needed > self.data.shape[0]:
            n = _grown(self.data.shape[0], needed, cap)
            self.data = _resize(self.data, n)
            self.free = _resize(self.free, n)

    def nbytes(self) -> int:
        return self.data.nbytes + self.free.nbytes + self.ameta.nbytes


class Shard:
    """Hash table + LRU list + arenas of one internal shard; callers hold ``lock`` around use."""

    def __init__(self, capacity: int):
        self.lock = threading.Lock()
        self.capacity = capacity
        self.reset()

    def reset(self) -> None:
        self.meta = np.zeros(K.META_LEN, dtype=np.int64)
        self.meta[K.M_HEAD] = self.meta[K.M_TAIL] = K.EMPTY
        self.meta[K.M_CAP] = self.capacity
        self.meta[K.M_BITS] = MIN_BITS
        self.table = np.full(1 << MIN_BITS, K.EMPTY, dtype=np.int32)
        self.keys = np.empty(0, dtype=np.uint64)
        self.prev = np.empty(0, dtype=np.int32)
        self.nxt = np.empty(0, dtype=np.int32)
        self.row_of = np.empty(0, dtype=np.int32)
        self.arena_of = np.empty(0, dtype=np.int8)
        self.arenas: list[Arena | None] = []

    @property
    def n(self) -> int:
        return int(self.meta[K.M_N])

    def arena(self, arena_id: int, dim: int, width: int) -> Arena:
        """This shard's arena ``arena_id`` (created on first use)."""
        while len(self.arenas) <= arena_id:
            self.arenas.append(None)
        a = self.arenas[arena_id]
        if a is None or a.width != width:
            a = self.arenas[arena_id] = Arena(dim, width)
        return a

    def reserve(self, n_new: int, arena: Arena | None = None) -> None:
        """Make room for up to ``n_new`` new entries (and rows in ``arena``) without reallocation."""
        needed = min(self.capacity, self.n + n_new)
        if needed > self.keys.shape[0]:
            n = _grown(self.keys.shape[0], needed, self.capacity)
            self.keys = _resize(self.keys, n)
            self.prev = _resize(self.prev, n)
            self.nxt = _resize(self.nxt, n)
            self.row_of = _resize(self.row_of, n)
            self.arena_of = _resize(self.arena_of, n)
        bits = int(self.meta[K.M_BITS])
        if needed > MAX_LOAD * (1 << bits):
            while needed > MAX_LOAD * (1 << bits):
                bits += 1
            self.table = np.full(1 << bits, K.EMPTY, dtype=np.int32)
            self.meta[K.M_BITS] = bits
            K.rehash(self.table, self.keys, np.int64(self.n), np.int64(bits))
        if arena is not None:
            arena.reserve(n_new, self.capacity)

    def free_orphans(self, orphans: np.ndarray, count: int) -> None:
        """Return rows of entries evicted or re-dimensioned out of other arenas to their free lists."""
        if count == 0:
            return
        o = orphans[:count]
        for aid in np.unique(o[:, 0]):
            rows = o[o[:, 0] == aid, 1].astype(np.int32)
            a = self.arenas[int(aid)]
            f = int(a.ameta[K.A_FREE])
            a.free[f : f + rows.shape[0]] = rows
            a.ameta[K.A_FREE] = f + rows.shape[0]

    def nbytes(self) -> int:
        arrays = (self.meta, self.table, self.keys, self.prev, self.nxt, self.row_of, self.arena_of)
        return sum(a.nbytes for a in arrays) + sum(a.nbytes() for a in self.arenas if a is not None)

    def live_ids(self, arena_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of the entries stored in arena ``arena_id``, rows copied out."""
        n = self.n
        mask = self.arena_of[:n] == arena_id
        a = self.arenas[arena_id] if arena_id < len(self.arenas) else None
        if a is None or not mask.any():
            return np.empty(0, dtype=np.uint64), None
        return self.keys[:n][mask].copy(), a.data[self.row_of[:n][mask]]
