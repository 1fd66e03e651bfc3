"""Compiled kernels of one PS shard: lookup (train / eval), update, insert, gather.

Data layout of one shard (all numpy arrays, owned by :class:`pyrsia.services.embedding_ps.shard.Shard`)::

    slots   uint32[3*T]   open addressing, linear probing, any size T < 2**32. Slot s holds
                          [key low 32 bits, key high 32 bits, entry] (entry 0xFFFFFFFF = free),
                          so a probe compares keys inside the slot's own cache line. The home
                          slot is mix(key) scaled onto [0, T): every uint64 is a valid key.
                          Deletion is backward-shift: no tombstones ever build up.
    ent     int64[E, 2]   entry -> [stamp << 8 | arena id, row << 32 | slot]; entries 0..n-1 live
    pool    int32[M]      eviction candidates (the M oldest entries at the last refill), oldest
    pstamp  int64[M]      first, with the stamp each had then (allocated once eviction can occur)
    arena   float32[R, W] one per width: row = [embedding (dim) | optimizer state]
    free    int32[F]      rows of that arena freed by eviction / re-dimensioning (grown lazily)

    meta int64[9]: see the M_* constants.   ameta int64[2]: rows used (high-water), free count.

LRU: a touch stores a fresh stamp from the shard's clock (consecutive stamps in batch order);
eviction takes the oldest unchanged pool candidate, which is exactly the least recently used entry.

Hot kernels work in passes over the batch so that each id's chain of dependent loads (slot ->
entry -> row) becomes independent loads the CPU overlaps: pass 1 hashes and probes every id
(prefetching slots PREFETCH ids ahead), pass 2 reads every found entry (prefetched ahead), pass 3
gathers / updates the rows (prefetched ahead) in batch order.

Every kernel is ``nogil`` so shards can be worked on from several threads, and ``cache=True`` so a
service start does not pay for compilation again. All kernels take the same argument types on
every call, so each compiles exactly once.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from pyrsia.services.embedding_ps.optimizers import apply, finite, init_state
from pyrsia.services.embedding_ps.table import (  # noqa: F401  (re-exported for the engine)
    A_FREE,
    A_USED,
    AID_MASK,
    EMPTY,
    FREE_SLOT,
    HIGH,
    LOW,
    M_CAP,
    M_CLOCK,
    M_EVICT,
    M_N,
    M_PLEN,
    M_PPOS,
    M_REFUSED,
    M_REINIT,
    M_SLOTS,
    META_LEN,
    PREFETCH,
    _uniform,
    delete_slot,
    home,
    mix64,
    mix64_py,
    prefetch,
    probe,
    refill_pool,
    rehash,
    set_slot,
    shard_of,
    touch,
    victim,
)
from pyrsia.shared.kernel_cache import drop_if_inlined_changed

# numba's cache checks this file only: an edit to the modules inlined here recompiles too
drop_if_inlined_changed(__file__, ("optimizers.py", "table.py"))

_jit = nb.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)


@nb.njit(inline="always", cache=True)
def init_embedding(row, key, dim, lower, upper):
    """Uniform(lower, upper) values from a counter-based hash of (id, element index).

    The value depends only on the id, so it is the same on whichever replica or shard holds it.
    """
    base = mix64(key ^ np.uint64(0x6A09E667F3BCC909))
    width = upper - lower
    for j in range(dim):
        u = _uniform(mix64(base + np.uint64(j + 1) * np.uint64(0x9E3779B97F4A7C15)))
        row[j] = np.float32(lower + width * u)


@nb.njit(inline="always", cache=True)
def _alloc_row(free, ameta):
    if ameta[A_FREE] > 0:
        ameta[A_FREE] -= 1
        return np.int64(free[ameta[A_FREE]])
    r = ameta[A_USED]
    ameta[A_USED] += 1
    return np.int64(r)


@nb.njit(inline="always", cache=True)
def _resolve(ids, pos, slots, nslots):
    """Pass 1: home slot of every id (prefetched PREFETCH ids ahead), then its entry (or -1).
    Returns (homes, entries, misses). Independent loads, so many cache misses overlap."""
    n = pos.shape[0]
    d = PREFETCH
    homes = np.empty(n, dtype=np.int64)
    es = np.empty(n, dtype=np.int64)
    for k in range(min(d, n)):
        homes[k] = home(ids[pos[k]], nslots)
        prefetch(slots, 3 * homes[k])
    misses = 0
    for k in range(n):
        if k + d < n:
            h = home(ids[pos[k + d]], nslots)
            homes[k + d] = h
            prefetch(slots, 3 * h)
        s = probe(slots, ids[pos[k]], homes[k], nslots)
        if s >= 0:
            es[k] = np.int64(slots[3 * s + 2])
        else:
            es[k] = -1
            misses += 1
    return homes, es, misses


@nb.njit(inline="always", cache=True)
def _rows_of(es, ent, arena_id, stamp0):
    """Pass 2: arena row of every resolved entry stored in ``arena_id`` (else -1). With
    ``stamp0 >= 0`` each such entry is also touched with stamp ``stamp0 + k`` (batch order)."""
    n = es.shape[0]
    d = PREFETCH
    rows = np.empty(n, dtype=np.int64)
    for k in range(n):
        if k + d < n and es[k + d] >= 0:
            prefetch(ent[es[k + d]], 0)
        e = es[k]
        rows[k] = -1
        if e >= 0 and (ent[e, 0] & AID_MASK) == arena_id:
            rows[k] = ent[e, 1] >> 32
            if stamp0 >= 0:
                ent[e, 0] = ((stamp0 + k) << 8) | arena_id
    return rows


@nb.njit(inline="always", cache=True)
def _warm_row(arena, rows, k):
    """Prefetch every cache line of the row of id k + PREFETCH (pass 3); rows need not be
    line-aligned, so the last element is prefetched too."""
    if k + PREFETCH < rows.shape[0]:
        r = rows[k + PREFETCH]
        if r >= 0:
            w = arena.shape[1]
            for j in range(0, w, 16):
                prefetch(arena[r], j)
            prefetch(arena[r], w - 1)


@nb.njit(inline="always", cache=True)
def _place(slots, ent, meta, pool, pstamp, free, ameta, arena_id, key, s, h, orphans, n_orphans):
    """Create an entry for ``key`` (absent; ``s`` = probe result from home ``h``), evicting the
    least recently used entry when full. Returns (entry, row, n_orphans); rows of evicted entries
    living in another arena are appended to ``orphans`` (arena, row) for the caller to free."""
    nslots = meta[M_SLOTS]
    if meta[M_N] < meta[M_CAP]:
        e = meta[M_N]
        meta[M_N] += 1
        r = _alloc_row(free, ameta)
    else:
        e = victim(ent, pool, pstamp, meta)
        delete_slot(slots, ent, ent[e, 1] & LOW, nslots)
        meta[M_EVICT] += 1
        if (ent[e, 0] & AID_MASK) == arena_id:
            r = ent[e, 1] >> 32
        else:
            orphans[n_orphans, 0] = ent[e, 0] & AID_MASK
            orphans[n_orphans, 1] = ent[e, 1] >> 32
            n_orphans += 1
            r = _alloc_row(free, ameta)
        s = probe(slots, key, h, nslots)  # the deletion may have moved the insertion slot
    ent[e, 1] = r << 32
    set_slot(slots, ent, -s - 1, key, e)
    touch(ent, meta, e, arena_id)
    return e, r, n_orphans


@nb.njit(inline="always", cache=True)
def _redim(ent, e, free, ameta, arena_id, orphans, n_orphans):
    """Move entry ``e`` (stored in another arena) to a fresh row of this one."""
    orphans[n_orphans, 0] = ent[e, 0] & AID_MASK
    orphans[n_orphans, 1] = ent[e, 1] >> 32
    r = _alloc_row(free, ameta)
    ent[e, 1] = (ent[e, 1] & LOW) | (r << 32)
    return r, n_orphans + 1


@nb.njit(nogil=True, cache=True, boundscheck=False)  # not inlined: two call sites, misses only
def _train_one(ids, i, h, out, table, hyper, opt, salt, orphans, n_orphans):
    """Sequential training lookup of ``ids[i]`` with home slot ``h`` (probe, touch or
    admit/insert, copy out). ``table`` is the shard's arrays, as ``lookup_train`` takes them."""
    arena, free, ameta, arena_id, slots, ent, pool, pstamp, meta = table
    key = ids[i]
    dim = out.shape[1]
    nslots = meta[M_SLOTS]
    lower, upper, p = hyper[0], hyper[1], hyper[2]
    s = probe(slots, key, h, nslots)
    if s >= 0:
        e = np.int64(slots[3 * s + 2])
        r = ent[e, 1] >> 32
        if (ent[e, 0] & AID_MASK) != arena_id:
            r, n_orphans = _redim(ent, e, free, ameta, arena_id, orphans, n_orphans)
            meta[M_REINIT] += 1
            init_embedding(arena[r], key, dim, lower, upper)
            init_state(arena[r], dim, opt)
        touch(ent, meta, e, arena_id)
    else:
        if p < 1.0 and not _uniform(mix64(key ^ salt)) < p:
            meta[M_REFUSED] += 1
            meta[M_CLOCK] += 1  # keep stamps = clock0 + batch position
            out[i, :] = 0.0
            return n_orphans
        e, r, n_orphans = _place(
            slots, ent, meta, pool, pstamp, free, ameta, arena_id, key, s, h, orphans, n_orphans
        )
        init_embedding(arena[r], key, dim, lower, upper)
        init_state(arena[r], dim, opt)
    for j in range(dim):
        out[i, j] = arena[r, j]
    return n_orphans


