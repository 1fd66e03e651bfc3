"""One internal shard of the PS store: the arrays the kernels work on, their growth, and a lock.

Arrays grow geometrically (factor 1.25, never past the shard's capacity) before each kernel call,
by enough for the worst case of that call, so the compiled kernels never allocate storage. They
grow in place (:func:`_grow`): glibc's ``realloc`` moves a large block's pages with ``mremap``
instead of copying them, so only the new rows are ever touched. Allocating a new array and
copying into it, as the store did before, wrote and faulted in five times the final size over a
table's growth (1 / (1 - 1 / 1.25)): on the Criteo-shaped benchmark, where the PS grows to 1.7M
entries within the epoch, its 48 growths took 1.04 s (100-200 ms each near the end), against
0.14 s in place. Each of those arrays starts on a 64-byte boundary (:data:`ALIGN`). The
hash table is sized for a load of SIZE_LOAD (of the capacity once it is in reach) and rebuilt
when it would pass MAX_LOAD. The eviction pool is allocated once the shard can become full.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from pyrsia.services.embedding_ps import kernels as K
from pyrsia.shared.errors import InvalidTypeError

GROWTH = 1.25
MIN_ROWS = 1024
MIN_SLOTS = 1024
SIZE_LOAD = 0.65
MAX_LOAD = 0.8
POOL_FRACTION = 32  # eviction pool = capacity / POOL_FRACTION oldest entries (at least 1024)


def _grown(current: int, needed: int, cap: int) -> int:
    """New length >= needed: geometric growth, at least MIN_ROWS, at most cap."""
    return min(cap, max(needed, math.ceil(current * GROWTH), MIN_ROWS))


ALIGN = 64
"""Byte boundary every grown array starts on. glibc places a large block 16 bytes past a page,
so a 128-byte arena row (dim 16 with Adagrad's state) spanned 3 cache lines instead of 2,
and its 64-byte embedding 2 instead of 1. Aligned, a training lookup took 54-63 ns per id
instead of 74-78 and an update 126-146 instead of 174-205 (2M entries, dim 16, Adagrad,
15,800 distinct ids per call, one thread)."""


def _aligned(buffer: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The ``shape`` array of ``dtype`` at the first ``ALIGN``-byte boundary of ``buffer``
    (a uint8 array with room for it)."""
    start = -buffer.ctypes.data % ALIGN
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    return buffer[start : start + nbytes].view(dtype).reshape(shape)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialized array starting on an ``ALIGN``-byte boundary, growable by :func:`_grow`."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    return _aligned(np.empty(nbytes + ALIGN, dtype=np.uint8), tuple(shape), np.dtype(dtype))


def _grow(owner: object, name: str, n: int) -> bool:
    """Give ``owner.<name>`` (an :func:`aligned_empty` array) ``n`` rows (its leading axis),
    keeping the rows it has and its alignment; True when it grew in place.

    In place (``ndarray.resize`` of the buffer under it; new rows are zeros) unless something
    else still refers to that buffer (a view, a weak reference, a caller's local name), which
    numpy detects and refuses: then into a new array, the old one left intact for whoever
    holds it. Callers hold the shard's lock, and nothing keeps a view past it, so the copy
    is the exception.
    """
    old = getattr(owner, name)
    shape, dtype = (n,) + old.shape[1:], old.dtype
    buffer = old.base
    if buffer is None or buffer.dtype != np.uint8 or buffer.ndim != 1:
        raise InvalidTypeError(name, "an array made by aligned_empty()", old)
    row_bytes = math.prod(old.shape[1:]) * dtype.itemsize
    kept = min(n, old.shape[0]) * row_bytes
    start = old.ctypes.data - buffer.ctypes.data
    old_size = buffer.shape[0]
    setattr(owner, name, None)
    del old  # now only this frame's ``buffer`` refers to the buffer, unless someone else does
    try:
        buffer.resize(n * row_bytes + ALIGN)
    except ValueError:
        out = aligned_empty(shape, dtype)
        out.reshape(-1).view(np.uint8)[:kept] = buffer[start : start + kept]
        setattr(owner, name, out)
        return False
    moved = -buffer.ctypes.data % ALIGN
    if moved != start:  # realloc moved it to another offset from a boundary: shift the rows
        buffer[moved : moved + kept] = buffer[start : start + kept]  # numpy copes with overlap
    buffer[moved + kept : old_size] = 0  # resize zeroed the bytes past the old end, not before
    setattr(owner, name, _aligned(buffer, shape, dtype))
    return True


def _free_slots(nslots: int) -> np.ndarray:
    return np.full(3 * nslots, K.FREE_SLOT, dtype=np.uint32)


class Arena:
    """Rows of one vector width: ``data[r] = [embedding (dim) | optimizer state]``, plus free rows."""

    def __init__(self, dim: int, width: int):
        self.dim = dim
        self.width = width
        self.data = aligned_empty((0, width), np.float32)
        self.free = aligned_empty((0,), np.int32)  # grown only when rows are freed
        self.ameta = np.zeros(2, dtype=np.int64)  # rows used (high-water mark), free count

    @property
    def live(self) -> int:
        return int(self.ameta[K.A_USED] - self.ameta[K.A_FREE])

    def reserve(self, n_new: int, cap: int) -> None:
        used, nfree = int(self.ameta[K.A_USED]), int(self.ameta[K.A_FREE])
        needed = min(cap, used + max(0, n_new - nfree))
        if needed > self.data.shape[0]:
            _grow(self, "data", _grown(self.data.shape[0], needed, cap))

    def push_free(self, rows: np.ndarray) -> None:
        f = int(self.ameta[K.A_FREE])
        if f + rows.shape[0] > self.free.shape[0]:
            _grow(self, "free", max(f + rows.shape[0], 2 * self.free.shape[0]))
        self.free[f : f + rows.shape[0]] = rows
        self.ameta[K.A_FREE] = f + rows.shape[0]

    def nbytes(self) -> int:
        return self.data.nbytes + self.free.nbytes + self.ameta.nbytes


class Shard:
    """Hash table + stamp LRU + arenas of one internal shard; callers hold ``lock`` around use."""

    def __init__(self, capacity: int):
        self.lock = threading.Lock()
        self.capacity = capacity
        self.reset()

    def reset(self) -> None:
        self.meta = np.zeros(K.META_LEN, dtype=np.int64)
        self.meta[K.M_CAP] = self.capacity
        self.meta[K.M_SLOTS] = MIN_SLOTS
        self.slots = _free_slots(MIN_SLOTS)
        self.ent = aligned_empty((0, 2), np.int64)
        self.pool = np.empty(0, dtype=np.int32)
        self.pstamp = np.empty(0, dtype=np.int64)
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
        n = self.n
        needed = min(self.capacity, n + n_new)
        if needed > self.ent.shape[0]:
            _grow(self, "ent", _grown(self.ent.shape[0], needed, self.capacity))
        nslots = int(self.meta[K.M_SLOTS])
        if needed > MAX_LOAD * nslots:
            target = min(self.capacity, max(needed, 2 * n))
            nslots = max(MIN_SLOTS, math.ceil(target / SIZE_LOAD) + 1)
            old, self.slots = self.slots, _free_slots(nslots)
            self.meta[K.M_SLOTS] = nslots
            K.rehash(old, self.slots, self.ent, np.int64(n), np.int64(nslots))
        if n + n_new > self.capacity and self.pool.shape[0] == 0:
            m = min(self.capacity, max(MIN_ROWS, self.capacity // POOL_FRACTION))
            self.pool = np.empty(m, dtype=np.int32)
            self.pstamp = np.empty(m, dtype=np.int64)
        if arena is not None:
            arena.reserve(n_new, self.capacity)

    def free_orphans(self, orphans: np.ndarray, count: int) -> None:
        """Return rows of entries evicted or re-dimensioned out of other arenas to their free lists."""
        if count == 0:
            return
        o = orphans[:count]
        for aid in np.unique(o[:, 0]):
            self.arenas[int(aid)].push_free(o[o[:, 0] == aid, 1].astype(np.int32))

    def nbytes(self) -> int:
        arrays = (self.meta, self.slots, self.ent, self.pool, self.pstamp)
        return sum(a.nbytes for a in arrays) + sum(a.nbytes() for a in self.arenas if a is not None)

    def live_ids(self, arena_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of the entries stored in arena ``arena_id``, rows copied out."""
        ent = self.ent[: self.n]
        mask = (ent[:, 0] & K.AID_MASK) == arena_id
        a = self.arenas[arena_id] if arena_id < len(self.arenas) else None
        if a is None or not mask.any():
            return np.empty(0, dtype=np.uint64), None
        word = ent[mask, 1]
        sl = self.slots.reshape(-1, 3)[word & K.LOW]
        keys = sl[:, 0].astype(np.uint64) | (sl[:, 1].astype(np.uint64) << np.uint64(32))
        return keys, a.data[word >> 32]
