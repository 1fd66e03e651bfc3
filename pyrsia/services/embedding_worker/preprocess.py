"""Id preprocessing of one batch: hash stack, feature prefix, dedup per dim, routing.

A batch's id-type features arrive in CSR form, one ``(name, ids, offsets)`` per
slot: sample ``i`` of that slot owns ``ids[offsets[i]:offsets[i + 1]]``. Per slot,
in PERSIA's order::

    ids ──hash stack (R rounds)──▶ R bucket ids per occurrence
        ──feature prefix──────────▶ id mod (2^(64-bits) - 1) + prefix(slot's group)
    all slots of one dim ──dedup──▶ unique ids of that dim ──farmhash mod N──▶ PS replica

``prepare_batch`` returns a ``PreparedBatch`` (``plans.py``): per dim group the unique ids,
ordered so each PS replica's ids are one contiguous slice (one request per
replica carries every dim group, and answers are concatenated back); per slot a
``SlotPlan`` telling pooling where each occurrence's vectors go. Raw (unsummed)
slots keep only the first ``sample_fixed_size`` ids of each sample: the others
would never reach the model, so they are not looked up (nor inserted in the PS).
Everything is vectorized or compiled; nothing loops over ids in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pyrsia.services.embedding_worker import kernels
from pyrsia.services.embedding_worker.plans import (
    BatchLayout,
    DimGroup,
    PreparedBatch,
    SchemaView,
    SlotPlan,
    batch_layout,
    shared_ones,
)
from pyrsia.shared.constants import MAX_MESSAGE_BYTES
from pyrsia.shared.errors import ConfigError, InvalidInputError
from pyrsia.shared.farmhash import farmhash64, replica_of
from pyrsia.shared.wire.batch import single_id_offsets


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


class IDColumns(Protocol):
    """One id-type feature as preprocessing reads it: ``pyrsia.shared.wire.batch.IDFeature``,
    or the features of a ``persia.embedding.data.PersiaBatch`` (checked when it was built)."""

    name: str
    ids: np.ndarray  # uint64 (n,)
    offsets: np.ndarray  # int64 (batch_size + 1,)

    @property
    def batch_size(self) -> int: ...


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


def prepare_batch(
    schema: SchemaView, features: Sequence[IDColumns], replica_count: int
) -> PreparedBatch:
    """Preprocess a batch's id features (checked by ``IDPart.from_wire``) for lookup.

    A batch may carry any subset of the schema's slots; the output follows the batch's
    order. The one check left here needs the schema: every feature names a slot of
    ``slots_config`` (``InvalidInputError`` naming ``batch.id_type_features[i].name``).
    """
    layout = batch_layout(schema, tuple([f.name for f in features]))
    batch_size = features[0].batch_size if features else 0
    replica_count = int(replica_count)
    if features and layout.plain:
        single = single_id_offsets(batch_size)
        if all(f.offsets is single for f in features):
            return _prepare_single_ids(layout, features, batch_size, replica_count)

    lookups: list[np.ndarray] = []
    partial: list[tuple[Any, int, np.ndarray, np.ndarray]] = []
    for feature, slot in zip(features, layout.configs, strict=True):
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

    groups: dict[int, DimGroup] = {}
    inverses: list[np.ndarray] = [_NO_ROWS] * len(features)
    for dim, idx in layout.members.items():
        group, starts = _dedup_group(layout, dim, [lookups[i] for i in idx], replica_count)
        groups[dim] = group
        for n, i in enumerate(idx):
            inverses[i] = group.inverse[starts[n] : starts[n + 1]]
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
    _check_answer_bytes(sum(4 * math.prod(p.output_shape) for p in plans))
    return PreparedBatch(batch_size, replica_count, layout, groups, plans)


def _prepare_single_ids(
    layout: BatchLayout, features: Sequence[IDColumns], batch_size: int, replica_count: int
) -> PreparedBatch:
    """:func:`prepare_batch` of a plain batch of one id per sample: per dim group one
    concatenation and one dedup, nothing per slot."""
    _check_answer_bytes(4 * batch_size * layout.width)
    groups = {
        dim: _dedup_group(layout, dim, [features[i].ids for i in idx], replica_count)[0]
        for dim, idx in layout.members.items()
    }
    return PreparedBatch(batch_size, replica_count, layout, groups)


def _check_answer_bytes(answer_bytes: int) -> None:
    """Raw slots multiply the ids: a batch whose answer could not be sent is refused before
    anything is looked up."""
    if answer_bytes > MAX_MESSAGE_BYTES:
        raise InvalidInputError(
            "batch",
            f"a batch whose embeddings fit in {MAX_MESSAGE_BYTES} bytes",
            f"{answer_bytes} bytes",
        )


_NO_ROWS = np.empty(0, dtype=np.int64)


def _truncate(ids: np.ndarray, offsets: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``size`` ids of each sample, and their offsets (a raw slot's kept ids)."""
    counts = offsets[1:] - offsets[:-1]
    if counts.shape[0] == 0 or int(counts.max()) <= size:
        return ids, offsets
    kept_offsets = np.zeros_like(offsets)
    np.cumsum(np.minimum(counts, size), out=kept_offsets[1:])
    col = np.arange(ids.shape[0], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return ids[col < size], kept_offsets


def _scale(slot: Any, offsets: np.ndarray, rounds: int, batch_size: int) -> np.ndarray:
    """Per sample factor: 1/sqrt(ids in the sample, hash-stack buckets counted), as PERSIA does."""
    if slot.embedding_summation:
        if not slot.sqrt_scaling:
            return shared_ones(batch_size)
        counts = (offsets[1:] - offsets[:-1]) * max(rounds, 1)
        return (1.0 / np.sqrt(np.maximum(counts, 1))).astype(np.float32)
    # PERSIA scales raw rows by 1/sqrt(R) when sqrt scaling meets a hash stack.
    factor = 1.0 / np.sqrt(rounds) if slot.sqrt_scaling and rounds > 1 else 1.0
    return np.full(batch_size, factor, dtype=np.float32)


_UNIQUE_IDS_LAST: dict[int, int] = {}
"""Unique ids of the last batch prepared in this process, per dim: a guess of the next's."""


def _dedup(
    ids: np.ndarray,
    starts: np.ndarray,
    prefixes: np.ndarray,
    spacing: np.uint64,
    unique: np.ndarray,
    inverse: np.ndarray,
    dim: int,
) -> int:
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


def _dedup_group(
    layout: BatchLayout, dim: int, lookups: list[np.ndarray], replica_count: int
) -> tuple[DimGroup, list[int]]:
    """Prefix and dedup the ids of the slots of one dim together, grouped by PS replica; and
    where each slot's rows start in the group's ``inverse`` (and end: one more entry)."""
    ids = lookups[0] if len(lookups) == 1 else np.concatenate(lookups)
    ids = np.ascontiguousarray(ids, dtype=np.uint64)
    starts = np.zeros(len(lookups) + 1, dtype=np.int64)
    np.cumsum([part.shape[0] for part in lookups], out=starts[1:])
    unique = np.empty(ids.shape[0], dtype=np.uint64)
    inverse = np.empty(ids.shape[0], dtype=np.int64)
    n_unique = _dedup(ids, starts, layout.prefixes[dim], layout.spacing, unique, inverse, dim)
    if replica_count == 1:  # one replica owns every id: nothing to hash or reorder
        by_replica = unique[:n_unique].copy()  # a copy: the buffer is sized for all ids
        offsets = np.array([0, n_unique], dtype=np.int64)
    else:
        unique = unique[:n_unique]
        by_replica = np.empty(n_unique, dtype=np.uint64)
        offsets = np.empty(replica_count + 1, dtype=np.int64)
        replica = replica_of(unique, replica_count)
        kernels.group_by_replica(unique, replica, replica_count, inverse, by_replica, offsets)
    group = DimGroup(dim, by_replica, offsets, layout.members[dim], inverse)
    return group, starts.tolist()
