"""The compiled kernel behind ``pyrsia.shared.scatter.add_blocks_if_finite``: rows of several
blocks, each read at its address, added into a table of unique rows.

A module of its own, imported on first use, because it needs numba at import time: the
pointer intrinsic and the kernel must be module-level objects for numba's on-disk cache to
find them again in the next process (defined in a closure, the kernel was compiled anew by
every process, ~1.1 s of CPU).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _pointer(typingctx, address):  # pragma: no cover - compiled
    """An integer address as a ``void *`` (for ``numba.carray``)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@njit(nogil=True, cache=True)
def add_blocks(index, addresses, row_strides, out):  # pragma: no cover - compiled
    """``out[index[s, r]] += block_s[r]``; block ``s`` is the float32 ``(n, d)`` array at
    ``addresses[s]`` whose rows lie ``row_strides[s]`` (>= d) floats apart, its values
    contiguous. Returns -1 (an index out of range, nothing added), 0 (a NaN or inf in
    ``out`` afterwards) or 1."""
    k, n = index.shape
    m, d = out.shape
    for s in range(k):
        for r in range(n):
            if index[s, r] < 0 or index[s, r] >= m:
                return -1
    # row by row across the blocks: where the blocks are one concatenation's gradient,
    # its memory is read in order (block by block read it 10x slower, a row per page)
    for r in range(n):
        for s in range(k):
            rows = numba.carray(_pointer(addresses[s] + 4 * r * row_strides[s]), (d,), np.float32)
            o = index[s, r]
            for j in range(d):
                out[o, j] += rows[j]
    # out started at zero: a NaN or inf in any block is one in out (the pass over out is
    # ~k times shorter than over the blocks), vectorized as in scatter's add_rows
    bits = out.reshape(-1).view(np.uint32)
    bad = np.uint32(0)
    for i in range(bits.shape[0]):
        bad |= np.uint32((bits[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000))
    return 0 if bad else 1


@njit(nogil=True, cache=True)
def blocks_finite(addresses, row_strides, n, d):  # pragma: no cover - compiled
    """Whether every value of the float32 ``(n, d)`` blocks is finite; block ``s`` lies at
    ``addresses[s]`` with rows ``row_strides[s]`` (>= d) floats apart, its values
    contiguous (the layout ``add_blocks`` reads). One pass, row by row across the blocks."""
    # an all-ones exponent (NaN or inf) carries into the top bit when 1 is added to it:
    # or-ing those sums is order-free, so the loop vectorizes (a compare per value: 1.2x slower)
    k = addresses.shape[0]
    if k == 0:
        return True
    # side by side in one row-major array (a concatenation's gradient): read as one block
    # whose rows are k * d wide, a row in one run (block by block: 194 against 41 us)
    blocks, width = 1, k * d
    for s in range(1, k):
        if addresses[s] != addresses[0] + 4 * s * d or row_strides[s] != row_strides[0]:
            blocks, width = k, d
            break
    carry = np.uint32(0)
    for r in range(n):
        for s in range(blocks):
            row = _pointer(addresses[s] + 4 * r * row_strides[s])
            bits = numba.carray(row, (width,), np.uint32)
            for j in range(width):
                carry |= (bits[j] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
    return (carry & np.uint32(0x80000000)) == 0
