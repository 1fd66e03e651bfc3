"""Scatter-add of gradient rows into a table of unique rows, compiled and checked for NaN/inf.

The NN worker sums a gathered slot's per-sample gradients into one row per unique vector
(``pyrsia.shared.wire.gathered``) on its event-loop thread. ``torch.index_add_`` takes ~3.8 ms on
the CPU for Census-Income's 33 x 1,024 rows (it adds row by row through tensor slices) and a
separate ``isfinite`` pass 2.3 ms more; this kernel does both in ~0.18 ms and releases the GIL,
so the training thread is not kept waiting for it. :func:`add_blocks_if_finite` does the
same for rows spread over several blocks (each slot's gradient tensor), read in place
instead of stacked into one array first.

numba is imported and the kernel loaded from its cache on first use (~0.9 s of CPU), not at
import: processes that never sum gradients (data loaders) do not pay it, and ``TrainCtx``
starts it in a background thread when entered (:func:`warm_in_background`), before
training, instead of on the event loop during the first steps. (Until issue 10's stop 18 the
runtime started it, in data loaders too: ~0.45 s of a data loader's CPU inside the NN
worker's training window.)
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import numpy as np

from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.warming import warm_in_background as start_warming

ADDED, NONFINITE, OUT_OF_RANGE = 1, 0, -1


def _add_rows_numpy(index: np.ndarray, rows: np.ndarray, out: np.ndarray) -> int:
    if index.size and (int(index.min()) < 0 or int(index.max()) >= out.shape[0]):
        return OUT_OF_RANGE
    if not np.isfinite(rows).all():
        return NONFINITE
    np.add.at(out, index, rows)
    return ADDED


@functools.lru_cache(maxsize=1)
def _kernel() -> Callable[[np.ndarray, np.ndarray, np.ndarray], int]:
    """The compiled kernel (numpy's ``add.at`` where numba is missing)."""
    try:  # numba is a dependency; the numpy fallback keeps the module usable without it
        from numba import njit
    except ImportError:  # pragma: no cover
        return _add_rows_numpy

    @njit(nogil=True, cache=True)
    def add_rows(index, rows, out):  # pragma: no cover - compiled
        n, d = rows.shape
        m = out.shape[0]
        for r in range(n):
            if index[r] < 0 or index[r] >= m:
                return -1  # OUT_OF_RANGE
        # NaN and +-inf are the floats whose exponent bits are all ones. Or-ing that test
        # over the bits without an early exit lets LLVM vectorize the pass (a per-value
        # branch did not: 2.5x slower on Census-Income's rows).
        bits = rows.reshape(-1).view(np.uint32)
        bad = np.uint32(0)
        for i in range(bits.shape[0]):
            bad |= np.uint32((bits[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000))
        if bad:
            return 0  # NONFINITE
        for r in range(n):
            o = index[r]
            for j in range(d):
                out[o, j] += rows[r, j]
        return 1  # ADDED

    return add_rows


@functools.lru_cache(maxsize=1)
def _blocks_kernel() -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], int] | None:
    """The compiled kernel of :func:`add_blocks_if_finite`; None without numba."""
    try:
        from pyrsia.shared.scatter_blocks import add_blocks
    except ImportError:  # pragma: no cover - numba missing
        return None
    return add_blocks


def add_blocks_if_finite(
    index: np.ndarray, addresses: np.ndarray, out: np.ndarray, row_strides: np.ndarray | None = None
) -> bool | None:
    """``out[index[s, r]] += block_s[r]`` for every block ``s`` and row ``r``, read where the
    blocks are: no stacking copy (one per Census batch cost more than the sum itself).

    ``addresses[s]`` is the address of block ``s``: a float32 ``(n, d)`` array whose rows lie
    ``row_strides[s]`` floats apart (default ``d``: C-contiguous) and whose values are
    contiguous, e.g. a slot's gradient as a view of a concatenation's gradient. The caller
    keeps the blocks alive for the call and has checked their layout
    (``pyrsia.services.nn_worker.features`` checks it on the gradient tensors).
    ``index`` int32/int64 ``(k, n)`` C-contiguous, values checked to lie in ``[0, len(out))``;
    ``out`` float32 ``(m, d)``, all zeros on entry. Returns True when every sum is finite;
    False when a NaN or inf came in (or a sum overflowed), ``out`` then holding partial
    sums; None where numba is missing (the caller stacks the blocks for
    :func:`add_rows_if_finite`).
    """
    kernel = _blocks_kernel()
    if kernel is None:  # pragma: no cover
        return None
    k = index.shape[0] if index.ndim == 2 else -1
    if row_strides is None:
        row_strides = np.full(max(k, 0), out.shape[-1], np.int64)
    if (
        index.ndim != 2
        or addresses.shape != (k,)
        or row_strides.shape != (k,)
        or out.ndim != 2
        or (k and int(row_strides.min()) < out.shape[1])
    ):
        raise InvalidInputError(
            "index",
            "index (k, n), addresses (k,), row_strides (k,) of at least d, out (m, d)",
            message=f"add_blocks_if_finite: index {index.shape}, addresses {addresses.shape}, "
            f"row_strides {row_strides.tolist()}, out {out.shape}",
        )
    code = kernel(
        np.ascontiguousarray(index),
        addresses.astype(np.int64, copy=False),
        row_strides.astype(np.int64, copy=False),
        out,
    )
    return _added(code, out, "add_blocks_if_finite")


