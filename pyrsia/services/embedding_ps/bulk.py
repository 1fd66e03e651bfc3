"""Bulk access to an embedding store: whole-row export/import, dump and load (checkpoints).

``engine.EmbeddingStore`` keeps the hot path (lookup, update) and mixes this in. Export and
import move whole rows (embedding + optimizer state) for checkpoints, incremental packets and
re-sharding; ``dump``/``load`` hand the store to the formats in ``checkpoint.py``.
"""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pyrsia.services.embedding_ps import kernels as K
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import describe

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.shard import Shard


class BulkAccess:
    """Whole-row export/import and dump/load; mixed into ``EmbeddingStore`` (its state below)."""

    _dims: dict[int, int]
    _shards: list[Shard]
    num_shards: int

    def _width(self, dim: int) -> int:
        raise NotImplementedError

    def _split(self, ids: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _arena_id(self, dim: int, create: bool) -> int | None:
        raise NotImplementedError

    def stored_dims(self) -> list[int]:
        """The dims that have an arena (some may hold no entry), ascending."""
        return sorted(self._dims)

    def export_shard(self, dim: int, shard_index: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, rows) of every entry of ``dim`` in one internal shard, copied under its lock
        (None when the shard holds none, or when ``dim`` was cleared meanwhile: callers
        run off the loop, while /clear may run on it); checkpoint dumps run one per thread."""
        aid = self._dims.get(dim)
        if aid is None:
            return None
        shard = self._shards[shard_index]
        with shard.lock:
            if aid >= len(shard.arenas) or shard.arenas[aid] is None:
                return None
            sid, rows = shard.live_ids(aid)
        return None if rows is None else (sid, rows)

    def export_entries(
        self, ids: np.ndarray | None = None
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{dim: (ids, rows)} of stored entries (all, or those among ``ids``); rows include state."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for dim, aid in sorted(self._dims.items()):
            width = self._width(dim)
            got_ids, got_rows = [], []
            for k, shard in enumerate(self._shards):
                if ids is None:
                    part = self.export_shard(dim, k)
                    if part is None:
                        continue
                    got_ids.append(part[0])
                    got_rows.append(part[1])
                    continue
                with shard.lock:
                    if aid >= len(shard.arenas) or shard.arenas[aid] is None:
                        continue
                    rows = np.empty((ids.shape[0], width), dtype=np.float32)
                    found = np.zeros(ids.shape[0], dtype=np.bool_)
                    a = shard.arenas[aid]
                    K.gather_rows(
                        ids, rows, a.data, np.int64(aid), shard.slots, shard.ent, shard.meta, found
                    )
                    sid, rows = ids[found], rows[found]
                got_ids.append(sid)
                got_rows.append(rows)
            if got_ids and sum(x.shape[0] for x in got_ids):
                out[dim] = (np.concatenate(got_ids), np.concatenate(got_rows))
        return out

    def import_entries(
        self, dim: int, ids: np.ndarray, rows: np.ndarray, pool: Executor | None = None
    ) -> None:
        """Store full rows (embedding + state of the registered optimizer's layout) under ``ids``.

        This is the one check of rows read from a checkpoint file (outside input). With a
        ``pool`` (checkpoint loads) the internal shards are filled in parallel, each in the
        order of ``ids``, so the result is the same as without.
        """
        if ids.dtype != np.uint64 or ids.ndim != 1:
            raise InvalidInputError("ids", "a 1-D uint64 array", describe(ids))
        ids = np.ascontiguousarray(ids)
        width = self._width(dim)
        if rows.dtype != np.float32 or rows.shape != (ids.shape[0], width):
            raise InvalidInputError(
                "rows", f"float32 ({ids.shape[0]}, {width})", f"{rows.dtype}{list(rows.shape)}"
            )
        rows = np.ascontiguousarray(rows)
        aid = self._arena_id(dim, create=True)

        def fill(i: int, pos: np.ndarray) -> None:
            shard = self._shards[i]
            with shard.lock:
                arena = shard.arena(aid, dim, width)
                shard.reserve(pos.shape[0], arena)
                orphans = np.empty((pos.shape[0], 2), dtype=np.int64)
                n_orph = K.insert_rows(
                    ids[pos], rows[pos], arena.data, arena.free, arena.ameta, np.int64(aid), shard.slots, shard.ent,
                    shard.pool, shard.pstamp, shard.meta, orphans,
                )  # fmt: skip
                shard.free_orphans(orphans, n_orph)

        parts = [(i, pos) for i, pos in enumerate(self._split(ids)) if pos.shape[0]]
        if pool is None or len(parts) < 2:
            for i, pos in parts:
                fill(i, pos)
            return
        tasks = [pool.submit(fill, i, pos) for i, pos in parts]
        for task in tasks:  # every shard done (or failed) before the first failure is raised
            task.exception()
        for task in tasks:
            task.result()

    def dump(
        self, directory: str | Path, replica_index: int, replica_count: int, workers: int = 1
    ) -> dict:
        """Write this replica's part of a checkpoint into ``directory`` with ``workers`` threads;
        returns its manifest."""
        from pyrsia.services.embedding_ps.checkpoint import dump_store

        return dump_store(self, directory, replica_index, replica_count, workers=workers)

    def load(
        self, directory: str | Path, replica_index: int, replica_count: int, workers: int = 1
    ) -> int:
        """Replace the contents with the ids of the checkpoint in ``directory`` routed to this
        replica (any writer replica count), read with ``workers`` threads; returns the count."""
        from pyrsia.services.embedding_ps.checkpoint import load_store

        return load_store(self, directory, replica_index, replica_count, workers=workers)