@_jit
def lookup_train(
    ids,
    pos,
    out,
    arena,
    free,
    ameta,
    arena_id,
    slots,
    ent,
    pool,
    pstamp,
    meta,
    hyper,
    opt,
    salt,
    orphans,
):
    """Training lookup of ``ids[pos]`` into ``out[pos]`` (batch order): hits are refreshed,
    unknown ids are admitted with probability ``hyper[2]`` and initialized, refused ids get zeros.
    An id stored at another dim is re-initialized in this arena. Returns the number of orphans.

    Position k of the call gets stamp clock0 + k. When the call cannot evict (every miss fits),
    hits are resolved and touched in independent passes (probe, entry, row gather) and only the
    misses run sequentially; otherwise every id runs sequentially so evictions see exact recency.
    """
    n = pos.shape[0]
    nslots = meta[M_SLOTS]
    table = (arena, free, ameta, arena_id, slots, ent, pool, pstamp, meta)
    homes, es, misses = _resolve(ids, pos, slots, nslots)
    clock0 = meta[M_CLOCK]
    n_orphans = 0
    if meta[M_N] + misses > meta[M_CAP]:
        for k in range(n):
            i = pos[k]
            n_orphans = _train_one(
                ids, i, homes[k], out, table, hyper, opt, salt, orphans, n_orphans
            )
        return n_orphans
    rows = _rows_of(es, ent, arena_id, clock0)
    dim = out.shape[1]
    for k in range(n):
        _warm_row(arena, rows, k)
        i = pos[k]
        r = rows[k]
        if r >= 0:
            for j in range(dim):
                out[i, j] = arena[r, j]
        else:  # unknown (maybe inserted earlier in this call) or stored at another dim
            meta[M_CLOCK] = clock0 + k
            n_orphans = _train_one(
                ids, i, homes[k], out, table, hyper, opt, salt, orphans, n_orphans
            )
    meta[M_CLOCK] = clock0 + n
    return n_orphans


