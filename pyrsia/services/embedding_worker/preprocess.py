"""Id preprocessing of one batch: hash stack, feature prefix, dedup per dim, routing.

A batch's id-type features arrive in CSR form, one ``(name, ids, offsets)`` per
slot: sample ``i`` of that slot owns ``ids[offsets[i]:offsets[i + 1]]``. Per slot,
in PERSIA's order::

    ids ──hash stack (R rounds)──▶ R bucket ids per occurrence
        ──feature prefix──────────▶ id mod (2^(64-bits) - 1) + prefix(slot's group)
    all slots of one dim ──dedup──▶ unique ids of that dim ──farmhash mod N──▶ PS replica

``prepare_batch`` returns a ``PreparedBatch``: per dim group the unique ids,
ordered so each PS replica's ids are one contiguous slice (one request per
replica carries every dim group, and answers are concatenated back); per slot a
``SlotPlan`` telling pooling where each occurrence's vectors go. Raw (unsummed)
slots keep only the first ``sample_fixed_size`` ids of each sample: the others
would never reach the model, so they are not looked up (nor inserted in the PS).
Everything is vectorized or compiled; nothing loops over ids in Python.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pyrsia.services.embedding_worker import kernels
from pyrsia.shared.constants import MAX_MESSAGE_BYTES
from pyrsia.shared.errors import ConfigError, InvalidInputError
from pyrsia.shared.farmhash import farmhash64, replica_of
from pyrsia.shared.wire.batch import IDFeature

FEATURES_FIELD = "batch.id_type_features"


class _HashStack(Protocol):
    hash_stack_rounds: int
    embedding_size: int


class _Slot(Protocol):
    name: str
    dim: int
    embedding_summation: bool
    sqrt_scaling: bool
    sample_fixed_size: int
    hash_stack_config: _HashStack


class _Schema(Protocol):
    feature_index_prefix_bit: int

    @property
    def slot_names(self) -> Any: ...

    def slot(self, name: str) -> Any: ...

    def slot_prefixes(self) -> dict[str, int]: ...


def hash_stack(ids: np.ndarray, rounds: int, embedding_size: int) -> np.ndarray:
    """PERSIA's hash stack: (n, rounds) bucket ids, bucket r = h(r+1) mod E + r*E.

    h0 = id and h(r+1) = farmhash64(h(r)), so an id is spread over ``rounds``
    tables of ``embedding_size`` rows each, which bounds the table size of a slot
    with a huge id space.
    """
    if rounds < 1 or embedding_size < 1:
        raise ConfigError(
            "hash_stack_config: expected hash_stack_rounds >= 1 and embedding_size >= 1, "
            f"got {rounds} and {embedding_size}"
        )
    h = np.asarray(ids, dtype=np.uint64)
    size = np.uint64(embedding_size)
    out = np.empty((h.shape[0], rounds), dtype=np.uint64)
    for r in range(rounds):  # a loop over rounds, not ids
        h = farmhash64(h)
        out[:, r] = h % size + np.uint64(r * embedding_size)
    return out


def add_prefix(ids: np.ndarray, prefix: int, bits: int) -> np.ndarray:
    """id mod (2^(64-bits) - 1) + prefix: the slot's feature group goes into the top ``bits``."""
    spacing = np.uint64((1 << (64 - bits)) - 1)
    return np.asarray(ids, dtype=np.uint64) % spacing + np.uint64(prefix)


@dataclass(eq=False, slots=True)  # not frozen: a frozen init costs ~1 us per field, per slot
class SlotPlan:
    """Where one slot's looked-up vectors go in its output tensor.

    Sample ``i`` keeps occurrences ``offsets[i]:offsets[i+1]`` (all its ids for a
    summed slot, the first ``sample_fixed_size`` for a raw one); occurrence ``o``
    adds its ``rounds`` vectors ``vectors[inverse[o*rounds:(o+1)*rounds]]``
    (indices into its dim group's unique ids) to its output row, and the row is
    multiplied by ``scale[i]``. Summed slots give ``(batch_size, dim)``; raw slots
    ``(batch_size, sample_fixed_size, dim + 1)``, row ``(i, j)`` for the j-th kept
    id of sample i, last column 1 for a real id and 0 for padding.
    """

    name: str
    dim: int
    summation: bool
    sample_fixed_size: int
    batch_size: int
    rounds: int
    offsets: np.ndarray  # int64 (batch_size + 1,): kept occurrences per sample
    inverse: np.ndarray  # int64 (n_kept * rounds,)
    scale: np.ndarray  # float32 (batch_size,)

    @property
    def num_rows(self) -> int:
        return self.batch_size if self.summation else self.batch_size * self.sample_fixed_size

    @property
    def output_shape(self) -> tuple[int, ...]:
        if self.summation:
            return (self.batch_size, self.dim)
        return (self.batch_size, self.sample_fixed_size, self.dim + 1)

    def unique_count(self) -> int:
        """How many distinct (post-hash, post-prefix) ids this slot looked up (for metrics)."""
        if self.inverse.size == 0:
            return 0
        seen = np.zeros(int(self.inverse.max()) + 1, dtype=bool)
        seen[self.inverse] = True
        return int(np.count_nonzero(seen))


