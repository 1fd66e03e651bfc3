"""Gathered answers (``pyrsia.shared.wire.gathered``): which slots of a batch are plain gathers, their
tables forward, and the tables' gradients backward.

A summed slot with exactly one id per sample and no hash stack pools to ``vectors[inverse]``
(the row scale is 1 even with sqrt scaling), so its answer can be the dim group's unique
vectors plus ``inverse`` itself. Backward, the NN worker has already summed each unique
vector's gradient over every gathered slot and sample that used it: the worker only divides
by the loss scale and adds it to the pooled slots' per-id gradients.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pyrsia.services.embedding_worker import kernels
from pyrsia.services.embedding_worker.plans import BatchLayout, PreparedBatch, SlotPlan
from pyrsia.services.embedding_worker.pooling import check_slot_gradients, pool_forward
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.wire.batch import single_id_offsets
from pyrsia.shared.wire.gathered import EmbeddingTable, SlotEmbeddings


@dataclass(frozen=True, eq=False)
class GatherPlan:
    """The gathered slots of one batch, per dim group (positions in the batch's slots).

    The plan of a batch of ``PreparedBatch.single_ids`` is made once per ``BatchLayout`` and
    shared by every batch of that layout, with what its answers and gradients derive from
    it (the properties below, each worked out on first use).
    """

    groups: tuple[tuple[int, tuple[int, ...]], ...]  # (dim, slot positions), answer order
    names: tuple[str, ...]
    """The batch's slot names, in order (``PreparedBatch.slot_names``)."""

    @functools.cached_property
    def positions(self) -> frozenset[int]:
        return frozenset(p for _, slots in self.groups for p in slots)

    @functools.cached_property
    def table_slots(self) -> tuple[tuple[str, ...], ...]:
        """Each table's slot names, in its index's row order."""
        return tuple(tuple(self.names[p] for p in slots) for _, slots in self.groups)

    @functools.cached_property
    def gathered_names(self) -> frozenset[str]:
        return frozenset(name for slots in self.table_slots for name in slots)

    @functools.cached_property
    def where(self) -> dict[int, tuple[int, int]]:
        """Position of a gathered slot -> (its table, its row of the table's index)."""
        return {p: (t, k) for t, (_, slots) in enumerate(self.groups) for k, p in enumerate(slots)}

    @functools.cached_property
    def entries(self) -> tuple[tuple[str, tuple[int, int]], ...] | None:
        """A ``SlotEmbeddings``' entries when every slot is gathered (they are the same for
        every batch of the plan); None when some slot is pooled."""
        if len(self.positions) != len(self.names):
            return None
        return tuple((name, self.where[i]) for i, name in enumerate(self.names))


def no_gather(prepared: PreparedBatch) -> GatherPlan:
    """The plan of an answer with every slot pooled."""
    return GatherPlan((), prepared.slot_names)


@dataclass(frozen=True)
class Awaited:
    """A batch answered for training, kept for its gradients, and how its answer was laid out."""

    prepared: PreparedBatch
    gather: GatherPlan


def is_gather(plan: SlotPlan) -> bool:
    """Whether the slot's pooled tensor is ``vectors[inverse]`` (one id per sample, summed)."""
    return (
        plan.summation
        and plan.rounds == 1
        and plan.batch_size > 0
        and plan.inverse.shape[0] == plan.batch_size
        and (
            plan.offsets is single_id_offsets(plan.batch_size)  # sent without offsets
            or np.array_equal(plan.offsets, single_id_offsets(plan.batch_size))
        )
    )


_LAYOUT_PLANS: weakref.WeakKeyDictionary[BatchLayout, GatherPlan] = weakref.WeakKeyDictionary()
"""The plan of the single-id batches of each layout (every slot gathered)."""


def gather_plan(prepared: PreparedBatch) -> GatherPlan:
    """Every gather slot of the batch, grouped by dim in the batch's group order."""
    if prepared.single_ids:  # every slot is a gather: one plan per layout
        layout = prepared.layout
        plan = _LAYOUT_PLANS.get(layout)
        if plan is None:
            groups = tuple((dim, positions) for dim, positions in layout.members.items())
            plan = _LAYOUT_PLANS[layout] = GatherPlan(groups, layout.names)
        return plan
    members: dict[int, list[int]] = {}
    for position, plan in enumerate(prepared.slots):
        if is_gather(plan):
            members.setdefault(plan.dim, []).append(position)
    order = [dim for dim in prepared.groups if dim in members]
    return GatherPlan(tuple((dim, tuple(members[dim])) for dim in order), prepared.slot_names)


def gather_forward(
    prepared: PreparedBatch, plan: GatherPlan, vectors_by_dim: dict[int, np.ndarray]
) -> tuple[EmbeddingTable, ...]:
    """One table per gathered dim group: the group's unique vectors and each slot's rows."""
    tables = []
    for (dim, positions), names in zip(plan.groups, plan.table_slots, strict=True):
        group = prepared.groups[dim]
        if positions == group.members:
            # every slot of the dim is gathered: their rows, in order, are the group's (one
            # conversion instead of one per slot: Census-Income's 33 slots)
            index = group.inverse.reshape(len(positions), prepared.batch_size).astype(np.int32)
        else:
            index = np.empty((len(positions), prepared.batch_size), dtype=np.int32)
            for k, position in enumerate(positions):  # a loop over slots, not ids
                index[k] = prepared.slots[position].inverse
        tables.append(EmbeddingTable(dim, vectors_by_dim[dim], index, names))
    return tuple(tables)


def answer_embeddings(
    prepared: PreparedBatch, vectors_by_dim: dict[int, np.ndarray], gathered: bool
) -> tuple[tuple[tuple[str, np.ndarray], ...] | SlotEmbeddings, GatherPlan]:
    """A lookup's answer: one pooled tensor per slot, or with ``gathered`` a ``SlotEmbeddings``
    whose gather slots come as tables; and the plan its gradients will follow."""
    plan = gather_plan(prepared) if gathered else no_gather(prepared)
    if not plan.groups:
        pooled = pool_forward(prepared, vectors_by_dim)
        return tuple(zip(prepared.slot_names, pooled, strict=True)), plan  # type: ignore[arg-type]
    tables = gather_forward(prepared, plan, vectors_by_dim)
    entries = plan.entries
    if entries is None:  # some slots pooled
        pooled = pool_forward(prepared, vectors_by_dim, plan.positions)
        where = plan.where
        entries = tuple(
            (name, where[i] if t is None else t)
            for i, (name, t) in enumerate(zip(plan.names, pooled, strict=True))
        )
    return SlotEmbeddings(entries, tables), plan


def check_gradients(
    awaited: Awaited,
    batch_id: int,
    by_name: dict[str, np.ndarray],
    tables: Sequence[tuple[int, np.ndarray]] | None,
    skipped: Sequence[str],
) -> None:
    """Everything ``/gradients`` checks before the batch leaves the awaiting buffer: pooled
    slots' gradients by name and shape, and the tables of the gathered ones."""
    prepared, plan = awaited.prepared, awaited.gather
    gathered = plan.gathered_names
    if by_name:  # a fully gathered answer has no pooled slot to check
        pooled_names = [n for n in prepared.slot_names if n not in gathered]
        unknown = set(by_name) - set(pooled_names)
        if unknown:
            raise InvalidInputError(
                "gradients", f"pooled slots of batch {batch_id}: {pooled_names}", sorted(unknown)
            )
        check_slot_gradients(prepared, by_name)
    _check_gradient_tables(prepared, plan, gathered, tables, skipped)


def _check_gradient_tables(
    prepared: PreparedBatch,
    plan: GatherPlan,
    gathered: frozenset[str],
    tables: Sequence[tuple[int, np.ndarray]] | None,
    skipped: Sequence[str],
) -> None:
    """Raise ``InvalidInputError`` unless ``tables`` and ``skipped`` fit the gathered answer."""
    for i, name in enumerate(skipped):
        if name not in gathered:
            raise InvalidInputError(
                f"skipped_slots[{i}]", f"a gathered slot of this batch: {sorted(gathered)}", name
            )
    if tables is None:
        return
    if len(tables) != len(plan.groups):
        raise InvalidInputError(
            "tables", f"{len(plan.groups)} tables (one per table of the answer)", len(tables)
        )
    for t, ((dim, grad), (want_dim, _)) in enumerate(zip(tables, plan.groups, strict=True)):
        rows = prepared.groups[want_dim].ids.shape[0]
        if dim != want_dim or grad.shape != (rows, want_dim):
            raise InvalidInputError(
                f"tables[{t}]",
                f"dim {want_dim}, data shape ({rows}, {want_dim})",
                f"dim {dim}, shape {grad.shape}",
            )


def gather_backward(
    prepared: PreparedBatch,
    plan: GatherPlan,
    tables: Sequence[tuple[int, np.ndarray]] | None,
    skipped: Sequence[str],
    loss_scale: float,
    grads: dict[int, np.ndarray],
) -> tuple[list[str], list[str]]:
    """Add the tables' gradients (divided by ``loss_scale``) to ``grads`` in place.

    Returns the gathered slots that contributed nothing: those the NN worker skipped (or all,
    when it sent no tables), and those of a table holding a NaN or inf, which are also
    returned second (counted as non-finite).
    """
    skipped_all = list(skipped)
    nonfinite: list[str] = []
    for t, ((dim, _), names) in enumerate(zip(plan.groups, plan.table_slots, strict=True)):
        if tables is None:
            skipped_all += [n for n in names if n not in skipped]
            continue
        rows = np.ascontiguousarray(tables[t][1], dtype=np.float32)
        if not kernels.all_finite(rows, dim):
            bad = [n for n in names if n not in skipped]
            nonfinite += bad
            skipped_all += bad
            continue
        grads[dim] += rows * np.float32(1.0 / loss_scale)
    return skipped_all, nonfinite
