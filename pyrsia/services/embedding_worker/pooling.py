"""Pooling of looked-up vectors into per-slot tensors, and its transpose for gradients.

Forward, per slot (``SlotPlan`` from ``preprocess``):

- summed slot: ``out[i] = scale_i * sum of the vectors of sample i`` → ``(batch, dim)``,
  where ``scale_i = 1/sqrt(ids in sample i, each id counted once per hash-stack
  bucket)`` with ``sqrt_scaling`` (PERSIA's rule) and 1 otherwise; an empty
  sample gives zeros;
- raw slot: ``(batch, sample_fixed_size, dim + 1)``; row ``(i, j)`` holds the j-th
  id of sample i (the sum of its R hash-stack buckets; PERSIA overwrites them
  instead, a bug not copied) and a last column that is 1 for a real id and 0 for
  padding.

Backward is the exact transpose: each output row's gradient, divided by the
loss scale and multiplied by the same row scale, is added to every unique id
that contributed to that row. Cutting a batch's ids into one request per PS
replica is ``routing``'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrsia.services.embedding_worker import kernels
from pyrsia.services.embedding_worker.plans import PreparedBatch, SlotPlan
from pyrsia.shared.errors import InvalidInputError


def pool_forward(
    prepared: PreparedBatch,
    vectors_by_dim: dict[int, np.ndarray],
    exclude: frozenset[int] = frozenset(),
) -> list[np.ndarray | None]:
    """One float32 tensor per slot, in the batch's feature order, from the unique ids' vectors.

    ``vectors_by_dim[dim]`` is ``(n_unique, dim)`` float32, row k the vector of
    ``prepared.groups[dim].ids[k]``. Slots at the positions in ``exclude`` (answered as
    tables, ``gathering.py``) get None.
    """
    if len(exclude) == len(prepared.slot_names):  # every slot answered as a table
        return [None] * len(exclude)
    out: list[np.ndarray | None] = []
    for position, plan in enumerate(prepared.slots):
        if position in exclude:
            out.append(None)
            continue
        vectors = np.ascontiguousarray(vectors_by_dim[plan.dim])
        pooled = np.empty(plan.output_shape, dtype=np.float32)
        kernels.pool(
            vectors,
            plan.inverse,
            plan.offsets,
            plan.rounds,
            plan.scale,
            not plan.summation,
            plan.sample_fixed_size,
            pooled.reshape(plan.num_rows, plan.output_shape[-1]),
        )
        out.append(pooled)
    return out


def pool_backward(
    prepared: PreparedBatch,
    slot_grads: Sequence[np.ndarray | None],
    loss_scale: float = 1.0,
    exclude: frozenset[int] = frozenset(),
) -> tuple[dict[int, np.ndarray], list[str]]:
    """Per-unique-id gradients of every dim group from the gradients of the pooled tensors.

    ``slot_grads[i]`` has the shape of ``pool_forward``'s i-th output (float32 or
    float16, as ``pyrsia.shared.wire.worker.Gradients`` checked; a raw slot's mask column is
    ignored; the shape is checked here, against the batch's plan). A slot whose gradient holds a
    NaN or inf, or is ``None`` (skipped by the NN worker), contributes nothing and
    is named in the returned list of skipped slots. Gradients are divided by
    ``loss_scale`` and multiplied by the forward row scale, then summed per
    unique id over every occurrence in every slot of that dim. Slots at the positions in
    ``exclude`` (answered as tables) are left to ``gathering.gather_backward``.
    """
    grads = {
        dim: np.zeros((g.ids.shape[0], dim), dtype=np.float32) for dim, g in prepared.groups.items()
    }
    skipped: list[str] = []
    if len(exclude) == len(prepared.slot_names):  # every slot answered as a table
        return grads, skipped
    for position, (plan, grad) in enumerate(zip(prepared.slots, slot_grads, strict=True)):
        if position in exclude:
            continue
        if grad is None:
            skipped.append(plan.name)
            continue
        rows = _check_grad(plan, grad)
        if not kernels.all_finite(rows, plan.dim):
            skipped.append(plan.name)
            continue
        kernels.scatter(
            rows,
            plan.inverse,
            plan.offsets,
            plan.rounds,
            plan.scale,
            1.0 / loss_scale,
            not plan.summation,
            plan.sample_fixed_size,
            grads[plan.dim],
        )
    return grads, skipped


def check_slot_gradients(prepared: PreparedBatch, by_name: dict[str, Any]) -> None:
    """Raise what :func:`pool_backward` would raise for these gradients, touching nothing.

    The worker checks a ``/gradients`` body with it before it takes the batch out of the
    awaiting buffer, so a refused body leaves the batch there for a corrected retry.
    """
    if not by_name:
        return
    for plan in prepared.slots:
        if by_name.get(plan.name) is not None:
            _check_grad(plan, by_name[plan.name])


def _check_grad(plan: SlotPlan, grad: Any) -> np.ndarray:
    """The slot's gradient as float32 rows ``(num_rows, width)``; only ``[:, :dim]`` is used."""
    if grad.shape != plan.output_shape:
        raise InvalidInputError(f"gradients.{plan.name}", f"shape {plan.output_shape}", grad.shape)
    return np.ascontiguousarray(grad, dtype=np.float32).reshape(plan.num_rows, grad.shape[-1])
