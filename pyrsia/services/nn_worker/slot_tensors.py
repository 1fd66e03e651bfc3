"""A gathered table's slots as tensors: the rows the gradient sender reads, and the aliases
the model gets, which ``torch.cat`` joins back into the block they were gathered in.

A gathered table's slots arrive as one block, laid out sample by sample::

    block    float32 (batch, slots, dim)      block[i, s] = sample i's row of slot s
    slot s   block[:, s]                      (batch, dim), rows slots * dim apart

:func:`slot_rows` makes the slots tensors that get their ``.grad`` after ``backward()`` as
leaves do (summed over several calls, None where unused), without the copy a leaf makes of
a gradient that is a view; :func:`slot_gradient` reads it.

PERSIA's models join the slots again first thing: ``torch.cat(embedding_tensors, dim=1)``.
Joined slot by slot, that copy reads one 64-byte piece of every slot for every sample
(Census-Income: 33 x 1,024 pieces, 0.55-0.70 ms of the training thread with the block out of
its cache). Consecutive slots of one block are already side by side in each sample's row,
so their join is the block's columns ``block[:, first:stop]``, read as one run (0.32 ms;
``benchmarks/slot_join_bench.py``). :func:`model_slots` hands the model each slot as a
:class:`SlotTensor` (an alias: same memory, same autograd history), and ``torch.cat``,
``torch.concat`` and ``torch.concatenate`` along the last dim replace each run of
consecutive slots of one block by :meth:`SlotBlock.columns`: the same values, and each
slot's gradient arrives where the slot-by-slot join leaves it. Every other operation on a
slot runs as on a plain tensor and returns plain tensors (``__torch_function__``, about
1 µs of Python per call).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_JOINS = frozenset({torch.cat, torch.concat, torch.concatenate})
_NO_SUBCLASS = torch._C.DisableTorchFunctionSubclass


# ----------------------------------------------------------------------------- the rows
class _SlotRows(torch.autograd.Function):
    """A block's slots as its rows' tensors. Backward sets each slot tensor's ``.grad`` to the
    gradient autograd hands over, as it is: where the model concatenates the slots, a view
    of the concatenation's gradient. As 33 leaves, the Census slots cost 33 gradient copies
    and accumulations on the training thread (~0.8 ms of a 17 ms forward and backward in
    isolation)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, block: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused slot keeps no gradient, as a leaf does
        ctx.given = [False] * block.shape[1]  # which slots got one (read by slot_gradient)
        return block.unbind(1)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, None]:
        for k, (ref, grad) in enumerate(zip(ctx.slots, grads, strict=True)):
            tensor = ref()
            if tensor is not None and grad is not None:
                _give(ctx, k, tensor, grad)
        return None, None


def _give(node: Any, k: int, tensor: torch.Tensor, grad: torch.Tensor) -> None:
    tensor.grad = tensor.grad + grad if node.given[k] else grad  # accumulated, as a leaf's
    node.given[k] = True


_SLOT_ROWS_NODE = _SlotRows._backward_cls


def slot_rows(block: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A ``(batch, slots, dim)`` block's slots, ``block.unbind(1)``, as tensors that require
    grad and get their ``.grad`` as leaves do (:class:`_SlotRows`)."""
    anchor = torch.empty(0, requires_grad=True)  # what makes autograd record the rows
    rows = _SlotRows.apply(anchor, block)
    # weak: a strong reference would keep each batch's tensors in a cycle through the graph
    rows[0].grad_fn.slots = [weakref.ref(t) for t in rows]
    return rows


def slot_gradient(tensor: torch.Tensor) -> torch.Tensor | None:
    """The gradient ``backward()`` left on an embedding tensor (a leaf or one of
    :func:`slot_rows`), None where it got none; reading ``.grad`` of a slot row that got
    none would make torch warn that it is not a leaf."""
    node = tensor.grad_fn
    if type(node) is _SLOT_ROWS_NODE and not node.given[tensor.output_nr]:
        return None
    return tensor.grad


# -------------------------------------------------------------------- the model's aliases
class SlotBlock:
    """One gathered ``(batch, slots, dim)`` block and its :func:`slot_rows` (None when
    nothing is trained)."""

    __slots__ = ("block", "rows")

    def __init__(self, block: torch.Tensor, rows: tuple[torch.Tensor, ...] | None) -> None:
        self.block = block
        self.rows = rows

    def columns(self, first: int, stop: int) -> torch.Tensor:
        """Slots ``first`` to ``stop - 1`` side by side, ``(batch, (stop - first) * dim)``:
        a view of the block, whose gradient goes to those slots as theirs."""
        batch, _, dim = self.block.shape
        view = self.block[:, first:stop].reshape(batch, (stop - first) * dim)
        if self.rows is None:
            return view
        anchor = torch.empty(0, requires_grad=True)  # what makes autograd record the columns
        return _Columns.apply(anchor, view, self, first)


class _Columns(torch.autograd.Function):
    """A run of slots as one tensor; backward hands each slot its part of the gradient, as
    autograd hands it to a slot used on its own."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, view: torch.Tensor, block: SlotBlock, first: int
    ) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.block, ctx.first = block, first
        return view

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[None, None, None, None]:
        if grad is not None:
            rows = ctx.block.rows
            parts = grad.reshape(grad.shape[0], -1, rows[0].shape[1]).unbind(1)
            for k, part in enumerate(parts, ctx.first):
                row = rows[k]
                _give(row.grad_fn, k, row, part)
        return None, None, None, None


class SlotTensor(torch.Tensor):
    """A slot's tensor as the model gets it: slot ``slot_index`` of ``slot_block``."""

    slot_block: SlotBlock
    slot_index: int

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        kwargs = kwargs or {}
        if func in _JOINS:
            joined = _joined(args, kwargs)
            if joined is not None:
                return joined
        with _NO_SUBCLASS():
            return func(*args, **kwargs)


def model_slots(block: SlotBlock, slots: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """``slots`` (the block's slot tensors, in order) as the model gets them."""
    out = []
    for k, tensor in enumerate(slots):
        alias = tensor.as_subclass(SlotTensor)
        alias.slot_block, alias.slot_index = block, k
        out.append(alias)
    return out


def _joined(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The join with each run of consecutive slots of one block read as its columns; None
    when there is no such run (the join then runs as it was called)."""
    tensors = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("axis", 0))
    if kwargs.get("out") is not None or not isinstance(tensors, list | tuple):
        return None
    if dim not in (1, -1):  # a slot is (batch, dim): its last dim
        return None
    parts: list[torch.Tensor] = []
    runs = 0
    i, n = 0, len(tensors)
    while i < n:
        tensor = tensors[i]
        stop = i + 1
        if type(tensor) is SlotTensor:
            block, first = tensor.slot_block, tensor.slot_index
            while (
                stop < n
                and type(tensors[stop]) is SlotTensor
                and tensors[stop].slot_block is block
                and tensors[stop].slot_index == first + stop - i
            ):
                stop += 1
            if stop - i > 1:
                parts.append(block.columns(first, first + stop - i))
                runs += 1
                i = stop
                continue
        parts.append(tensor)
        i = stop
    if not runs:
        return None
    with _NO_SUBCLASS():
        return torch.cat(parts, dim)
