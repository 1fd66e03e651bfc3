"""Compiled primitives of a PS shard: the open-addressing hash table, the LRU list, prefetching.

See :mod:`services.embedding_ps.kernels` for the data layout. Everything here is inlined into the
kernels; nothing is called from Python except :func:`mix64_py` and :func:`shard_of`.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

M_N, M_HEAD, M_TAIL, M_CAP, M_BITS, M_EVICT, M_REFUSED, M_REINIT = range(8)
META_LEN = 8
A_USED, A_FREE = 0, 1
EMPTY = -1


PREFETCH = 16  # ids of look-ahead: the pipeline below keeps ~3x this many cache misses in flight


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
def _home(key, bits):
    return np.int64(mix64(key) >> np.uint64(64 - bits))


@nb.njit(inline="always", cache=True)
def _uniform(x):
    """uint64 -> float64 in [0, 1) from its top 53 bits."""
    return np.float64(x >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@nb.njit(inline="always", cache=True)
def probe(table, keys, key, bits):
    """Slot holding ``key``, or ``-(empty slot) - 1`` where it would be inserted."""
    mask = (np.int64(1) << bits) - 1
    s = _home(key, bits)
    while True:
        e = table[s]
        if e == EMPTY:
            return -s - 1
        if keys[e] == key:
            return s
        s = (s + 1) & mask


@nb.njit(inline="always", cache=True)
def warm(ids, pos, k, table, keys, row_of, arena_of, prev, nxt, arena, bits, lru):
    """Software pipeline: while id k is processed, prefetch the table slot of id k+3D, the entry
    fields of id k+2D and the arena row (and LRU neighbours) of id k+D. Only hints: the real work
    re-reads everything, so stale guesses cost nothing but bandwidth."""
    n = pos.shape[0]
    d = PREFETCH
    if k + 3 * d < n:
        prefetch(table, _home(ids[pos[k + 3 * d]], bits))
    if k + 2 * d < n:
        e = table[_home(ids[pos[k + 2 * d]], bits)]
        if e != EMPTY:
            prefetch(keys, e)
            prefetch(row_of, e)
            prefetch(arena_of, e)
            if lru:
                prefetch(prev, e)
                prefetch(nxt, e)
    if k + d < n:
        e = table[_home(ids[pos[k + d]], bits)]
        if e != EMPTY:
            r = row_of[e]
            if r < arena.shape[0]:
                prefetch(arena[r], 0)
            if lru:
                p = prev[e]
                q = nxt[e]
                if p != EMPTY:
                    prefetch(prev, p)
                    prefetch(nxt, p)
                if q != EMPTY:
                    prefetch(prev, q)
                    prefetch(nxt, q)


@nb.njit(inline="always", cache=True)
def _delete_slot(table, keys, s, bits):
    """Backward-shift deletion of slot ``s`` (linear probing, no tombstones)."""
    mask = (np.int64(1) << bits) - 1
    i = s
    j = s
    while True:
        j = (j + 1) & mask
        e = table[j]
        if e == EMPTY:
            break
        k = _home(keys[e], bits)
        # move e back into the hole at i unless its home lies cyclically in (i, j]
        if i <= j:
            stay = i < k <= j
        else:
            stay = k > i or k <= j
        if not stay:
            table[i] = e
            i = j
    table[i] = EMPTY


@nb.njit(inline="always", cache=True)
def _unlink(prev, nxt, meta, e):
    p = prev[e]
    n = nxt[e]
    if p != EMPTY:
        nxt[p] = n
    else:
        meta[M_HEAD] = n
    if n != EMPTY:
        prev[n] = p
    else:
        meta[M_TAIL] = p


@nb.njit(inline="always", cache=True)
def _push_head(prev, nxt, meta, e):
    h = meta[M_HEAD]
    prev[e] = EMPTY
    nxt[e] = h
    if h != EMPTY:
        prev[h] = e
    else:
        meta[M_TAIL] = e
    meta[M_HEAD] = e


@nb.njit(inline="always", cache=True)
def touch(prev, nxt, meta, e):
    """Move entry ``e`` to the head (most recently used) of the LRU list."""
    if meta[M_HEAD] != e:
        _unlink(prev, nxt, meta, e)
        _push_head(prev, nxt, meta, e)
