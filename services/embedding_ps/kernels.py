"""Compiled kernels of one PS shard: hash table, LRU list, initialization, lookup and insert.

Data layout of one shard (all numpy arrays, owned by :class:`services.embedding_ps.shard.Shard`)::

    table   int32[T]      open addressing, linear probing, T a power of two; entry index or -1.
                          The home slot of a key is the top ``bits`` bits of mix(key), so every
                          uint64 (0 and 2**64-1 included) is a valid key. Deletion is
                          backward-shift: no tombstones ever build up.
    keys    uint64[E]     entry -> id          (entries 0..n-1 are all live)
    prev/nxt int32[E]     intrusive doubly-linked LRU list; head = most recent, tail = victim
    row_of  int32[E]      row of the entry inside its arena
    arena_of int8[E]      which arena (one per vector width) holds the entry
    arena   float32[R, W] one per width: row = [embedding (dim) | optimizer state]
    free    int32[R]      rows of that arena freed by eviction / re-dimensioning

    meta int64[8]: see the M_* constants.   ameta int64[2]: rows used (high-water), free count.

Every kernel is ``nogil`` so shards can be worked on from several threads, and ``cache=True`` so a
service start does not pay for compilation again. All kernels take the same argument types on
every call, so each compiles exactly once.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from services.embedding_ps.optimizers import apply, finite, init_state
from services.embedding_ps.table import (  # noqa: F401  (re-exported for the engine)
    A_FREE,
    A_USED,
    EMPTY,
    M_BITS,
    M_CAP,
    M_EVICT,
    M_HEAD,
    M_N,
    M_REFUSED,
    M_REINIT,
    M_TAIL,
    META_LEN,
    _delete_slot,
    _home,
    _push_head,
    _uniform,
    _unlink,
    mix64,
    mix64_py,
    probe,
    shard_of,
    touch,
    warm,
)

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
        return free[ameta[A_FREE]]
    r = ameta[A_USED]
    ameta[A_USED] += 1
    return np.int32(r)


@nb.njit(inline="always", cache=True)
def _place(
    table,
    keys,
    prev,
    nxt,
    row_of,
    arena_of,
    meta,
    free,
    ameta,
    arena_id,
    key,
    slot,
    orphans,
    n_orphans,
):
    """Create an entry for ``key`` (not present; ``slot`` = probe result), evicting the LRU tail
    when full. Returns (entry, row, n_orphans); rows of evicted entries living in another arena are
    appended to ``orphans`` (arena, row) for the caller to free."""
    bits = meta[M_BITS]
    if meta[M_N] < meta[M_CAP]:
        e = np.int32(meta[M_N])
        meta[M_N] += 1
        r = _alloc_row(free, ameta)
    else:
        e = np.int32(meta[M_TAIL])
        _unlink(prev, nxt, meta, e)
        _delete_slot(table, keys, probe(table, keys, keys[e], bits), bits)
        meta[M_EVICT] += 1
        if arena_of[e] == arena_id:
            r = row_of[e]
        else:
            orphans[n_orphans, 0] = arena_of[e]
            orphans[n_orphans, 1] = row_of[e]
            n_orphans += 1
            r = _alloc_row(free, ameta)
        # the hole may have moved our insertion slot: probe again
        slot = probe(table, keys, key, bits)
    table[-slot - 1] = e
    keys[e] = key
    row_of[e] = r
    arena_of[e] = arena_id
    _push_head(prev, nxt, meta, e)
    return e, r, n_orphans


@_jit
def lookup_train(
    ids,
    pos,
    out,
    arena,
    free,
    ameta,
    arena_id,
    table,
    keys,
    prev,
    nxt,
    row_of,
    arena_of,
    meta,
    hyper,
    opt,
    salt,
    orphans,
):
    """Training lookup of ``ids[pos]`` into ``out[pos]`` (batch order): hits are refreshed,
    unknown ids are admitted with probability ``hyper[2]`` and initialized, refused ids get zeros.
    An id stored at another dim is re-initialized in this arena. Returns the number of orphans."""
    dim = out.shape[1]
    bits = meta[M_BITS]
    lower, upper, p = hyper[0], hyper[1], hyper[2]
    n_orphans = 0
    for k in range(pos.shape[0]):
        warm(ids, pos, k, table, keys, row_of, arena_of, prev, nxt, arena, bits, True)
        i = pos[k]
        key = ids[i]
        s = probe(table, keys, key, bits)
        if s >= 0:
            e = table[s]
            touch(prev, nxt, meta, e)
            if arena_of[e] == arena_id:
                r = row_of[e]
            else:
                orphans[n_orphans, 0] = arena_of[e]
                orphans[n_orphans, 1] = row_of[e]
                n_orphans += 1
                r = _alloc_row(free, ameta)
                row_of[e] = r
                arena_of[e] = arena_id
                meta[M_REINIT] += 1
                init_embedding(arena[r], key, dim, lower, upper)
                init_state(arena[r], dim, opt)
        else:
            if p < 1.0 and not _uniform(mix64(key ^ salt)) < p:
                meta[M_REFUSED] += 1
                out[i, :] = 0.0
                continue
            e, r, n_orphans = _place(
                table,
                keys,
                prev,
                nxt,
                row_of,
                arena_of,
                meta,
                free,
                ameta,
                arena_id,
                key,
                s,
                orphans,
                n_orphans,
            )
            init_embedding(arena[r], key, dim, lower, upper)
            init_state(arena[r], dim, opt)
        for j in range(dim):
            out[i, j] = arena[r, j]
    return n_orphans


@_jit
def lookup_eval(ids, pos, out, arena, arena_id, table, keys, row_of, arena_of, meta):
    """Evaluation lookup: no insert, no LRU refresh; unknown ids (or stored at another dim) -> zeros."""
    dim = out.shape[1]
    bits = meta[M_BITS]
    for k in range(pos.shape[0]):
        warm(ids, pos, k, table, keys, row_of, arena_of, row_of, row_of, arena, bits, False)
        i = pos[k]
        s = probe(table, keys, ids[i], bits)
        if s >= 0 and arena_of[table[s]] == arena_id:
            r = row_of[table[s]]
            for j in range(dim):
                out[i, j] = arena[r, j]
        else:
            out[i, :] = 0.0


@_jit
def insert_rows(
    ids, rows, arena, free, ameta, arena_id, table, keys, prev, nxt, row_of, arena_of, meta, orphans
):
    """Store full rows (embedding + state, e.g. from a checkpoint) under ``ids``, as inserts that
    refresh recency. Existing entries are overwritten. Returns the number of orphans."""
    bits = meta[M_BITS]
    n_orphans = 0
    for i in range(ids.shape[0]):
        key = ids[i]
        s = probe(table, keys, key, bits)
        if s >= 0:
            e = table[s]
            touch(prev, nxt, meta, e)
            if arena_of[e] == arena_id:
                r = row_of[e]
            else:
                orphans[n_orphans, 0] = arena_of[e]
                orphans[n_orphans, 1] = row_of[e]
                n_orphans += 1
                r = _alloc_row(free, ameta)
                row_of[e] = r
                arena_of[e] = arena_id
        else:
            e, r, n_orphans = _place(
                table,
                keys,
                prev,
                nxt,
                row_of,
                arena_of,
                meta,
                free,
                ameta,
                arena_id,
                key,
                s,
                orphans,
                n_orphans,
            )
        for j in range(rows.shape[1]):
            arena[r, j] = rows[i, j]
    return n_orphans


@_jit
def gather_rows(ids, out, arena, arena_id, table, keys, row_of, arena_of, meta, found):
    """Full rows of ``ids`` stored in this arena (for incremental packets); ``found[i]`` says which."""
    bits = meta[M_BITS]
    for i in range(ids.shape[0]):
        s = probe(table, keys, ids[i], bits)
        if s >= 0 and arena_of[table[s]] == arena_id:
            out[i, :] = arena[row_of[table[s]], :]
            found[i] = True
        else:
            found[i] = False


@_jit
def rehash(table, keys, n, bits):
    """Rebuild ``table`` (already filled with -1, size 2**bits) from entries 0..n-1."""
    mask = (np.int64(1) << bits) - 1
    for e in range(n):
        s = _home(keys[e], bits)
        while table[s] != EMPTY:
            s = (s + 1) & mask
        table[s] = e


@_jit
def update_rows(
    ids, pos, grads, arena, arena_id, table, keys, row_of, arena_of, meta, opt, bound, applied
):
    """Apply ``grads[pos]`` to the entries of ``ids[pos]`` in order (a duplicated id gets one
    step per occurrence). Unknown ids (or stored at another dim) and non-finite rows are skipped;
    ``applied[pos[k]]`` is set when the step was applied. Returns (skipped_unknown, skipped_nonfinite).
    """
    dim = grads.shape[1]
    bits = meta[M_BITS]
    unknown = 0
    nonfinite = 0
    for k in range(pos.shape[0]):
        warm(ids, pos, k, table, keys, row_of, arena_of, row_of, row_of, arena, bits, False)
        i = pos[k]
        g = grads[i]
        if not finite(g):
            nonfinite += 1
            continue
        s = probe(table, keys, ids[i], bits)
        if s < 0 or arena_of[table[s]] != arena_id:
            unknown += 1
            continue
        apply(arena[row_of[table[s]]], g, dim, opt, bound)
        applied[i] = True
    return unknown, nonfinite
