"""Compiled kernels of embedded mode's per-batch fast path (``fast_path.py``): numba, nogil,
cached on disk, loaded by ``warm_fast_path`` before the first batch.

A plain batch (every slot summed, one id per sample, no hash stack) of one dim group is
answered as one table: the group's unique vectors ``(rows, dim)`` and, per slot ``s`` and
sample ``i``, the row ``inverse[s * batch + i]`` among them. :func:`gather_block` writes, in
one pass over that inverse, both the table's ``int32`` index and the slots' gathered rows::

    inverse  int64 (slots * batch,)        the dim group's lookup rows, slot after slot
    index    int32 (slots, batch)          index[s, i] = inverse[s * batch + i]
    block    float32 (batch, slots, dim)   block[i, s] = vectors[index[s, i]]

``block[:, s]`` is then slot ``s``'s ``(batch, dim)`` tensor (``torch.from_numpy``, no copy;
a sample's slots side by side, as the model joins them: ``nn_worker/slot_tensors.py``):
the gather the NN worker's ``build_tensors`` otherwise makes with ``np.take`` after the
answer's index was converted, done here with the GIL released.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def gather_block(vectors, inverse, index, block):  # pragma: no cover - compiled
    """Fill ``index`` and ``block`` from ``vectors`` (see the module docstring); returns
    False, with ``block`` unwritten, when a row of ``inverse`` is not in
    ``[0, len(vectors))``."""
    slots, batch = index.shape
    rows, dim = vectors.shape
    for s in range(slots):
        for i in range(batch):
            r = inverse[s * batch + i]
            if r < 0 or r >= rows:
                return False
            index[s, i] = np.int32(r)
    # 8 samples at a time, slot by slot: each sample's row written whole while the index is
    # read in runs (sample by sample took 0.27 ms per Census batch, slot by slot 0.45 more
    # with the block out of the cache; this 0.14, as the slot-major block took)
    for first in range(0, batch, 8):
        stop = min(first + 8, batch)
        for s in range(slots):
            for i in range(first, stop):
                r = index[s, i]
                for j in range(dim):
                    block[i, s, j] = vectors[r, j]
    return True


def warm_fast_kernels() -> None:
    """Load (or compile) the kernels of this module with the argument types they get."""
    vectors = np.ones((2, 3), np.float32)
    inverse = np.array([0, 1, 1, 0], np.int64)
    gather_block(vectors, inverse, np.empty((2, 2), np.int32), np.empty((2, 2, 3), np.float32))
