"""The embedding worker benchmark's workload (``ew_bench.py``): Criteo-shaped batches of
``SLOTS`` slots, one Zipf(1.1) id per sample and slot below ``ID_SPACE``, ``N_DENSE`` dense
features, dim-``DIM`` embeddings; the same batches for the worker and the baseline.
"""

from __future__ import annotations

import numpy as np

SLOTS = 26
DIM = 16
N_DENSE = 13
ID_SPACE = 10_000_000
ZIPF_A = 1.1


def zipf_ids(rng: np.random.Generator, n: int, space: int = ID_SPACE) -> np.ndarray:
    """``n`` Zipf(1.1) ranks below ``space`` (rejection sampling) as uint64 ids."""
    out = np.empty(0, dtype=np.int64)
    while out.shape[0] < n:
        z = rng.zipf(ZIPF_A, size=2 * n)
        out = np.concatenate([out, z[z <= space] - 1])
    return out[:n].astype(np.uint64)


def make_ids(batch: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` batches of (batch, SLOTS) uint64 ids, one id per sample and slot."""
    rng = np.random.default_rng(seed)
    return [zipf_ids(rng, batch * SLOTS).reshape(batch, SLOTS) for _ in range(count)]