@dataclass(frozen=True, eq=False)
class DimGroup:
    """The unique ids of every slot of one dim, grouped by the PS replica that owns them.

    Replica k owns ``ids[replica_offsets[k]:replica_offsets[k+1]]``, so per-replica
    requests and answers are slices and concatenations, never gathers.
    """

    dim: int
    ids: np.ndarray  # uint64 (n_unique,)
    replica_offsets: np.ndarray  # int64 (replica_count + 1,)
    members: tuple[int, ...]
    """The positions in the batch of the group's slots, in order."""
    inverse: np.ndarray
    """int64: each lookup row of the members, in order, as its row in ``ids`` (their
    ``SlotPlan.inverse`` arrays are consecutive slices of it)."""

    def replica_slice(self, replica: int) -> slice:
        """The positions in ``ids`` (and in the group's vectors) owned by ``replica``."""
        return slice(int(self.replica_offsets[replica]), int(self.replica_offsets[replica + 1]))


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch's ids after preprocessing: what to look up where, and how to pool it."""

    batch_size: int
    replica_count: int
    slots: tuple[SlotPlan, ...]  # in the batch's feature order
    groups: dict[int, DimGroup]  # dim -> group, in order of first appearance

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    @property
    def num_unique_ids(self) -> int:
        return sum(g.ids.shape[0] for g in self.groups.values())


def prepare_batch(
    schema: _Schema, features: Sequence[IDFeature], replica_count: int
) -> PreparedBatch:
    """Preprocess a batch's id features (checked by ``IDPart.from_wire``) for lookup.

    A batch may carry any subset of the schema's slots; the output follows the batch's
    order. The one check left here needs the schema: every feature names a slot of
    ``slots_config`` (``InvalidInputError`` naming ``batch.id_type_features[i].name``).
    """
    _check_slots(schema, features)
    batch_size = features[0].batch_size if features else 0
    prefixes = schema.slot_prefixes()

    lookups: list[np.ndarray] = []
    partial: list[tuple[Any, int, np.ndarray, np.ndarray]] = []
    for feature in features:
        slot = schema.slot(feature.name)
        # contiguous for the compiled kernels (decoded wire arrays already are: no copy)
        kept = np.ascontiguousarray(feature.ids)
        kept_offsets = offsets = np.ascontiguousarray(feature.offsets)
        if not slot.embedding_summation:
            kept, kept_offsets = _truncate(kept, kept_offsets, int(slot.sample_fixed_size))
        rounds = int(slot.hash_stack_config.hash_stack_rounds)
        if rounds > 0:
            size = int(slot.hash_stack_config.embedding_size)
            kept = hash_stack(kept, rounds, size).reshape(-1)
        lookups.append(kept)
        scale = _scale(slot, offsets, rounds, batch_size)
        partial.append((slot, max(rounds, 1), kept_offsets, scale))

    groups, inverses = _dedup_and_route(
        [int(p[0].dim) for p in partial],
        lookups,
        [prefixes[f.name] for f in features],
        int(schema.feature_index_prefix_bit),
        int(replica_count),
    )
    plans = tuple(
        SlotPlan(
            name=slot.name,
            dim=int(slot.dim),
            summation=bool(slot.embedding_summation),
            sample_fixed_size=int(slot.sample_fixed_size),
            batch_size=batch_size,
            rounds=rounds,
            offsets=kept_offsets,
            inverse=inverse,
            scale=scale,
        )
        for (slot, rounds, kept_offsets, scale), inverse in zip(partial, inverses, strict=True)
    )
    answer_bytes = sum(4 * math.prod(p.output_shape) for p in plans)
    if answer_bytes > MAX_MESSAGE_BYTES:  # raw slots multiply the ids: refuse before pooling
        raise InvalidInputError(
            "batch", f"a batch whose embeddings fit in {MAX_MESSAGE_BYTES} bytes",
            f"{answer_bytes} bytes",
        )  # fmt: skip
    return PreparedBatch(batch_size, int(replica_count), plans, groups)


def _check_slots(schema: _Schema, features: Sequence[IDFeature]) -> None:
    known = set(schema.slot_names)
    for i, feature in enumerate(features):
        if feature.name not in known:
            raise InvalidInputError(
                f"{FEATURES_FIELD}[{i}].name", "a slot name from slots_config", feature.name
            )


