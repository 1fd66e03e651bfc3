"""The rows of an embedding store: its internal shards, the dim -> arena map, and whole-row access.

``engine.EmbeddingStore`` owns one :class:`ShardSet` (composition: the store keeps the
configuration, the optimizer and the counters; this object keeps the rows). Ids go to internal
shard ``mix64(id) % num_shards``; each shard holds one arena per dim (``shard.py``), the same
arena id in every shard. Two kinds of callers use it:

* the store's hot path (``lookup``, ``update``): :meth:`split` ids per shard, :meth:`run` a
  function per shard (over ``threads`` threads for a large batch: ``parallel.ShardRunner``),
  :meth:`arena_id`;
* bulk access (checkpoints, packets, re-sharding): :meth:`export_shard`, :meth:`export_entries`
  and :meth:`import_rows` move whole rows ``[embedding (dim) | optimizer state]``.

Locking: ``lock`` (the store's state lock, passed in) guards the dim map; each shard's own
lock guards its arrays. :meth:`locked` takes ``lock`` then every shard's, in that order.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager

import numpy as np

from pyrsia.services.embedding_ps import kernels as K
from pyrsia.services.embedding_ps.optimizers import init_state_numpy, state_width
from pyrsia.services.embedding_ps.parallel import ShardRunner, split_positions
from pyrsia.services.embedding_ps.shard import Shard, aligned_empty
from pyrsia.shared.embedding_spec import OptimizerSpec
from pyrsia.shared.errors import InvalidInputError

MAX_DIMS = 127  # arena ids are int8


class ShardSet:
    """``num_shards`` internal shards of ``ceil(capacity / num_shards)`` entries each, a
    batch's shards worked by up to ``threads`` threads (``parallel.resolve_threads``)."""

    def __init__(self, capacity: int, num_shards: int, lock: threading.Lock, threads: int):
        self.num_shards = num_shards
        self.shards = [Shard(math.ceil(capacity / num_shards)) for _ in range(num_shards)]
        self.lock = lock
        self._dims: dict[int, int] = {}
        self.threads = min(num_shards, threads)
        self._runner = ShardRunner(self.threads)

    # ----------------------------------------------------------------- dims and routing
    def arena_id(self, dim: int, create: bool) -> int | None:
        """The arena id of ``dim`` (a new one when ``create``; None when absent)."""
        aid = self._dims.get(dim)
        if aid is None and create:
            with self.lock:
                aid = self._dims.get(dim)
                if aid is None:
                    if len(self._dims) >= MAX_DIMS:
                        raise InvalidInputError(
                            "dim", f"at most {MAX_DIMS} distinct dims per store", dim
                        )
                    aid = self._dims[dim] = len(self._dims)
        return aid

    def dims(self) -> list[tuple[int, int]]:
        """(dim, arena id) of every dim that has an arena, by dim."""
        return sorted(self._dims.items())

    def split(self, ids: np.ndarray) -> list[np.ndarray]:
        """Positions of ``ids`` per internal shard, each in batch order."""
        if self.num_shards == 1:
            return [np.arange(ids.shape[0], dtype=np.int64)]
        order, starts = split_positions(ids, self.num_shards)
        return [order[starts[k] : starts[k + 1]] for k in range(self.num_shards)]

    def run(self, fn: Callable, parts: list[np.ndarray]) -> list:
        """``fn(shard_index, positions)`` for every non-empty part, results in shard order;
        over the shard threads for large batches (``parallel.ShardRunner``)."""
        return self._runner.run(fn, parts)

    def lookup_eval(self, ids: np.ndarray, aid: int, out: np.ndarray) -> None:
        """Fill ``out`` for an eval lookup at arena ``aid``: stored ids read their rows,
        others zeros; nothing is inserted or refreshed."""

        def one(i: int, pos: np.ndarray) -> None:
            shard = self.shards[i]
            with shard.lock:
                arena = shard.arenas[aid] if aid < len(shard.arenas) else None
                if arena is None:
                    out[pos] = 0.0
                    return
                K.lookup_eval(
                    ids, pos, out, arena.data, np.int64(aid), shard.slots, shard.ent, shard.meta
                )

        self.run(one, self.split(ids))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``lock`` and every shard's lock (configuration changes, clear)."""
        with self.lock:
            for s in self.shards:
                s.lock.acquire()
            try:
                yield
            finally:
                for s in reversed(self.shards):
                    s.lock.release()

    # ----------------------------------------------------------------- bookkeeping
    def __len__(self) -> int:
        return sum(s.n for s in self.shards)

    def reset(self) -> None:
        """Drop every entry and dim; the caller holds :meth:`locked`."""
        for s in self.shards:
            s.reset()
        self._dims.clear()

    def widen(self, spec: OptimizerSpec) -> None:
        """Add ``spec``'s state columns to every stored row, initialized; the caller holds
        :meth:`locked` (an optimizer registered on a store trained without one)."""
        for dim, aid in self._dims.items():
            width = dim + state_width(spec, dim)
            for shard in self.shards:
                a = shard.arenas[aid] if aid < len(shard.arenas) else None
                if a is None:
                    continue
                data = aligned_empty((a.data.shape[0], width), np.float32)
                data[:, :dim] = a.data[:, :dim]
                init_state_numpy(data, dim, spec)
                a.data, a.width = data, width

    def live_per_dim(self) -> dict[int, int]:
        """{dim: entries stored at it}, over every dim that has an arena."""
        return {
            dim: sum(
                s.arenas[aid].live
                for s in self.shards
                if aid < len(s.arenas) and s.arenas[aid] is not None
            )
            for dim, aid in self._dims.items()
        }

    def nbytes(self) -> int:
        """Bytes allocated by every shard's arrays."""
        return sum(s.nbytes() for s in self.shards)

    def kernel_total(self, counter: int) -> int:
        """One of the kernels' per-shard counters (``kernels.M_*``) summed over the shards."""
        return sum(int(s.meta[counter]) for s in self.shards)

    def close(self) -> None:
        """Stop the shard threads (the rows stay usable single-threaded)."""
        self._runner.close()

    # ----------------------------------------------------------------- whole rows
    def export_shard(self, dim: int, shard_index: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, rows) of every entry of ``dim`` in one internal shard, copied under its lock
        (None when the shard holds none, or when ``dim`` was cleared meanwhile)."""
        aid = self._dims.get(dim)
        if aid is None:
            return None
        shard = self.shards[shard_index]
        with shard.lock:
            if aid >= len(shard.arenas) or shard.arenas[aid] is None:
                return None
            sid, rows = shard.live_ids(aid)
        return None if rows is None else (sid, rows)

    def _gather(self, aid: int, width: int, ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids, rows) per shard of those of ``ids`` stored in arena ``aid``."""
        found_parts = []
        for shard in self.shards:
            with shard.lock:
                if aid >= len(shard.arenas) or shard.arenas[aid] is None:
                    continue
                rows = np.empty((ids.shape[0], width), dtype=np.float32)
                found = np.zeros(ids.shape[0], dtype=np.bool_)
                a = shard.arenas[aid]
                K.gather_rows(
                    ids, rows, a.data, np.int64(aid), shard.slots, shard.ent, shard.meta, found
                )
                found_parts.append((ids[found], rows[found]))
        return found_parts

    def export_entries(
        self, width_of: Callable[[int], int], ids: np.ndarray | None = None
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{dim: (ids, rows)} of stored entries (all, or those among ``ids``), rows
        ``width_of(dim)`` wide, concatenated in shard order."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for dim, aid in self.dims():
            if ids is None:
                parts = [self.export_shard(dim, k) for k in range(self.num_shards)]
                parts = [p for p in parts if p is not None]
            else:
                parts = self._gather(aid, width_of(dim), ids)
            if parts and sum(p[0].shape[0] for p in parts):
                out[dim] = (
                    np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]),
                )
        return out

    def import_rows(
        self, dim: int, width: int, ids: np.ndarray, rows: np.ndarray, pool: Executor | None
    ) -> None:
        """Store ``rows`` (checked by the store: contiguous float32, ``width`` wide) under
        ``ids``; with a ``pool`` the shards are filled in parallel, each in the order of ``ids``."""
        aid = self.arena_id(dim, create=True)

        def fill(i: int, pos: np.ndarray) -> None:
            shard = self.shards[i]
            with shard.lock:
                arena = shard.arena(aid, dim, width)
                shard.reserve(pos.shape[0], arena)
                orphans = np.empty((pos.shape[0], 2), dtype=np.int64)
                n_orph = K.insert_rows(
                    ids[pos],
                    rows[pos],
                    arena.data,
                    arena.free,
                    arena.ameta,
                    np.int64(aid),
                    shard.slots,
                    shard.ent,
                    shard.pool,
                    shard.pstamp,
                    shard.meta,
                    orphans,
                )
                shard.free_orphans(orphans, n_orph)

        parts = [(i, pos) for i, pos in enumerate(self.split(ids)) if pos.shape[0]]
        if pool is None or len(parts) < 2:
            for i, pos in parts:
                fill(i, pos)
            return
        tasks = [pool.submit(fill, i, pos) for i, pos in parts]
        for task in tasks:  # every shard done (or failed) before the first failure is raised
            task.exception()
        for task in tasks:
            task.result()