@functools.lru_cache(maxsize=1)
def _finite_kernel() -> Callable[[np.ndarray, np.ndarray, int, int], bool] | None:
    """The compiled kernel of :func:`blocks_finite`; None without numba."""
    try:
        from pyrsia.shared.scatter_blocks import blocks_finite as kernel
    except ImportError:  # pragma: no cover - numba missing
        return None
    return kernel


def blocks_finite(
    addresses: np.ndarray, row_strides: np.ndarray, shape: tuple[int, int]
) -> bool | None:
    """Whether every value of some float32 ``shape`` = ``(n, d)`` blocks is finite, read
    where they are (the layout :func:`add_blocks_if_finite` reads: block ``s`` at
    ``addresses[s]``, rows ``row_strides[s]`` >= d floats apart, values contiguous; the
    caller keeps them alive and has checked the layout). One pass over the values, ~30x
    faster than ``torch.isfinite(g).all()`` per slot on a concatenation's strided
    gradient views (1.5 ms for Census-Income's 33 slots). None where numba is missing.
    """
    kernel = _finite_kernel()
    if kernel is None:  # pragma: no cover
        return None
    n, d = shape
    k = addresses.shape[0] if addresses.ndim == 1 else -1
    if n < 0 or d < 1 or k < 0 or row_strides.shape != (k,) or (k and int(row_strides.min()) < d):
        raise InvalidInputError(
            "row_strides",
            "addresses (k,), row_strides (k,) of at least d, shape (n, d)",
            message=f"blocks_finite: addresses {addresses.shape}, row_strides "
            f"{row_strides.tolist()}, shape {shape}",
        )
    return bool(
        kernel(
            addresses.astype(np.int64, copy=False), row_strides.astype(np.int64, copy=False), n, d
        )
    )


def add_rows_if_finite(index: np.ndarray, rows: np.ndarray, out: np.ndarray) -> bool:
    """``out[index[r]] += rows[r]`` for every r, unless ``rows`` holds a NaN or inf: then
    nothing is added and the answer is False.

    ``index`` int32/int64 ``(n,)`` with values in ``[0, len(out))`` (checked here),
    ``rows`` float32 ``(n, d)``, ``out`` float32 ``(m, d)``, written in place.
    """
    if rows.ndim != 2 or index.shape != (rows.shape[0],) or out.shape[1:] != rows.shape[1:]:
        raise InvalidInputError(
            "rows",
            "index (n,), rows (n, d) and out (m, d)",
            message=f"add_rows_if_finite: index {index.shape}, rows {rows.shape}, out {out.shape}",
        )
    code = _kernel()(index, np.ascontiguousarray(rows, dtype=np.float32), out)
    return _added(code, out, "add_rows_if_finite")


def _added(code: int, out: np.ndarray, caller: str) -> bool:
    """A kernel's answer as ``caller`` gives it: whether it added; an index out of range
    is refused (the kernels check it before adding anything)."""
    if code == OUT_OF_RANGE:
        raise InvalidInputError(
            "index",
            f"rows in [0, {out.shape[0]})",
            message=f"{caller}: index outside [0, {out.shape[0]})",
        )
    return code == ADDED


def warm() -> float:
    """Load the kernel for the index types the wire and numpy give (int32 writable and
    read-only, int64); returns the seconds it took."""
    started = time.perf_counter()
    index = np.array([0, 1, 0], dtype=np.int32)
    readonly = index.copy()
    readonly.setflags(write=False)  # what the wire decodes
    rows = np.ones((3, 2), np.float32)
    for idx in (index, readonly, index.astype(np.int64)):
        add_rows_if_finite(idx, rows, np.zeros((2, 2), np.float32))
        address = np.array([rows.__array_interface__["data"][0]], np.int64)
        add_blocks_if_finite(idx.reshape(1, 3), address, np.zeros((2, 2), np.float32))
    blocks_finite(address, np.array([2], np.int64), (3, 2))
    return time.perf_counter() - started


_warming: threading.Thread | None = None
_warming_lock = threading.Lock()


def warm_in_background() -> None:
    """Start :func:`warm` once per process in a background thread (``pyrsia.shared.warming``)."""
    global _warming
    with _warming_lock:
        if _warming is None:
            _warming = start_warming(warm, "scatter-add")
