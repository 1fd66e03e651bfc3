"""Compiled kernels of the embedding worker's hot path (numba, nogil, cached).

Each kernel is one pass over the ids or occurrences of a batch; the callers in
``preprocess`` and ``pooling`` validate inputs and allocate outputs, so the
kernels assume well-formed arrays. They release the GIL so the service can run
them in a thread while its event loop keeps answering.

Slot layout shared by the pooling kernels (see ``preprocess.SlotPlan``): sample
``i`` owns kept occurrences ``offsets[i]:offsets[i+1]``; occurrence ``o`` has
``rounds`` lookup rows ``inverse[o*rounds:(o+1)*rounds]``. A summed slot writes
row ``i``; a raw slot writes rows ``i*size + j`` for its j-th occurrence, with a
mask column at ``dim``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True)
def dedup_prefixed(ids, starts, prefixes, spacing, unique_out, inverse_out, expected):
    """Prefix ids in place of a copy, then dedup them: unique ids in first-seen order.

    ``ids[starts[s]:starts[s+1]]`` belong to slot s whose prefix is ``prefixes[s]``;
    each becomes ``id % spacing + prefix``. Open addressing with linear probing in
    a power-of-two table at most half full: O(n), unlike the sort in np.unique.

    The table has room for ``expected`` unique ids (the caller's guess, e.g. the last
    batch's count; at most all of them): Census-Income's 33,792 ids per batch hold ~430
    unique ones, and a table for 33,792 (1 MB) was cleared and probed out of cache on every
    batch. Returns the number of unique ids written to the front of ``unique_out``, or -1
    when more than ``expected`` came (the caller asks again with a larger guess).
    """
    n = ids.shape[0]
    cap = 16
    bits = 4
    while cap < 2 * min(expected, n):
        cap *= 2
        bits += 1
    shift = np.uint64(64 - bits)
    mask = cap - 1
    table = np.full(cap, -1, dtype=np.int64)
    count = 0
    for s in range(starts.shape[0] - 1):
        prefix = prefixes[s]
        for i in range(starts[s], starts[s + 1]):
            raw = ids[i]  # ids below spacing (nearly all) skip the 64-bit division
            key = (raw if raw < spacing else raw % spacing) + prefix
            pos = np.int64((key * _GOLDEN) >> shift)
            while True:
                u = table[pos]
                if u == -1:
                    if 2 * count >= cap:
                        return -1  # half full: a larger table, another pass
                    table[pos] = count
                    unique_out[count] = key
                    inverse_out[i] = count
                    count += 1
                    break
                if unique_out[u] == key:
                    inverse_out[i] = u
                    break
                pos = (pos + 1) & mask
    return count


@njit(nogil=True, cache=True)
def group_by_replica(unique, replica, replica_count, inverse, sorted_out, offsets_out):
    """Reorder unique ids so each replica's are contiguous; renumber ``inverse`` in place.

    After the call replica k owns ``sorted_out[offsets_out[k]:offsets_out[k+1]]``
    (first-seen order kept within a replica) and ``inverse`` points into ``sorted_out``.
    """
    n = unique.shape[0]
    for k in range(replica_count + 1):
        offsets_out[k] = 0
    for i in range(n):
        offsets_out[replica[i] + 1] += 1
    for k in range(replica_count):
        offsets_out[k + 1] += offsets_out[k]
    fill = offsets_out[:replica_count].copy()
    rank = np.empty(n, dtype=np.int64)
    for i in range(n):
        k = replica[i]
        rank[i] = fill[k]
        sorted_out[fill[k]] = unique[i]
        fill[k] += 1
    for i in range(inverse.shape[0]):
        inverse[i] = rank[inverse[i]]


@njit(nogil=True, cache=True)
def pool(vectors, inverse, offsets, rounds, scale, raw, size, out):
    """Forward pooling of one slot into ``out`` (written in full; no zero-fill needed).

    Sums go through a small local accumulator, which LLVM keeps in registers and
    vectorizes (it cannot prove ``out`` and ``vectors`` do not overlap).
    """
    dim = vectors.shape[1]
    acc = np.empty(dim, dtype=np.float32)
    for i in range(offsets.shape[0] - 1):
        s = scale[i]
        lo = offsets[i]
        hi = offsets[i + 1]
        if not raw:
            acc[:] = 0.0
            for o in range(lo, hi):
                for k in range(rounds):
                    v = vectors[inverse[o * rounds + k]]
                    for d in range(dim):
                        acc[d] += v[d]
            for d in range(dim):
                out[i, d] = acc[d] * s
            continue
        for j in range(size):
            row = i * size + j
            o = lo + j
            if o >= hi:
                for d in range(dim + 1):
                    out[row, d] = 0.0
                continue
            acc[:] = 0.0
            for k in range(rounds):
                v = vectors[inverse[o * rounds + k]]
                for d in range(dim):
                    acc[d] += v[d]
            for d in range(dim):
                out[row, d] = acc[d] * s
            out[row, dim] = 1.0


@njit(nogil=True, cache=True)
def scatter(grad_rows, inverse, offsets, rounds, scale, inv_loss_scale, raw, size, out):
    """The transpose of ``pool``: add each row's gradient (times scale / loss scale) to its ids."""
    dim = out.shape[1]
    for i in range(offsets.shape[0] - 1):
        lo = offsets[i]
        hi = offsets[i + 1]
        s = np.float32(scale[i] * inv_loss_scale)
        for o in range(lo, hi):
            row = i * size + (o - lo) if raw else i
            for k in range(rounds):
                u = inverse[o * rounds + k]
                for d in range(dim):
                    out[u, d] += grad_rows[row, d] * s


@njit(nogil=True, cache=True)
def all_finite(rows, cols):
    """No NaN and no inf in ``rows[:, :cols]`` (float32, C-contiguous; one compiled pass).

    NaN and +-inf are the floats whose exponent bits are all ones; or-ing that test over a
    row's bits without a branch per value lets LLVM vectorize the row (pyrsia/shared/scatter.py)."""
    bits = rows.view(np.uint32)
    exponent = np.uint32(0x7F800000)
    for i in range(rows.shape[0]):
        bad = np.uint32(0)
        for d in range(cols):
            bad |= np.uint32((bits[i, d] & exponent) == exponent)
        if bad:
            return False
    return True
