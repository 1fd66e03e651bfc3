"""The embedding PS storage engine: :class:`EmbeddingStore` (no HTTP; the service wraps it).

Ids are spread over ``num_shards`` internal shards by ``mix64(id) % num_shards`` (independent of
PERSIA's farmhash replica routing). Each shard has its own lock and its own compiled hash table,
stamp LRU and arenas (see :mod:`pyrsia.services.embedding_ps.kernels`); kernels release the GIL, so a
large batch's shards are worked by ``threads`` threads at once (``parallel.py``), with the
same result as one thread.

Semantics (issue 2, section 4):

* capacity counts vectors; each shard holds at most ``ceil(capacity / num_shards)``.
* training lookups refresh recency in batch order and admit unknown ids with
  ``admit_probability`` (a hash of (call salt, id): duplicates in one call agree); admitted ids
  start at Uniform(lower, upper) drawn from a hash of (id, element), so the value does not depend
  on the replica or shard; refused ids read zeros. Eval lookups never insert or refresh.
* a known id read at another dim is re-initialized at that dim (counted, logged once per call).
* updates apply one optimizer step per occurrence, in batch order (a duplicated id gets several
  steps; the embedding worker sends unique ids), then clip to ``weight_bound``; unknown ids and
  rows with NaN/inf are skipped and counted. Updates do not refresh recency.
* ``stats()["updates_applied"]`` counts the id rows this process applied a gradient to: each
  was acknowledged (the /update answer reports it), so the fault tests count lost updates with it.

The store is composed, not mixed: its rows (shards, arenas, routing, whole-row access) are a
``shard_set.ShardSet``; what it reports is a ``store_stats.StoreSnapshot`` (``snapshot()``);
checkpoints and packets use only its bulk surface (``bulk.BulkStore``: ``row_width``,
``stored_dims``, ``export_shard``, ``export_entries``, ``import_entries``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path

import numpy as np

from pyrsia.services.embedding_ps import kernels as K
from pyrsia.services.embedding_ps.capacity import check_capacity
from pyrsia.services.embedding_ps.checkpoint import dump_store, load_store
from pyrsia.services.embedding_ps.optimizers import pack, state_layout, state_width
from pyrsia.services.embedding_ps.parallel import resolve_threads
from pyrsia.services.embedding_ps.shard_set import ShardSet
from pyrsia.services.embedding_ps.store_stats import (
    StoreSnapshot,
    UpdateResult,
    raw_bytes_per_entry,
)
from pyrsia.shared.embedding_spec import EmbeddingHyperparams, OptimizerSpec, optimizer_to_dict
from pyrsia.shared.errors import ConflictError, InvalidInputError
from pyrsia.shared.validate import describe

log = logging.getLogger(__name__)


class EmbeddingStore:
    """A replica's embedding table: id -> embedding + optimizer state, LRU-bounded to ``capacity``.

    It keeps the configuration, the optimizer and the counters; its rows are a ``ShardSet``
    whose large batches ``threads`` threads work (at most one per shard; None: one per core).
    Public surface: ``lookup``/``update`` (hot path), ``configure``/``register_optimizer``,
    the bulk API (``bulk.BulkStore``), ``snapshot``/``stats``/``lookup_counters``,
    ``dump``/``load`` (checkpoints), ``clear``/``close``."""

    def __init__(
        self,
        capacity: int,
        num_shards: int = 1,
        hyperparams: EmbeddingHyperparams | None = None,
        optimizer: OptimizerSpec | None = None,
        seed: int | None = None,
        threads: int | None = None,
    ):
        check_capacity(capacity, num_shards)
        self.capacity = int(capacity)
        self.num_shards = int(num_shards)
        self._state_lock = threading.Lock()  # dims, optimizer, hyperparams, counters
        self._rows = ShardSet(
            self.capacity, self.num_shards, self._state_lock, resolve_threads(threads)
        )
        self._shards = self._rows.shards
        self._optimizer: OptimizerSpec | None = None
        self._opt = pack(None)
        self.configure(hyperparams or EmbeddingHyperparams())
        self._seed = int(seed) if seed is not None else int.from_bytes(os.urandom(8), "little")
        self._calls = itertools.count(1)
        self._skipped_unknown = 0
        self._skipped_nonfinite = 0
        self._updates_applied = 0  # id rows this process applied a gradient to (acknowledged)
        self._lookup_hits = 0  # training-lookup ids found stored (lookup_counters)
        self._admitted = 0  # training-lookup ids given a new entry
        self.incremental = None  # an IncrementalWriter, notified of applied updates
        if optimizer is not None:
            self.register_optimizer(optimizer)

    # ----------------------------------------------------------------- configuration
    @property
    def hyperparams(self) -> EmbeddingHyperparams:
        return self._hyperparams

    @property
    def optimizer(self) -> OptimizerSpec | None:
        return self._optimizer

    def configure(self, hyperparams: EmbeddingHyperparams) -> None:
        """Set initialization bounds, admit probability and weight bound (applies to later calls)."""
        if not isinstance(hyperparams, EmbeddingHyperparams):
            raise InvalidInputError("embedding_config", "an EmbeddingHyperparams", hyperparams)
        lo, hi = hyperparams.emb_initialization
        self._hyper = np.array([lo, hi, hyperparams.admit_probability], dtype=np.float64)
        self._hyperparams = hyperparams

    def register_optimizer(self, spec: OptimizerSpec) -> None:
        """Set the optimizer. The same spec again is a no-op; another spec while entries exist is a
        ConflictError unless only hyper-parameters change (same state layout) or none was set yet
        (state columns are then added and initialized)."""
        packed = pack(spec)
        if packed[0] < 0:
            raise InvalidInputError("optimizer", "an SGDSpec, AdamSpec or AdagradSpec", spec)
        with self._rows.locked():
            if spec == self._optimizer:
                return
            if (
                len(self)
                and self._optimizer is not None
                and state_layout(spec) != state_layout(self._optimizer)
            ):
                raise ConflictError(
                    f"optimizer: the store holds {len(self)} entries trained with "
                    f"{optimizer_to_dict(self._optimizer)}; clear it before registering {optimizer_to_dict(spec)}",
                )
            if len(self) and self._optimizer is None:
                self._rows.widen(spec)
            elif not len(self):
                self._rows.reset()
            self._optimizer = spec
            self._opt = packed

    def row_width(self, dim: int) -> int:
        """Floats in a row of ``dim``: the embedding plus the registered optimizer's state."""
        return dim + state_width(self._optimizer, dim)

    # ----------------------------------------------------------------- hot path

    def lookup(self, ids: np.ndarray, dim: int, *, train: bool) -> np.ndarray:
        """Embeddings of ``ids`` at ``dim``, float32 (len(ids), dim). See the module docstring.

        ``ids`` (1-D uint64) and ``dim`` come checked from ``pyrsia.shared.wire.ps.PSLookup``.
        """
        ids = np.ascontiguousarray(ids)
        dim = int(dim)
        out = np.empty((ids.shape[0], dim), dtype=np.float32)
        aid = self._rows.arena_id(dim, create=train)
        if aid is None:
            out[:] = 0.0
            return out
        if train:
            self._lookup_train(ids, dim, aid, out)
        else:
            self._rows.lookup_eval(ids, aid, out)
        return out

    def _lookup_train(self, ids: np.ndarray, dim: int, aid: int, out: np.ndarray) -> None:
        """Fill ``out`` for a training lookup: refresh, admit or refuse each id (the kernel),
        then add the shards' hits and admissions to the store's counters."""
        width = self.row_width(dim)
        salt = K.mix64_py(self._seed + next(self._calls))
        hyper, opt = self._hyper, self._opt

        def one(i: int, pos: np.ndarray) -> tuple[int, int, int]:
            shard = self._shards[i]
            with shard.lock:
                arena = shard.arena(aid, dim, width)
                shard.reserve(pos.shape[0], arena)
                meta = shard.meta
                before = (
                    int(meta[K.M_REINIT]),
                    int(meta[K.M_N]) + int(meta[K.M_EVICT]),
                    int(meta[K.M_REFUSED]),
                )
                orphans = np.empty((pos.shape[0], 2), dtype=np.int64)
                n_orph = K.lookup_train(
                    ids,
                    pos,
                    out,
                    arena.data,
                    arena.free,
                    arena.ameta,
                    np.int64(aid),
                    shard.slots,
                    shard.ent,
                    shard.pool,
                    shard.pstamp,
                    shard.meta,
                    hyper,
                    opt,
                    salt,
                    orphans,
                )
                shard.free_orphans(orphans, n_orph)
                # every new entry is placed (M_N grows) or replaces an evicted one
                placed = int(meta[K.M_N]) + int(meta[K.M_EVICT]) - before[1]
                refused = int(meta[K.M_REFUSED]) - before[2]
                return (
                    int(meta[K.M_REINIT]) - before[0],
                    placed,
                    pos.shape[0] - placed - refused,
                )

        counts = self._rows.run(one, self._rows.split(ids))
        reinit = sum(c[0] for c in counts)
        with self._state_lock:
            self._admitted += sum(c[1] for c in counts)
            self._lookup_hits += sum(c[2] for c in counts)
        if reinit:
            log.info("re-initialized %d ids stored at another dim at dim %d", reinit, dim)

    def update(self, ids: np.ndarray, grads: np.ndarray) -> UpdateResult:
        """Apply one optimizer step per (id, gradient row); see the module docstring.

        ``ids`` (1-D uint64) and ``grads`` (float32, one row per id) come checked from
        ``pyrsia.shared.wire.ps.PSUpdate``.
        """
        ids = np.ascontiguousarray(ids)
        dim = int(grads.shape[1])
        if self._optimizer is None:
            raise ConflictError(
                "optimizer: no optimizer registered; register one before sending gradients",
            )
        grads = np.ascontiguousarray(grads)
        aid = self._rows.arena_id(dim, create=False)
        applied = np.zeros(ids.shape[0], dtype=np.bool_)
        if aid is None:
            nonfinite = int((~np.isfinite(grads).all(axis=1)).sum())
            unknown = ids.shape[0] - nonfinite
        else:
            opt, bound = self._opt, np.float64(self._hyperparams.weight_bound)

            def one(i: int, pos: np.ndarray) -> tuple[int, int]:
                shard = self._shards[i]
                with shard.lock:
                    arena = shard.arenas[aid] if aid < len(shard.arenas) else None
                    if arena is None:
                        bad = int((~np.isfinite(grads[pos]).all(axis=1)).sum())
                        return pos.shape[0] - bad, bad
                    return K.update_rows(
                        ids,
                        pos,
                        grads,
                        arena.data,
                        np.int64(aid),
                        shard.slots,
                        shard.ent,
                        shard.meta,
                        opt,
                        bound,
                        applied,
                    )

            res = self._rows.run(one, self._rows.split(ids))
            unknown = sum(int(r[0]) for r in res)
            nonfinite = sum(int(r[1]) for r in res)
        with self._state_lock:
            self._skipped_unknown += unknown
            self._skipped_nonfinite += nonfinite
            self._updates_applied += ids.shape[0] - unknown - nonfinite
        n_applied = ids.shape[0] - unknown - nonfinite
        writer = self.incremental
        if writer is not None and n_applied:
            writer.notify(self, ids[applied])
        return UpdateResult(n_applied, unknown, nonfinite)

    def update_groups(self, groups: Iterable[tuple[np.ndarray, np.ndarray]]) -> UpdateResult:
        """:meth:`update` of each ``(ids, grads)`` pair of one update body, in order; the sums."""
        done = [self.update(ids, grads) for ids, grads in groups if len(ids)]
        return UpdateResult(
            sum(r.applied for r in done),
            sum(r.skipped_unknown for r in done),
            sum(r.skipped_nonfinite for r in done),
        )

    # ----------------------------------------------------------------- bulk (bulk.BulkStore)
    def stored_dims(self) -> list[int]:
        """The dims that have an arena (some may hold no entry), ascending."""
        return [dim for dim, _ in self._rows.dims()]

    def export_shard(self, dim: int, shard_index: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, rows) of every entry of ``dim`` in one internal shard, copied under its lock
        (None when the shard holds none, or when ``dim`` was cleared meanwhile: callers
        run off the loop, while /clear may run on it); checkpoint dumps run one per thread."""
        return self._rows.export_shard(dim, shard_index)

    def export_entries(
        self, ids: np.ndarray | None = None
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{dim: (ids, rows)} of stored entries (all, or those among ``ids``); rows include state."""
        return self._rows.export_entries(self.row_width, ids)

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
        width = self.row_width(dim)
        if rows.dtype != np.float32 or rows.shape != (ids.shape[0], width):
            raise InvalidInputError(
                "rows", f"float32 ({ids.shape[0]}, {width})", f"{rows.dtype}{list(rows.shape)}"
            )
        ids, rows = np.ascontiguousarray(ids), np.ascontiguousarray(rows)
        self._rows.import_rows(dim, width, ids, rows, pool)

    def dump(
        self, directory: str | Path, replica_index: int, replica_count: int, workers: int = 1
    ) -> dict:
        """Write this replica's part of a checkpoint into ``directory`` with ``workers`` threads
        (``checkpoint.dump_store``); returns its manifest."""
        return dump_store(self, directory, replica_index, replica_count, workers=workers)

    def load(
        self, directory: str | Path, replica_index: int, replica_count: int, workers: int = 1
    ) -> int:
        """Replace the contents with the ids of the checkpoint in ``directory`` routed to this
        replica (any writer replica count), read with ``workers`` threads; returns the count."""
        return load_store(self, directory, replica_index, replica_count, workers=workers)

    # ----------------------------------------------------------------- what it reports
    def snapshot(self) -> StoreSnapshot:
        """Counters, memory use and configuration now (``stats()`` renders it)."""
        rows = self._rows
        per_dim = rows.live_per_dim()
        with self._state_lock:
            updates, unknown = self._updates_applied, self._skipped_unknown
            nonfinite, hits, admitted = self._skipped_nonfinite, self._lookup_hits, self._admitted
        return StoreSnapshot(
            entries=len(rows),
            capacity=self.capacity,
            num_shards=self.num_shards,
            entries_per_dim=per_dim,
            row_widths={d: self.row_width(d) for d in per_dim},
            bytes_allocated=rows.nbytes(),
            evictions=rows.kernel_total(K.M_EVICT),
            admission_refusals=rows.kernel_total(K.M_REFUSED),
            reinitialized_dim=rows.kernel_total(K.M_REINIT),
            updates_applied=updates,
            skipped_unknown=unknown,
            skipped_nonfinite=nonfinite,
            lookup_hits=hits,
            admitted=admitted,
            optimizer=self._optimizer,
            hyperparams=self._hyperparams,
        )

    def stats(self) -> dict:
        """Counters and memory use (see the module docstring for what each counts)."""
        return self.snapshot().to_stats()

    def raw_bytes_per_entry(self, dim: int) -> int:
        """8-byte key + embedding + optimizer state: the reference for memory overhead."""
        return raw_bytes_per_entry(self.row_width(dim))

    def lookup_counters(self) -> dict[str, int]:
        """Cumulative training-lookup counts, cheap enough for every ``/metrics`` scrape:
        ``hits`` (ids found stored), ``admitted`` (ids given a new entry), ``refused`` (ids
        refused by ``admit_probability``) and ``evicted`` (entries dropped for capacity).
        A training lookup of n ids adds n to hits + admitted + refused."""
        with self._state_lock:
            hits, admitted = self._lookup_hits, self._admitted
        shards = self._shards  # summed here, not through ShardSet.kernel_total: once per lookup
        return {
            "hits": hits,
            "admitted": admitted,
            "refused": sum(int(s.meta[K.M_REFUSED]) for s in shards),
            "evicted": sum(int(s.meta[K.M_EVICT]) for s in shards),
        }

    # ----------------------------------------------------------------- bookkeeping
    @property
    def threads(self) -> int:
        return self._rows.threads  # a batch's shards are worked by this many threads

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        """Drop every entry (the optimizer, hyper-parameters and counters stay)."""
        with self._rows.locked():
            self._rows.reset()

    def close(self) -> None:
        """Stop the shard thread pool (the store stays usable single-threaded)."""
        self._rows.close()
