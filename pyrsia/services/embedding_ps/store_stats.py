"""What an embedding store reports about itself: ``stats()`` and ``lookup_counters()``.

``engine.EmbeddingStore`` mixes this in, as it does ``bulk.BulkAccess``: the counters are
kept by the store's hot path (``engine.py``); this module only reads them, together with the
shards' kernel counters (``kernels.M_*``) and memory use, for ``/stats`` and ``/metrics``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from pyrsia.services.embedding_ps import kernels as K
from pyrsia.shared.embedding_spec import EmbeddingHyperparams, OptimizerSpec, optimizer_to_dict

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.shard import Shard


class StoreStats:
    """Counters and memory use; mixed into ``EmbeddingStore`` (its state below)."""

    capacity: int
    num_shards: int
    _dims: dict[int, int]
    _shards: list[Shard]
    _state_lock: threading.Lock
    _optimizer: OptimizerSpec | None
    _hyperparams: EmbeddingHyperparams
    _updates_applied: int
    _skipped_unknown: int
    _skipped_nonfinite: int
    _lookup_hits: int
    _admitted: int

    def _width(self, dim: int) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def raw_bytes_per_entry(self, dim: int) -> int:
        """8-byte key + embedding + optimizer state: the reference for memory overhead."""
        return 8 + 4 * self._width(dim)

    def stats(self) -> dict:
        """Counters and memory use (see the engine's module docstring for what each counts)."""
        entries = len(self)
        per_dim: dict[int, int] = {}
        for dim, aid in self._dims.items():
            per_dim[dim] = sum(
                s.arenas[aid].live
                for s in self._shards
                if aid < len(s.arenas) and s.arenas[aid] is not None
            )
        nbytes = sum(s.nbytes() for s in self._shards)
        raw = sum(n * self.raw_bytes_per_entry(d) for d, n in per_dim.items())
        return {
            "entries": entries,
            "capacity": self.capacity,
            "num_shards": self.num_shards,
            "evictions": sum(int(s.meta[K.M_EVICT]) for s in self._shards),
            "admission_refusals": sum(int(s.meta[K.M_REFUSED]) for s in self._shards),
            "updates_applied": self._updates_applied,
            "skipped_unknown": self._skipped_unknown,
            "skipped_nonfinite": self._skipped_nonfinite,
            "reinitialized_dim": sum(int(s.meta[K.M_REINIT]) for s in self._shards),
            "bytes_allocated": nbytes,
            "bytes_per_entry": nbytes / entries if entries else 0.0,
            "raw_bytes_per_entry": raw / entries if entries else 0.0,
            "entries_per_dim": {str(d): n for d, n in sorted(per_dim.items())},
            "optimizer": optimizer_to_dict(self._optimizer)
            if self._optimizer is not None
            else None,
            "hyperparams": self._hyperparams.to_dict(),
        }

    def lookup_counters(self) -> dict[str, int]:
        """Cumulative training-lookup counts, cheap enough for every ``/metrics`` scrape:
        ``hits`` (ids found stored), ``admitted`` (ids given a new entry), ``refused`` (ids
        refused by ``admit_probability``) and ``evicted`` (entries dropped for capacity).
        A training lookup of n ids adds n to hits + admitted + refused."""
        with self._state_lock:
            hits, admitted = self._lookup_hits, self._admitted
        return {
            "hits": hits,
            "admitted": admitted,
            "refused": sum(int(s.meta[K.M_REFUSED]) for s in self._shards),
            "evicted": sum(int(s.meta[K.M_EVICT]) for s in self._shards),
        }
