"""What an embedding store reports about itself: :class:`StoreSnapshot`, rendered for ``/stats``,
and :class:`UpdateResult`, the outcome of one update.

``engine.EmbeddingStore.snapshot()`` copies its counters (kept by its hot path), its rows'
kernel counters (``kernels.M_*``) and memory use into a frozen :class:`StoreSnapshot`;
``to_stats()`` turns it into the ``/stats`` dict (``EmbeddingStore.stats()``). This module
reads nothing of the store itself, so it imports nothing of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrsia.shared.embedding_spec import EmbeddingHyperparams, OptimizerSpec, optimizer_to_dict


def raw_bytes_per_entry(row_width: int) -> int:
    """8-byte key + a row of ``row_width`` floats: the reference for memory overhead."""
    return 8 + 4 * row_width


@dataclass(frozen=True)
class StoreSnapshot:
    """A store's counters, memory use and configuration at one moment.

    ``updates_applied``: id rows this process applied a gradient to (each acknowledged);
    ``skipped_unknown`` / ``skipped_nonfinite``: update rows skipped; ``lookup_hits`` /
    ``admitted``: training-lookup ids found stored / given a new entry; ``evictions``,
    ``admission_refusals``, ``reinitialized_dim``: the kernels' counters over all shards.
    """

    entries: int
    capacity: int
    num_shards: int
    entries_per_dim: dict[int, int]
    row_widths: dict[int, int]
    bytes_allocated: int
    evictions: int
    admission_refusals: int
    reinitialized_dim: int
    updates_applied: int
    skipped_unknown: int
    skipped_nonfinite: int
    lookup_hits: int
    admitted: int
    optimizer: OptimizerSpec | None
    hyperparams: EmbeddingHyperparams

    def to_stats(self) -> dict:
        """The ``/stats`` dict (see the engine's module docstring for what each counts)."""
        entries, nbytes = self.entries, self.bytes_allocated
        raw = sum(
            n * raw_bytes_per_entry(self.row_widths[d]) for d, n in self.entries_per_dim.items()
        )
        return {
            "entries": entries,
            "capacity": self.capacity,
            "num_shards": self.num_shards,
            "evictions": self.evictions,
            "admission_refusals": self.admission_refusals,
            "updates_applied": self.updates_applied,
            "skipped_unknown": self.skipped_unknown,
            "skipped_nonfinite": self.skipped_nonfinite,
            "reinitialized_dim": self.reinitialized_dim,
            "bytes_allocated": nbytes,
            "bytes_per_entry": nbytes / entries if entries else 0.0,
            "raw_bytes_per_entry": raw / entries if entries else 0.0,
            "entries_per_dim": {str(d): n for d, n in sorted(self.entries_per_dim.items())},
            "optimizer": optimizer_to_dict(self.optimizer) if self.optimizer is not None else None,
            "hyperparams": self.hyperparams.to_dict(),
        }


@dataclass(frozen=True)
class UpdateResult:
    """Outcome of one ``EmbeddingStore.update``: id rows applied, and skipped (unknown, non-finite)."""

    applied: int
    skipped_unknown: int
    skipped_nonfinite: int
