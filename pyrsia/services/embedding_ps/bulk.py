"""The bulk surface of an embedding store: what checkpoints and packets may use, and nothing more.

``engine.EmbeddingStore`` implements :class:`BulkStore`. The modules that move whole rows
(``checkpoint``, ``checkpoint_files``, ``packets``, ``incremental``, ``checksum``) are
written against this protocol: they never import the engine or touch its private state, and
the engine can hand itself to them (``EmbeddingStore.dump``/``load``) without an import circle.

A row is ``[embedding (dim) | optimizer state]``, float32, ``row_width(dim)`` wide; the state
layout is the registered optimizer's (``optimizers.py``).
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Protocol

import numpy as np

from pyrsia.shared.embedding_spec import EmbeddingHyperparams, OptimizerSpec


class BulkStore(Protocol):
    """Whole-row export and import, plus the configuration a checkpoint records."""

    num_shards: int

    @property
    def optimizer(self) -> OptimizerSpec | None:
        """The registered optimizer (None before one is registered)."""

    @property
    def hyperparams(self) -> EmbeddingHyperparams:
        """Initialization bounds, admit probability and weight bound."""

    def __len__(self) -> int:
        """Entries stored."""

    def row_width(self, dim: int) -> int:
        """Floats in a row of ``dim``: the embedding plus the optimizer's state."""

    def stored_dims(self) -> list[int]:
        """The dims that have an arena (some may hold no entry), ascending."""

    def export_shard(self, dim: int, shard_index: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, rows) of ``dim`` in one internal shard (None when it holds none); thread-safe."""

    def export_entries(
        self, ids: np.ndarray | None = None
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{dim: (ids, rows)} of stored entries (all, or those among ``ids``)."""

    def import_entries(
        self, dim: int, ids: np.ndarray, rows: np.ndarray, pool: Executor | None = None
    ) -> None:
        """Store full rows under ``ids`` (checked: uint64 ids, float32 rows ``row_width`` wide)."""

    def clear(self) -> None:
        """Drop every entry (the optimizer, hyper-parameters and counters stay)."""

    def register_optimizer(self, spec: OptimizerSpec) -> None:
        """Set the optimizer (see ``EmbeddingStore.register_optimizer``)."""
