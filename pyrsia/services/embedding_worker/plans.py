"""What preprocessing makes of a batch's ids: the plans that lookups, pooling and gradients follow.

``preprocess.prepare_batch`` returns a :class:`PreparedBatch`: per dim group a
:class:`DimGroup` (the unique ids, ordered by PS replica, and each lookup row's place among
them), per slot a :class:`SlotPlan` (where each occurrence's vectors go in the slot's output),
and the batch's :class:`BatchLayout`: what its list of slot names implies under the schema,
worked out once per list (:func:`batch_layout`) since a data loader sends the same slots
batch after batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pyrsia.shared.constants import MAX_CACHED_LAYOUTS as _MAX_LAYOUTS
from pyrsia.shared.constants import MAX_CACHED_SCHEMAS as _MAX_SCHEMAS
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.wire.batch import single_id_offsets

FEATURES_FIELD = "batch.id_type_features"


class SchemaView(Protocol):
    """What preprocessing reads of an ``EmbeddingSchema``."""

    feature_index_prefix_bit: int

    @property
    def slot_names(self) -> Any: ...

    def slot(self, name: str) -> Any: ...

    def slot_prefixes(self) -> dict[str, int]: ...


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
class BatchLayout:
    """What a batch's list of slot names decides under one schema: each slot's config, and
    the slots and index prefixes of each dim group.

    A data loader sends the same slots batch after batch, so :func:`batch_layout` works this
    out once per list of names and schema instead of once per slot and batch.
    """

    names: tuple[str, ...]
    configs: tuple[Any, ...]
    """Each slot's config (``slots_config``), in the batch's order."""
    members: dict[int, tuple[int, ...]]
    """dim -> the positions of its slots, dims in order of first appearance."""
    prefixes: dict[int, np.ndarray]
    """dim -> the uint64 index prefix of each of its slots, in ``members`` order."""
    spacing: np.uint64
    """``2^(64 - feature_index_prefix_bit) - 1``: ids are taken modulo it before the prefix."""
    plain: bool
    """Every slot is summed and has no hash stack: in a batch of one id per sample in every
    slot, each slot's output is a plain gather of its dim group's vectors (``gathering.py``)."""
    width: int
    """The sum of the slots' dims: a plain batch's answer holds ``4 * width`` bytes per sample."""

    def single_id_plans(self, batch_size: int, groups: dict[int, DimGroup]) -> tuple[SlotPlan, ...]:
        """The plans of a plain batch of one id per sample: the k-th slot of a dim group owns
        rows ``k * batch_size`` to ``(k + 1) * batch_size`` of the group's ``inverse``."""
        offsets, scale = single_id_offsets(batch_size), shared_ones(batch_size)
        plans: list[Any] = [None] * len(self.names)
        for dim, positions in self.members.items():
            inverse = groups[dim].inverse
            for k, position in enumerate(positions):
                config = self.configs[position]
                plans[position] = SlotPlan(
                    config.name,
                    dim,
                    True,
                    int(config.sample_fixed_size),
                    batch_size,
                    1,
                    offsets,
                    inverse[k * batch_size : (k + 1) * batch_size],
                    scale,
                )
        return tuple(plans)


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch's ids after preprocessing: what to look up where, and how to pool it."""

    batch_size: int
    replica_count: int
    layout: BatchLayout
    groups: dict[int, DimGroup]  # dim -> group, in order of first appearance
    plans: tuple[SlotPlan, ...] | None = None
    """Each slot's plan, in the batch's feature order; None for a batch of :attr:`single_ids`,
    whose plans are made from its groups when :attr:`slots` is first read."""

    @functools.cached_property
    def slots(self) -> tuple[SlotPlan, ...]:
        """Each slot's plan, in the batch's feature order."""
        if self.plans is not None:
            return self.plans
        return self.layout.single_id_plans(self.batch_size, self.groups)

    @property
    def single_ids(self) -> bool:
        """Whether every slot is plain (``BatchLayout.plain``) with one id per sample: the
        k-th slot of a dim group owns the k-th ``batch_size`` rows of the group's ``inverse``,
        and the batch's lookup and gradients need no per-slot plan."""
        return self.plans is None

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self.layout.names

    @property
    def num_unique_ids(self) -> int:
        return sum(g.ids.shape[0] for g in self.groups.values())


_LAYOUTS: dict[int, tuple[Any, dict[tuple[str, ...], BatchLayout]]] = {}
"""id(schema) -> (schema, its layouts by list of names); the entry holds the schema, so its id
is not reused while the entry lives."""


def batch_layout(schema: SchemaView, names: tuple[str, ...]) -> BatchLayout:
    """The layout of a batch of the slots ``names`` (in this order) under ``schema``; an
    ``InvalidInputError`` naming ``batch.id_type_features[i].name`` for a name that
    ``slots_config`` does not define."""
    entry = _LAYOUTS.get(id(schema))
    if entry is None or entry[0] is not schema:
        if len(_LAYOUTS) >= _MAX_SCHEMAS:
            _LAYOUTS.clear()
        entry = _LAYOUTS[id(schema)] = (schema, {})
    layouts = entry[1]
    layout = layouts.get(names)
    if layout is None:
        layout = _make_layout(schema, names)  # raises before anything is kept
        if len(layouts) >= _MAX_LAYOUTS:
            layouts.clear()
        layouts[names] = layout
    return layout


def _make_layout(schema: SchemaView, names: tuple[str, ...]) -> BatchLayout:
    known = set(schema.slot_names)
    for i, name in enumerate(names):
        if name not in known:
            raise InvalidInputError(
                f"{FEATURES_FIELD}[{i}].name",
                "a slot name from slots_config",
                name,
                message=f"{FEATURES_FIELD}[{i}].name: slot {name!r} is not in embedding_config's "
                f"slots_config ({', '.join(sorted(known))}): add it there, or leave it out of "
                "the batch",
            )
    configs = tuple(schema.slot(name) for name in names)
    prefix_of = schema.slot_prefixes()
    members: dict[int, list[int]] = {}
    for i, config in enumerate(configs):
        members.setdefault(int(config.dim), []).append(i)
    bits = int(schema.feature_index_prefix_bit)
    return BatchLayout(
        names=names,
        configs=configs,
        members={dim: tuple(idx) for dim, idx in members.items()},
        prefixes={
            dim: np.array([prefix_of[names[i]] for i in idx], dtype=np.uint64)
            for dim, idx in members.items()
        },
        spacing=np.uint64((1 << (64 - bits)) - 1),
        plain=all(
            c.embedding_summation and int(c.hash_stack_config.hash_stack_rounds) <= 1
            for c in configs
        ),
        width=sum(int(c.dim) for c in configs),
    )


@functools.lru_cache(maxsize=64)
def shared_ones(batch_size: int) -> np.ndarray:
    """A read-only float32 vector of ones (the scale of a slot without sqrt scaling), shared."""
    ones = np.ones(batch_size, dtype=np.float32)
    ones.setflags(write=False)
    return ones
