"""Compiled primitives of a PS shard: the open-addressing hash table, stamp LRU, prefetching.

See :mod:`pyrsia.services.embedding_ps.kernels` for the data layout. Everything here is inlined into the
kernels (except the rarely run :func:`refill_pool` and :func:`rehash`); nothing is called from
Python except :func:`mix64_py` and :func:`shard_of`.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

M_N, M_CLOCK, M_CAP, M_SLOTS, M_EVICT, M_REFUSED, M_REINIT, M_PPOS, M_PLEN = range(9)
META_LEN = 9
A_USED, A_FREE = 0, 1
EMPTY = -1
FREE_SLOT = np.uint32(0xFFFFFFFF)  # entry word of an empty hash slot
LOW = np.int64(0xFFFFFFFF)
HIGH = np.int64(-(1 << 32))
AID_MASK = np.int64(0xFF)

PREFETCH = 16  # ids of look-ahead of each pass


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint the CPU to load ``arr[idx]`` into cache (llvm.prefetch; never faults)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(
            fn,
            [
                builder.bitcast(ptr, i8p),
                ir.Constant(i32, 0),
                ir.Constant(i32, 3),
                ir.Constant(i32, 1),
            ],
        )
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(inline="always", cache=True)
def mix64(x):
    """splitmix64 finalizer: a bijective, well-mixed uint64 -> uint64."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def mix64_py(x: int) -> np.uint64:
    """mix64 of one integer (taken mod 2**64), in Python."""
    m = (1 << 64) - 1
    x &= m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return np.uint64(x ^ (x >> 31))


def shard_of(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Internal shard of each id: mix64(id) % num_shards (independent of replica routing)."""
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64, copy=True)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(num_shards)).astype(np.int64)


@nb.njit(inline="always", cache=True)
def home(key, nslots):
    """Home slot of ``key``: the high 32 bits of mix(key) scaled onto [0, nslots), so the table
    can have any size (nslots < 2**32)."""
    return np.int64(((mix64(key) >> np.uint64(32)) * np.uint64(nslots)) >> np.uint64(32))


@nb.njit(inline="always", cache=True)
def _uniform(x):
    """uint64 -> float64 in [0, 1) from its top 53 bits."""
    return np.float64(x >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@nb.njit(inline="always", cache=True)
def slot_key(slots, s):
    return np.uint64(slots[3 * s]) | (np.uint64(slots[3 * s + 1]) << np.uint64(32))


@nb.njit(inline="always", cache=True)
def probe(slots, key, s, nslots):
    """Slot holding ``key`` (search starts at its home ``s``), or ``-(empty slot) - 1``."""
    lo = np.uint32(key & np.uint64(0xFFFFFFFF))
    hi = np.uint32(key >> np.uint64(32))
    while True:
        b = 3 * s
        if slots[b + 2] == FREE_SLOT:
            return -s - 1
        if slots[b] == lo and slots[b + 1] == hi:
            return s
        s += 1
        if s == nslots:
            s = 0


@nb.njit(inline="always", cache=True)
def set_slot(slots, ent, s, key, e):
    """Store (key, entry e) in slot ``s`` and record the slot in the entry."""
    b = 3 * s
    slots[b] = np.uint32(key & np.uint64(0xFFFFFFFF))
    slots[b + 1] = np.uint32(key >> np.uint64(32))
    slots[b + 2] = np.uint32(e)
    ent[e, 1] = (ent[e, 1] & HIGH) | s


@nb.njit(inline="always", cache=True)
def delete_slot(slots, ent, s, nslots):
    """Backward-shift deletion of slot ``s`` (linear probing, no tombstones); moved entries get
    their new slot recorded."""
    i = s
    j = s
    while True:
        j += 1
        if j == nslots:
            j = 0
        bj = 3 * j
        if slots[bj + 2] == FREE_SLOT:
            break
        k = home(slot_key(slots, j), nslots)
        # move the key at j back into the hole at i unless its home lies cyclically in (i, j]
        if i <= j:
            stay = i < k <= j
        else:
            stay = k > i or k <= j
        if not stay:
            bi = 3 * i
            slots[bi] = slots[bj]
            slots[bi + 1] = slots[bj + 1]
            slots[bi + 2] = slots[bj + 2]
            e = np.int64(slots[bj + 2])
            ent[e, 1] = (ent[e, 1] & HIGH) | i
            i = j
    slots[3 * i + 2] = FREE_SLOT


@nb.njit(inline="always", cache=True)
def touch(ent, meta, e, arena_id):
    """Mark entry ``e`` (stored in ``arena_id``) most recently used: one store of a fresh stamp."""
    ent[e, 0] = (meta[M_CLOCK] << 8) | arena_id
    meta[M_CLOCK] += 1


@nb.njit(nogil=True, cache=True)
def refill_pool(ent, n, pool, pstamp, meta):
    """Fill the eviction pool with the ``len(pool)`` least recently used entries, oldest first,
    recording their stamps (stamps are unique, so the selection is exact)."""
    m = min(pool.shape[0], n)
    st = ent[:n, 0].copy()
    thr = np.partition(st, m - 1)[m - 1]
    c = 0
    for e in range(n):
        if ent[e, 0] <= thr:
            pool[c] = e
            pstamp[c] = ent[e, 0]
            c += 1
    order = np.argsort(pstamp[:c])
    p = pool[:c][order]
    q = pstamp[:c][order]
    pool[:c] = p
    pstamp[:c] = q
    meta[M_PPOS] = 0
    meta[M_PLEN] = c


@nb.njit(inline="always", cache=True)
def victim(ent, pool, pstamp, meta):
    """The least recently used entry (exact): the oldest pool candidate whose stamp is unchanged.

    The pool holds the M oldest entries at refill time; an entry outside it is younger than every
    candidate, and a candidate touched since has a new stamp and is skipped, so the first
    unchanged candidate is the global minimum."""
    while True:
        if meta[M_PPOS] >= meta[M_PLEN]:
            refill_pool(ent, meta[M_N], pool, pstamp, meta)
        p = meta[M_PPOS]
        meta[M_PPOS] = p + 1
        e = np.int64(pool[p])
        if ent[e, 0] == pstamp[p]:
            return e


@nb.njit(nogil=True, cache=True)
def rehash(old_slots, slots, ent, n, nslots):
    """Rebuild ``slots`` (all free, ``nslots`` slots) from entries 0..n-1 of ``old_slots``."""
    for e in range(n):
        key = slot_key(old_slots, ent[e, 1] & LOW)
        s = probe(slots, key, home(key, nslots), nslots)
        set_slot(slots, ent, -s - 1, key, e)
