"""Between a ``PersiaTrainingBatch`` (numpy, read-only) and torch tensors, both ways, off the
training thread.

Forward: :func:`build_tensors` copies every array (decoded wire arrays are read-only views of
the message, so torch cannot share them) into a CPU tensor of the same dtype and shape;
embedding tensors require grad when training. A gathered answer's tables
(``pyrsia.shared.wire.gathered``) become their slots' tensors by one gather per table into
a ``(batch, slots, dim)`` block (``slot_tensors``: each slot gets its ``.grad`` as a leaf
does, without the copy a leaf makes of it, and the model gets aliases that ``torch.cat``
joins as the block's columns); other slots are leaves. The data loader runs it on the runtime's
event-loop thread right after the lookup decoded the answer, so the training thread only
takes the finished tensors (:func:`place` moves them to the context's CUDA device; on the
CPU it is a no-op). Backward: :func:`gradient_arrays` turns
each embedding tensor's gradient into a float32 array of the embedding's layout (a zero-copy
view for float32 CPU gradients; the worker ignores the mask column of raw slots); the
gradient sender calls it on the event loop, after the training thread has moved on; with
tables, :func:`gradient_payload` also sums the gathered slots' gradients per unique vector
(a compiled scatter-add that releases the GIL and reads the gradients where autograd left
them, ``pyrsia.shared.scatter``), so what goes back is one row per distinct id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from pyrsia.services.nn_worker.slot_tensors import SlotBlock, model_slots, slot_gradient, slot_rows
from pyrsia.shared.scatter import add_blocks_if_finite, add_rows_if_finite, blocks_finite
from pyrsia.shared.wire.gathered import EmbeddingTable, SlotEmbeddings

log = logging.getLogger(__name__)


@dataclass
class BatchTensors:
    """The tensors of one batch, as ``ctx.prepare_features`` hands them to the model."""

    non_id: list[torch.Tensor]
    labels: list[torch.Tensor] | None
    """None for inference (``PreprocessMode.INFERENCE`` hands out no labels)."""
    embeddings: list[tuple[str, torch.Tensor]]
    requires_grad: bool
    """Whether the embedding tensors require grad (training)."""
    model_embeddings: list[torch.Tensor] | None = None
    """The embedding tensors as the model gets them, where they are not ``embeddings``' own:
    a gathered block's slots as ``slot_tensors.SlotTensor`` aliases, which ``torch.cat``
    joins as the block's columns. None: ``embeddings``' tensors."""

    def model_tensors(self) -> list[torch.Tensor]:
        """The embedding tensors, in slot order, as the model gets them."""
        if self.model_embeddings is not None:
            return self.model_embeddings
        return [t for _, t in self.embeddings]


def to_tensor(
    array: np.ndarray, device_id: int | None, *, requires_grad: bool = False
) -> torch.Tensor:
    """A tensor owning a copy of ``array`` (same dtype and shape), on CUDA device ``device_id``."""
    tensor = _cpu_copy(array, pin=False)
    if device_id is not None:
        tensor = tensor.cuda(device_id, non_blocking=True)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _cpu_copy(array: np.ndarray, *, pin: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.array(array, copy=True, order="C"))
    return tensor.pin_memory() if pin else tensor


def _float32(array: np.ndarray) -> np.ndarray:
    return array if array.dtype == np.float32 else array.astype(np.float32)


def build_tensors(
    non_id: list[np.ndarray],
    labels: list[np.ndarray],
    embeddings: Sequence[tuple[str, np.ndarray]],
    *,
    requires_grad: bool,
    cuda: bool = False,
) -> BatchTensors:
    """CPU tensors of a batch's arrays (one copy each); call it off the training thread.

    With ``cuda`` the copies go to pinned memory, so :func:`place` copies them to the
    device asynchronously, and the embedding leaves are made there (a leaf must live on
    the device its gradient is computed on).
    """
    leaves = requires_grad and not cuda
    model = None
    if isinstance(embeddings, SlotEmbeddings) and embeddings.tables:
        slots, model = _gathered_tensors(embeddings, leaves=leaves, pin=cuda)
    else:
        slots = [
            (name, _cpu_copy(_float32(a), pin=cuda).requires_grad_(leaves))
            for name, a in embeddings
        ]
    return BatchTensors(
        non_id=[_cpu_copy(a, pin=cuda) for a in non_id],
        labels=[_cpu_copy(a, pin=cuda) for a in labels],
        embeddings=slots,
        requires_grad=requires_grad,
        model_embeddings=model,
    )


def _gathered_tensors(
    embeddings: SlotEmbeddings, *, leaves: bool, pin: bool
) -> tuple[list[tuple[str, torch.Tensor]], list[torch.Tensor] | None]:
    """Slot tensors of a gathered answer: pooled slots copied, each table gathered in one op
    into a block whose slots are the slots' (leaf) tensors; then the model's tensors (None
    when they are those)."""
    table = embeddings.single_table
    if table is not None:  # every slot, in order (one dim: Census-Income, Criteo)
        rows, model = _table_tensors(table, leaves=leaves, pin=pin)
        return list(zip(table.slots, rows, strict=True)), model
    out: list = [None] * len(embeddings)
    for_model: list = [None] * len(embeddings)
    for position, name, data in embeddings.pooled:
        out[position] = (name, _cpu_copy(_float32(data), pin=pin).requires_grad_(leaves))
        for_model[position] = out[position][1]
    where = {name: i for i, name in enumerate(embeddings.names)}
    for table in embeddings.tables:
        rows, model = _table_tensors(table, leaves=leaves, pin=pin)
        for k, (name, tensor) in enumerate(zip(table.slots, rows, strict=True)):
            out[where[name]] = (name, tensor)
            for_model[where[name]] = tensor if model is None else model[k]
    return out, None if pin else for_model


def _table_tensors(
    table: EmbeddingTable, *, leaves: bool, pin: bool
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor] | None]:
    """A table's slot tensors, gathered in one op, and the model's (None: the same).

    On the CPU the block is ``(batch, slots, dim)``: a sample's slots side by side, as the
    model joins them (``slot_tensors``); for a CUDA device ``(slots, batch, dim)``, each
    slot one contiguous run for its copy to the device.
    """
    # np.take reads the read-only wire arrays in place and writes a fresh array: half the CPU
    # of copying both for torch's index_select, which copies row by row
    slots, dim = len(table.slots), table.dim
    gathered = table.block  # embedded mode's engines gathered them already, sample-major
    if pin:
        if gathered is None:
            gathered = np.take(table.data, np.asarray(table.index).reshape(-1), axis=0)
        else:
            gathered = np.ascontiguousarray(gathered.transpose(1, 0, 2))
        return torch.from_numpy(gathered.reshape(slots, -1, dim)).pin_memory().unbind(0), None
    if gathered is None:
        gathered = np.take(table.data, np.asarray(table.index).T.reshape(-1), axis=0)
    block = torch.from_numpy(gathered.reshape(-1, slots, dim))
    rows = slot_rows(block) if leaves else block.unbind(1)
    return rows, model_slots(SlotBlock(block, rows if leaves else None), rows)


def place(tensors: BatchTensors, device_id: int | None) -> BatchTensors:
    """``tensors`` on CUDA device ``device_id`` (non-blocking copies); as they are for the CPU."""
    if device_id is None:
        return tensors

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.cuda(device_id, non_blocking=True)

    return BatchTensors(
        non_id=[move(t) for t in tensors.non_id],
        labels=None if tensors.labels is None else [move(t) for t in tensors.labels],
        embeddings=[
            (name, move(t).requires_grad_(tensors.requires_grad)) for name, t in tensors.embeddings
        ],
        requires_grad=tensors.requires_grad,
    )


def embedding_tensors(
    embeddings: list[tuple[str, np.ndarray]], device_id: int | None, requires_grad: bool
) -> list[tuple[str, torch.Tensor]]:
    """Float32 leaf tensors of the looked-up embeddings, in slot order."""
    return [
        (name, to_tensor(_float32(data), device_id, requires_grad=requires_grad))
        for name, data in embeddings
    ]


def gradient_arrays(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, np.ndarray]]:
    """``[(slot, float32 grad array)]`` of the slots that got a gradient (others are logged).

    Safe on another thread once ``backward()`` returned: nothing writes these gradients
    again (the embedding leaves belong to one batch).
    """
    grads, empty = [], []
    for name, tensor in tensors:
        grad = slot_gradient(tensor)
        if grad is None:
            empty.append(name)
            continue
        grads.append((name, grad.detach().to(torch.float32).cpu().numpy()))
    if empty:
        log.warning("slots without an embedding gradient in this batch: %s", empty)
    return grads


@dataclass
class GradientPayload:
    """What goes back to the worker for one batch: pooled slots' gradients, one summed gradient
    per table of a gathered answer, and the gathered slots left out of them."""

    slots: list[tuple[str, np.ndarray]]
    tables: list[tuple[int, np.ndarray]] | None = None
    skipped_slots: tuple[str, ...] = field(default=())


def gradient_payload(
    tensors: list[tuple[str, torch.Tensor]], tables: Sequence[EmbeddingTable] = ()
) -> GradientPayload:
    """The batch's gradients as the worker takes them (call it once ``backward()`` returned).

    A gathered slot without a gradient, or with a NaN or inf in it, is left out of its
    table's sum and named in ``skipped_slots`` (the worker then updates no id for it).
    """
    if not tables:
        return GradientPayload(gradient_arrays(tensors))
    if _all_in_one_table(tensors, tables):  # the usual case: one table, no pooled slot
        return _table_payload(tables[0], [slot_gradient(t) for _, t in tensors])
    gathered = {name for table in tables for name in table.slots}
    payload = GradientPayload(gradient_arrays([(n, t) for n, t in tensors if n not in gathered]))
    by_name = dict(tensors)
    sums = [
        _table_sum(table, [slot_gradient(by_name[name]) for name in table.slots])
        for table in tables
    ]
    payload.tables = [
        (table.dim, summed) for table, (summed, _, _) in zip(tables, sums, strict=True)
    ]
    skipped = [name for _, names, _ in sums for name in names]
    _warn_skipped(skipped, [name for _, _, names in sums for name in names])
    payload.skipped_slots = tuple(skipped)
    return payload


def _all_in_one_table(
    tensors: list[tuple[str, torch.Tensor]], tables: Sequence[EmbeddingTable]
) -> bool:
    """Whether the one table holds every slot of ``tensors``, in their order."""
    if len(tables) != 1 or len(tables[0].slots) != len(tensors):
        return False
    return all(name == slot for (name, _), slot in zip(tensors, tables[0].slots, strict=True))


def _table_payload(table: EmbeddingTable, grads: list[torch.Tensor | None]) -> GradientPayload:
    """The payload of a batch whose slots are all in ``table``, ``grads`` in its slot order."""
    summed, skipped, nonfinite = _table_sum(table, grads)
    _warn_skipped(skipped, nonfinite)
    return GradientPayload([], [(table.dim, summed)], tuple(skipped))


def _table_sum(
    table: EmbeddingTable, grads: list[torch.Tensor | None]
) -> tuple[np.ndarray, list[str], list[str]]:
    """The table's summed gradient per unique vector; the slots left out of it (no gradient,
    or a NaN or inf in it) and, of those, the non-finite ones."""
    summed = np.zeros((table.rows, table.dim), np.float32)
    if all(g is not None for g in grads) and _sum_table(table, grads, summed):  # type: ignore[arg-type]
        return summed, [], []  # the usual case: one copy, one kernel
    skipped, nonfinite = [], []
    for k, (name, grad) in enumerate(zip(table.slots, grads, strict=True)):
        if grad is None:
            skipped.append(name)
            continue
        rows = grad.detach().to(torch.float32).cpu().numpy()
        if not add_rows_if_finite(table.index[k], rows, summed):
            skipped.append(name)
            nonfinite.append(name)
    return summed, skipped, nonfinite


def _warn_skipped(skipped: list[str], nonfinite: list[str]) -> None:
    if skipped:
        log.warning(
            "embedding slots left out of this batch's embedding update: %s "
            "(NaN or inf in the embedding gradient of: %s; the others got no gradient)",
            skipped,
            nonfinite,
        )


def _sum_table(table: EmbeddingTable, grads: list[torch.Tensor], summed: np.ndarray) -> bool:
    """Every slot's gradient rows added into ``summed`` at once (one kernel call: a call per
    slot cost ~10 µs of Python each, 33 per Census batch), read where autograd left them
    when they are plain CPU float32 arrays (stacking them first took longer than the sum);
    False, with ``summed`` still zero, when a NaN or inf is in any of them."""
    layout = _layout_in_place(grads, (table.index.shape[1], table.dim))
    if layout is not None:
        addresses, strides = layout
        finite = add_blocks_if_finite(table.index, addresses, summed, strides)
        if finite is not None:
            if not finite:
                summed.fill(0.0)
            return finite
    # (rows, slots, dim): summed in the in-place kernel's order, so both give the same bits
    rows = torch.stack([g.detach() for g in grads], 1).to(torch.float32).cpu().numpy()
    return add_rows_if_finite(
        np.ascontiguousarray(table.index.T).reshape(-1), rows.reshape(-1, table.dim), summed
    )


def nonfinite_slots(tensors: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the slots whose embedding gradient holds a NaN or an inf, in ``tensors``'
    order, so a warning can say which embedding went wrong.

    CPU float32 gradients of one shape are checked together where they lie (one compiled
    pass; ``torch.isfinite`` per slot took 1.5 ms on Census-Income's 33 strided views of
    the concatenation's gradient), the others with one reduction each and a single read of
    the answers (one device synchronization on a GPU, not one per slot); the slots are
    looked at one by one only when something is not finite.
    """
    grads = [(name, g) for name, t in tensors if (g := slot_gradient(t)) is not None]
    groups: dict[tuple[int, ...], list[tuple[str, torch.Tensor]]] = {}
    for name, g in grads:
        groups.setdefault(tuple(g.shape), []).append((name, g))
    rest: list[tuple[str, torch.Tensor]] = []
    for shape, group in groups.items():
        layout = _layout_in_place([g for _, g in group], shape)
        if layout is None or blocks_finite(*layout, shape) is not True:
            rest += group
    if not rest:
        return []
    finite = torch.stack([torch.isfinite(g.detach()).all() for _, g in rest]).tolist()
    bad = {name for (name, _), ok in zip(rest, finite, strict=True) if not ok}
    return [name for name, _ in grads if name in bad]


