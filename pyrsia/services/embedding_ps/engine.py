"""The embedding PS storage engine: :class:`EmbeddingStore` (no HTTP; the service wraps it).

Ids are spread over ``num_shards`` internal shards by ``mix64(id) % num_shards`` (independent of
PERSIA's farmhash replica routing). Each shard has its own lock and its own compiled hash table,
stamp LRU and arenas (see :mod:`pyrsia.services.embedding_ps.kernels`); kernels release the GIL, so a
large batch is split over a small thread pool when there are several shards.

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
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from pyrsia.services.embedding_ps import kernels as K
from pyrsia.services.embedding_ps.bulk import BulkAccess
from pyrsia.services.embedding_ps.optimizers import (
    init_state_numpy,
    pack,
    state_layout,
    state_width,
)
from pyrsia.services.embedding_ps.shard import Shard, aligned_empty
from pyrsia.services.embedding_ps.store_stats import StoreStats
from pyrsia.shared.embedding_spec import EmbeddingHyperparams, OptimizerSpec, optimizer_to_dict
from pyrsia.shared.errors import ConflictError, InvalidInputError

log = logging.getLogger(__name__)

MAX_DIMS = 127  # arena ids are int8
PARALLEL_MIN_BATCH = 16_384


@dataclass(frozen=True)
class UpdateResult:
    """Outcome of :meth:`EmbeddingStore.update`."""

    applied: int
    skipped_unknown: int
    skipped_nonfinite: int


class EmbeddingStore(BulkAccess, StoreStats):
    """A replica's embedding table: id -> embedding + optimizer state, LRU-bounded to ``capacity``.

    Whole-row export/import and checkpoints come from ``bulk.BulkAccess``; ``stats()`` and
    ``lookup_counters()`` from ``store_stats.StoreStats``."""

    def __init__(
        self,
        capacity: int,
        num_shards: int = 1,
        hyperparams: EmbeddingHyperparams | None = None,
        optimizer: OptimizerSpec | None = None,
        seed: int | None = None,
    ):
        if (
            isinstance(capacity, bool)
            or not isinstance(capacity, (int, np.integer))
            or not 0 < capacity < 2**31 * 64
        ):
            raise InvalidInputError("capacity", "a positive integer", capacity)
        if (
            isinstance(num_shards, bool)
            or not isinstance(num_shards, (int, np.integer))
            or not 0 < num_shards <= 64
        ):
            raise InvalidInputError(
                "num_hashmap_internal_shards", "an integer in [1, 64]", num_shards
            )
        per_shard = math.ceil(capacity / num_shards)
        if per_shard >= 2**31 - 1:
            raise InvalidInputError(
                "capacity", f"at most {2**31 - 2} vectors per internal shard", capacity
            )
        self.capacity = int(capacity)
        self.num_shards = int(num_shards)
        self._shards = [Shard(per_shard) for _ in range(self.num_shards)]
        self._state_lock = threading.Lock()  # dims, optimizer, hyperparams, counters
        self._dims: dict[int, int] = {}
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
        self._pool = (
            ThreadPoolExecutor(min(self.num_shards, os.cpu_count() or 1), "ps-shard")
            if self.num_shards > 1
            else None
        )
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
        with self._all_locks():
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
                self._add_state_columns(spec)
            elif not len(self):
                self._reset_unlocked()
            self._optimizer = spec
            self._opt = packed

    def _add_state_columns(self, spec: OptimizerSpec) -> None:
        for dim, aid in self._dims.items():
            width = dim + state_width(spec, dim)
            for shard in self._shards:
                a = shard.arenas[aid] if aid < len(shard.arenas) else None
                if a is None:
                    continue
                data = aligned_empty((a.data.shape[0], width), np.float32)
                data[:, :dim] = a.data[:, :dim]
                init_state_numpy(data, dim, spec)
                a.data, a.width = data, width

    def _all_locks(self):
        store = self

        class _Locks:
            def __enter__(self):
                store._state_lock.acquire()
                for s in store._shards:
                    s.lock.acquire()

            def __exit__(self, *exc):
                for s in reversed(store._shards):
                    s.lock.release()
                store._state_lock.release()

        return _Locks()

    def _arena_id(self, dim: int, create: bool) -> int | None:
        aid = self._dims.get(dim)
        if aid is None and create:
            with self._state_lock:
                aid = self._dims.get(dim)
                if aid is None:
                    if len(self._dims) >= MAX_DIMS:
                        raise InvalidInputError(
                            "dim", f"at most {MAX_DIMS} distinct dims per store", dim
                        )
                    aid = self._dims[dim] = len(self._dims)
        return aid

    def _width(self, dim: int) -> int:
        return dim + state_width(self._optimizer, dim)

    # ----------------------------------------------------------------- hot path
    def _split(self, ids: np.ndarray) -> list[np.ndarray]:
        """Positions of ``ids`` per internal shard, each in batch order."""
        if self.num_shards == 1:
            return [np.arange(ids.shape[0], dtype=np.int64)]
        sh = K.shard_of(ids, self.num_shards)
        order = np.argsort(sh, kind="stable")
        bounds = np.cumsum(np.bincount(sh, minlength=self.num_shards))[:-1]
        return np.split(order, bounds)

    def _run(self, fn, parts: list[np.ndarray]) -> list:
        work = [(i, p) for i, p in enumerate(parts) if p.shape[0]]
        if (
            self._pool is not None
            and len(work) > 1
            and sum(p.shape[0] for _, p in work) >= PARALLEL_MIN_BATCH
        ):
            return list(self._pool.map(lambda ip: fn(*ip), work))
        return [fn(i, p) for i, p in work]

    def lookup(self, ids: np.ndarray, dim: int, *, train: bool) -> np.ndarray:
        """Embeddings of ``ids`` at ``dim``, float32 (len(ids), dim). See the module docstring.

        ``ids`` (1-D uint64) and ``dim`` come checked from ``pyrsia.shared.wire.ps.PSLookup``.
        """
        ids = np.ascontiguousarray(ids)
        dim = int(dim)
        out = np.empty((ids.shape[0], dim), dtype=np.float32)
        aid = self._arena_id(dim, create=train)
        if aid is None:
            out[:] = 0.0
            return out
        if train:
            self._lookup_train(ids, dim, aid, out)
        else:
            self._lookup_eval(ids, aid, out)
        return out

    def _lookup_train(self, ids: np.ndarray, dim: int, aid: int, out: np.ndarray) -> None:
        """Fill ``out`` for a training lookup: refresh, admit or refuse each id (the kernel),
        then add the shards' hits and admissions to the store's counters."""
        width = self._width(dim)
        salt = K.mix64_py(self._seed + next(self._calls))
        hyper, opt = self._hyper, self._opt

        def one(i: int, pos: np.ndarray) -> tuple[int, int, int]:
            shard = self._shards[i]
            with shard.lock:
                arena = shard.arena(aid, dim, width)
                shard.reserve(pos.shape[0], arena)
                meta = shard.meta
                before = (int(meta[K.M_REINIT]), int(meta[K.M_N]) + int(meta[K.M_EVICT]),
                          int(meta[K.M_REFUSED]))  # fmt: skip
                orphans = np.empty((pos.shape[0], 2), dtype=np.int64)
                n_orph = K.lookup_train(
                    ids, pos, out, arena.data, arena.free, arena.ameta, np.int64(aid), shard.slots, shard.ent,
                    shard.pool, shard.pstamp, shard.meta, hyper, opt, salt, orphans,
                )  # fmt: skip
                shard.free_orphans(orphans, n_orph)
                # every new entry is placed (M_N grows) or replaces an evicted one
                placed = int(meta[K.M_N]) + int(meta[K.M_EVICT]) - before[1]
                refused = int(meta[K.M_REFUSED]) - before[2]
                return (
                    int(meta[K.M_REINIT]) - before[0],
                    placed,
                    pos.shape[0] - placed - refused,
                )

        counts = self._run(one, self._split(ids))
        reinit = sum(c[0] for c in counts)
        with self._state_lock:
            self._admitted += sum(c[1] for c in counts)
            self._lookup_hits += sum(c[2] for c in counts)
        if reinit:
            log.info("re-initialized %d ids stored at another dim at dim %d", reinit, dim)

    def _lookup_eval(self, ids: np.ndarray, aid: int, out: np.ndarray) -> None:
        """Fill ``out`` for an eval lookup: stored ids read their rows, others zeros; nothing
        is inserted or refreshed."""

        def one(i: int, pos: np.ndarray) -> None:
            shard = self._shards[i]
            with shard.lock:
                arena = shard.arenas[aid] if aid < len(shard.arenas) else None
                if arena is None:
                    out[pos] = 0.0
                    return
                K.lookup_eval(
                    ids, pos, out, arena.data, np.int64(aid), shard.slots, shard.ent, shard.meta
                )

        self._run(one, self._split(ids))

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
        aid = self._arena_id(dim, create=False)
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
                        ids, pos, grads, arena.data, np.int64(aid), shard.slots, shard.ent, shard.meta, opt,
                        bound, applied,
                    )  # fmt: skip

            res = self._run(one, self._split(ids))
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

    # ----------------------------------------------------------------- bookkeeping
    def __len__(self) -> int:
        return sum(s.n for s in self._shards)

    def _reset_unlocked(self) -> None:
        for s in self._shards:
            s.reset()
        self._dims.clear()

    def clear(self) -> None:
        """Drop every entry (the optimizer, hyper-parameters and counters stay)."""
        with self._all_locks():
            self._reset_unlocked()

    def close(self) -> None:
        """Stop the shard thread pool (the store stays usable single-threaded)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