@_jit
def lookup_eval(ids, pos, out, arena, arena_id, slots, ent, meta):
    """Evaluation lookup: no insert, no LRU refresh; unknown ids (or stored at another dim) -> zeros."""
    dim = out.shape[1]
    homes, es, misses = _resolve(ids, pos, slots, meta[M_SLOTS])
    rows = _rows_of(es, ent, arena_id, np.int64(-1))
    for k in range(pos.shape[0]):
        _warm_row(arena, rows, k)
        i = pos[k]
        r = rows[k]
        if r >= 0:
            for j in range(dim):
                out[i, j] = arena[r, j]
        else:
            out[i, :] = 0.0


@_jit
def update_rows(ids, pos, grads, arena, arena_id, slots, ent, meta, opt, bound, applied):
    """Apply ``grads[pos]`` to the entries of ``ids[pos]`` in order (a duplicated id gets one
    step per occurrence). Unknown ids (or stored at another dim) and non-finite rows are skipped;
    ``applied[pos[k]]`` is set when the step was applied. Returns (skipped_unknown, skipped_nonfinite).
    """
    dim = grads.shape[1]
    homes, es, misses = _resolve(ids, pos, slots, meta[M_SLOTS])
    rows = _rows_of(es, ent, arena_id, np.int64(-1))
    unknown = 0
    nonfinite = 0
    tmp = np.empty(dim, dtype=np.float64)
    for k in range(pos.shape[0]):
        _warm_row(arena, rows, k)
        i = pos[k]
        g = grads[i]
        if not finite(g):
            nonfinite += 1
            continue
        r = rows[k]
        if r < 0:
            unknown += 1
            continue
        apply(arena[r], g, dim, opt, bound, tmp)
        applied[i] = True
    return unknown, nonfinite


@_jit
def insert_rows(ids, rows, arena, free, ameta, arena_id, slots, ent, pool, pstamp, meta, orphans):
    """Store full rows (embedding + state, e.g. from a checkpoint) under ``ids``, as inserts that
    refresh recency. Existing entries are overwritten. Returns the number of orphans."""
    nslots = meta[M_SLOTS]
    n_orphans = 0
    for i in range(ids.shape[0]):
        key = ids[i]
        h = home(key, nslots)
        s = probe(slots, key, h, nslots)
        if s >= 0:
            e = np.int64(slots[3 * s + 2])
            r = ent[e, 1] >> 32
            if (ent[e, 0] & AID_MASK) != arena_id:
                r, n_orphans = _redim(ent, e, free, ameta, arena_id, orphans, n_orphans)
            touch(ent, meta, e, arena_id)
        else:
            e, r, n_orphans = _place(
                slots, ent, meta, pool, pstamp, free, ameta, arena_id, key, s, h, orphans, n_orphans
            )
        for j in range(rows.shape[1]):
            arena[r, j] = rows[i, j]
    return n_orphans


@_jit
def gather_rows(ids, out, arena, arena_id, slots, ent, meta, found):
    """Full rows of ``ids`` stored in this arena (for incremental packets); ``found[i]`` says which."""
    nslots = meta[M_SLOTS]
    for i in range(ids.shape[0]):
        key = ids[i]
        s = probe(slots, key, home(key, nslots), nslots)
        found[i] = False
        if s >= 0:
            e = np.int64(slots[3 * s + 2])
            if (ent[e, 0] & AID_MASK) == arena_id:
                out[i, :] = arena[ent[e, 1] >> 32, :]
                found[i] = True