def _layout_in_place(
    grads: Sequence[torch.Tensor], shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Where each of ``grads`` starts and its row stride, when the compiled kernels can read
    them where they lie: CPU float32 ``shape`` = ``(n, d)`` arrays whose rows hold their
    ``d`` values side by side, at least ``d`` apart (a slot's gradient as a view of the
    model's concatenation gradient is one); else None. One pass of six reads per tensor:
    checking and then reading each (13 reads) took 43 µs for Census-Income's 33 slots, this
    18 (isolated; the gradient payload's CPU per batch fell by 40-60 µs in the e2e job)."""
    if len(shape) != 2 or shape[1] < 1:
        return None
    d = shape[1]
    addresses, strides = [], []
    for g in grads:
        if g.dtype is not _FLOAT32 or g.layout is not _STRIDED or not g.is_cpu or g.shape != shape:
            return None
        row, column = g.stride()
        if (column != 1 and d != 1) or row < d:
            return None
        addresses.append(g.data_ptr())
        strides.append(row)
    return np.array(addresses, np.int64), np.array(strides, np.int64)


_FLOAT32, _STRIDED = torch.float32, torch.strided


def gradients_finite(tensors: list[tuple[str, torch.Tensor]]) -> bool:
    """Whether every embedding gradient element is finite (one reduction per slot)."""
    return not nonfinite_slots(tensors)
