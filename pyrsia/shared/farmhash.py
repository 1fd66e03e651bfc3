"""Vectorized farmhash64 of 8-byte little-endian integers.

PERSIA routes ids and builds hash stacks with farmhash's ``Hash64`` applied to the
8 little-endian bytes of a ``u64``. For an 8-byte input that is ``HashLen0to16``;
this module computes it for a whole array at once with wrapping uint64 arithmetic.
The ``pyfarmhash`` package (``farmhash.hash64(bytes)``) is the reference in tests.

Two implementations compute the same values: a compiled numba kernel (the default:
about 2 ns per id, releases the GIL) and the numpy one (``farmhash64_numpy``, about
40 ns per id), kept as the readable reference and as the fallback when numba is
not importable.
"""

from __future__ import annotations

import numpy as np

from pyrsia.shared.errors import InvalidTypeError
from pyrsia.shared.validate import positive_int

try:  # numba is a runtime dependency; the numpy path keeps the module usable without it
    from numba import njit
except ImportError:  # pragma: no cover - exercised only on installs without numba
    njit = None

_K2 = np.uint64(0x9AE16A3B2F90404F)
_MUL = np.uint64(0x9AE16A3B2F90404F + 16)  # k2 + len * 2, len = 8
_S47 = np.uint64(47)


def _rotate(x: np.ndarray, r: int) -> np.ndarray:
    return (x >> np.uint64(r)) | (x << np.uint64(64 - r))


def farmhash64_numpy(ids: np.ndarray) -> np.ndarray:
    """farmhash64 of each uint64 in ``ids`` with numpy (the reference implementation)."""
    x = _as_uint64(ids)
    with np.errstate(over="ignore"):
        a = x + _K2
        c = _rotate(x, 37) * _MUL + a
        d = (_rotate(a, 25) + x) * _MUL
        h = (c ^ d) * _MUL
        h ^= h >> _S47
        b = (d ^ h) * _MUL
        b ^= b >> _S47
        b *= _MUL
    return b


def _as_uint64(ids: np.ndarray) -> np.ndarray:
    x = np.asarray(ids)
    if x.dtype != np.uint64:
        raise InvalidTypeError(
            "ids", "a uint64 array", message=f"farmhash64 expects a uint64 array, got {x.dtype}"
        )
    return x


if njit is not None:
    # Every constant is a np.uint64: mixing uint64 with a Python int makes numba use float64.

    @njit(nogil=True, cache=True, inline="always")
    def _hash_one(x):
        k2 = np.uint64(0x9AE16A3B2F90404F)
        mul = np.uint64(0x9AE16A3B2F90405F)
        a = x + k2
        c = ((x >> np.uint64(37)) | (x << np.uint64(27))) * mul + a
        d = (((a >> np.uint64(25)) | (a << np.uint64(39))) + x) * mul
        h = (c ^ d) * mul
        h ^= h >> np.uint64(47)
        b = (d ^ h) * mul
        b ^= b >> np.uint64(47)
        return b * mul

    @njit(nogil=True, cache=True)
    def _farmhash64_kernel(x, out):
        for i in range(x.shape[0]):
            out[i] = _hash_one(x[i])

    @njit(nogil=True, cache=True)
    def _replica_kernel(x, count, out):
        n = np.uint64(count)
        for i in range(x.shape[0]):
            out[i] = np.int64(_hash_one(x[i]) % n)


def farmhash64(ids: np.ndarray) -> np.ndarray:
    """farmhash64 of each uint64 in ``ids`` (taken as 8 little-endian bytes); same shape."""
    x = _as_uint64(ids)
    if njit is None:
        return farmhash64_numpy(x)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.uint64)
    _farmhash64_kernel(flat, out)
    return out.reshape(x.shape)


def replica_of(ids: np.ndarray, replica_count: int) -> np.ndarray:
    """The embedding-PS replica that owns each id: farmhash64(id) mod replica_count (PERSIA's rule)."""
    replica_count = positive_int(replica_count, "replica_count")
    x = _as_uint64(ids)
    if njit is None:
        return (farmhash64_numpy(x) % np.uint64(replica_count)).astype(np.int64)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.int64)
    _replica_kernel(flat, int(replica_count), out)
    return out.reshape(x.shape)
