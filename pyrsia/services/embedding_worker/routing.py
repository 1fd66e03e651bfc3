"""Routing of a batch's unique ids to the PS replicas, and of their answers back.

``preprocess`` sorts each dim group's unique ids by replica (stable 64-bit hash of the
id modulo the number of PS replicas), so replica k's ids are one contiguous slice,
``group.replica_slice(k)``. Here that order becomes one request per replica carrying
all its groups (:func:`replica_lookups`, :func:`replica_updates`), and the replicas'
answers become one ``(n_unique, dim)`` array per group again (:func:`scatter_responses`).
Slices are views: no id is copied to route it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pyrsia.services.embedding_worker.plans import PreparedBatch

__all__ = ["replica_lookups", "replica_updates", "scatter_responses"]


def replica_lookups(prepared: PreparedBatch) -> list[list[tuple[int, np.ndarray]]]:
    """Per PS replica, ``[(dim, ids), ...]`` for every dim group (ids may be empty; views).

    One request per replica carries all its groups; ``scatter_responses`` expects
    the answers in the same order.
    """
    return [
        [(dim, g.ids[g.replica_slice(k)]) for dim, g in prepared.groups.items()]
        for k in range(prepared.replica_count)
    ]


def scatter_responses(
    prepared: PreparedBatch, responses: Sequence[Sequence[np.ndarray]]
) -> dict[int, np.ndarray]:
    """``vectors_by_dim`` from the replicas' answers to ``replica_lookups``.

    ``responses[k][j]`` is replica k's ``(n, dim)`` float32 answer for its j-th group,
    checked against its request by ``pyrsia.shared.wire.ps.PSLookupAnswer`` when it arrived.
    """
    return {
        dim: np.concatenate([answer[j] for answer in responses])
        for j, dim in enumerate(prepared.groups)
    }


def replica_updates(
    prepared: PreparedBatch,
    grads_by_dim: dict[int, np.ndarray],
    skipped_slots: Sequence[str] = (),
) -> list[list[tuple[int, np.ndarray, np.ndarray]]]:
    """Per PS replica, ``[(dim, ids, grads), ...]`` of the ids that received a gradient.

    Ids seen only in skipped slots are left out: a zero gradient is not "no
    update" for optimizers with state or weight decay. Every looked-up id occurs
    in some slot, so without skipped slots the payloads are plain slices.
    """
    skipped = set(skipped_slots)
    names = prepared.slot_names
    touched: dict[int, np.ndarray | None] = {}
    for dim, group in prepared.groups.items():
        if not skipped or not any(names[i] in skipped for i in group.members):
            touched[dim] = None  # every id of the group got a gradient
            continue
        mask = np.zeros(group.ids.shape[0], dtype=bool)
        for i in group.members:
            if names[i] not in skipped:
                mask[prepared.slots[i].inverse] = True
        touched[dim] = mask
    out: list[list[tuple[int, np.ndarray, np.ndarray]]] = []
    for k in range(prepared.replica_count):
        groups = []
        for dim, group in prepared.groups.items():
            part = group.replica_slice(k)
            ids, grads = group.ids[part], grads_by_dim[dim][part]
            mask = touched[dim]
            if mask is not None:
                keep = mask[part]
                ids, grads = ids[keep], grads[keep]
            groups.append((dim, ids, grads))
        out.append(groups)
    return out