def _truncate(ids: np.ndarray, offsets: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``size`` ids of each sample, and their offsets (a raw slot's kept ids)."""
    counts = offsets[1:] - offsets[:-1]
    if counts.shape[0] == 0 or int(counts.max()) <= size:
        return ids, offsets
    kept_offsets = np.zeros_like(offsets)
    np.cumsum(np.minimum(counts, size), out=kept_offsets[1:])
    col = np.arange(ids.shape[0], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return ids[col < size], kept_offsets


@functools.lru_cache(maxsize=64)
def _ones(batch_size: int) -> np.ndarray:
    """A read-only float32 vector of ones (the scale of a slot without sqrt scaling), shared."""
    ones = np.ones(batch_size, dtype=np.float32)
    ones.setflags(write=False)
    return ones


def _scale(slot: Any, offsets: np.ndarray, rounds: int, batch_size: int) -> np.ndarray:
    """Per sample factor: 1/sqrt(ids in the sample, hash-stack buckets counted), as PERSIA does."""
    if slot.embedding_summation:
        if not slot.sqrt_scaling:
            return _ones(batch_size)
        counts = (offsets[1:] - offsets[:-1]) * max(rounds, 1)
        return (1.0 / np.sqrt(np.maximum(counts, 1))).astype(np.float32)
    # PERSIA scales raw rows by 1/sqrt(R) when sqrt scaling meets a hash stack.
    factor = 1.0 / np.sqrt(rounds) if slot.sqrt_scaling and rounds > 1 else 1.0
    return np.full(batch_size, factor, dtype=np.float32)


_UNIQUE_IDS_LAST: dict[int, int] = {}
"""Unique ids of the last batch prepared in this process, per dim: a guess of the next's."""


def _dedup(
    ids: np.ndarray, starts: np.ndarray, prefixes: np.ndarray, spacing: np.uint64,
    unique: np.ndarray, inverse: np.ndarray, dim: int,
) -> int:  # fmt: skip
    """``kernels.dedup_prefixed`` with a table that takes twice the unique ids of this
    dim's last batch (plus 16) before it is full; a batch holding more is deduped again
    with a table for all its ids."""
    expected = 2 * _UNIQUE_IDS_LAST.get(dim, 0) + 16
    n_unique = kernels.dedup_prefixed(ids, starts, prefixes, spacing, unique, inverse, expected)
    if n_unique < 0:
        n_unique = kernels.dedup_prefixed(
            ids, starts, prefixes, spacing, unique, inverse, ids.shape[0]
        )
    _UNIQUE_IDS_LAST[dim] = n_unique
    return n_unique


def _dedup_and_route(
    dims: list[int],
    lookups: list[np.ndarray],
    prefixes: list[int],
    bits: int,
    replica_count: int,
) -> tuple[dict[int, DimGroup], list[np.ndarray]]:
    """Prefix and dedup the ids of all slots of one dim together; group them by PS replica."""
    members: dict[int, list[int]] = {}
    for i, dim in enumerate(dims):
        members.setdefault(dim, []).append(i)
    spacing = np.uint64((1 << (64 - bits)) - 1)
    groups: dict[int, DimGroup] = {}
    inverses: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(dims)
    for dim, idx in members.items():
        ids = lookups[idx[0]] if len(idx) == 1 else np.concatenate([lookups[i] for i in idx])
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        starts = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum([lookups[i].shape[0] for i in idx], out=starts[1:])
        slot_prefixes = np.array([prefixes[i] for i in idx], dtype=np.uint64)
        unique = np.empty(ids.shape[0], dtype=np.uint64)
        inverse = np.empty(ids.shape[0], dtype=np.int64)
        n_unique = _dedup(ids, starts, slot_prefixes, spacing, unique, inverse, dim)
        if replica_count == 1:  # one replica owns every id: nothing to hash or reorder
            by_replica = unique[:n_unique].copy()  # a copy: the buffer is sized for all ids
            offsets = np.array([0, n_unique], dtype=np.int64)
        else:
            unique = unique[:n_unique]
            by_replica = np.empty(n_unique, dtype=np.uint64)
            offsets = np.empty(replica_count + 1, dtype=np.int64)
            replica = replica_of(unique, replica_count)
            kernels.group_by_replica(unique, replica, replica_count, inverse, by_replica, offsets)
        groups[dim] = DimGroup(dim, by_replica, offsets, tuple(idx), inverse)
        bounds = starts.tolist()
        for n, i in enumerate(idx):
            inverses[i] = inverse[bounds[n] : bounds[n + 1]]
    return groups, inverses
