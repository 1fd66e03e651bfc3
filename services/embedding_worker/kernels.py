"""Compiled kernels of the embedding worker's hot path (numba, nogil, cached).

Each kernel is one pass over the ids or occurrences of a batch; the callers in
``preprocess`` and ``pooling`` validate inputs and allocate outputs, so the
kernels assume well-formed, contiguous arrays. They release the GIL so the
service can run them in a thread while its event loop keeps answering.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True)
def dedup(ids, unique_out, inverse_out):
    """Unique ids in first-seen order and, per input id, its index among them.

    Open addressing with linear probing in a power-of-two table at most half full;
    O(n), unlike the sort in ``np.unique``. Returns the number of unique ids
    written to the front of ``unique_out``.
    """
    n = ids.shape[0]
    cap = 16
    bits = 4
    while cap < 2 * n:
        cap *= 2
        bits += 1
    shift = np.uint64(64 - bits)
    mask = cap - 1
    slots = np.full(cap, -1, dtype=np.int64)
    count = 0
    for i in range(n):
        key = ids[i]
        pos = np.int64((key * _GOLDEN) >> shift)
        while True:
            u = slots[pos]
            if u == -1:
                slots[pos] = count
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
def bucket_by_replica(replica, replica_count, order_out, offsets_out):
    """Counting sort of positions by replica: order_out[offsets_out[k]:offsets_out[k+1]] are replica k's."""
    for k in range(replica_count + 1):
        offsets_out[k] = 0
    for i in range(replica.shape[0]):
        offsets_out[replica[i] + 1] += 1
    for k in range(replica_count):
        offsets_out[k + 1] += offsets_out[k]
    fill = offsets_out[:replica_count].copy()
    for i in range(replica.shape[0]):
        k = replica[i]
        order_out[fill[k]] = i
        fill[k] += 1


@njit(nogil=True, cache=True)
def pool_rows(vectors, inverse, rows, rounds, row_scale, out):
    """out[rows[o], :dim] += sum of the ``rounds`` vectors of occurrence o; then scale each row.

    ``out`` is zero-initialized with width >= dim (raw slots carry a mask column after dim).
    """
    dim = vectors.shape[1]
    for o in range(rows.shape[0]):
        r = rows[o]
        base = o * rounds
        for k in range(rounds):
            u = inverse[base + k]
            for d in range(dim):
                out[r, d] += vectors[u, d]
    for r in range(out.shape[0]):
        s = row_scale[r]
        if s != 1.0:
            for d in range(dim):
                out[r, d] *= s


@njit(nogil=True, cache=True)
def scatter_rows(grad_rows, inverse, rows, rounds, row_scale, inv_loss_scale, out):
    """The transpose of ``pool_rows``: out[inverse[o*R+k]] += grad_rows[rows[o], :dim] * scale."""
    dim = out.shape[1]
    for o in range(rows.shape[0]):
        r = rows[o]
        s = np.float32(row_scale[r] * inv_loss_scale)
        base = o * rounds
        for k in range(rounds):
            u = inverse[base + k]
            for d in range(dim):
                out[u, d] += grad_rows[r, d] * s
