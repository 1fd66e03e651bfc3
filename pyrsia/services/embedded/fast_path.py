"""Embedded mode's per-batch fast path: a plain batch's lookup and gradients in one call each.

In services mode a batch's lookup and gradients cross four layers (the NN worker's client,
the route's request object checked as it would be off the wire, the embedding worker's
``Worker``, its PS client), each with its own Python per batch. In embedded mode the same
work for the usual CTR batch (every slot summed, one id per sample, no hash stack, one dim,
one PS replica: Census-Income, Criteo) is one call into the engines:

    lookup     forward buffer ─▶ EmbeddingStore.lookup (the unique ids, one kernel call)
               ─▶ fast_kernels.gather_block: the answer's int32 index and every slot's rows,
                  in one compiled pass with the GIL released (the tensors' memory, used by
                  the NN worker's build_tensors as it is)
    gradients  the table's summed gradient (one row per unique id) checked, divided by the
               loss scale ─▶ EmbeddingStore.update (one kernel call)

Everything else takes the general path (``InProcessTransport``), which :class:`FastPath`
answers ``None`` for: other batch shapes, gradients with pooled or skipped slots, a NaN or
inf in the table, a request the route would refuse (the general path then raises the
route's error), and whenever the general path would not run inline on the loop (work above
the inline limit, pool work under way, kernels still warming), so the order in which
batches reach the store stays the general path's. The answers, the buffers' states and the
store's updates are the general path's, value for value (``tests/test_embedded_fast_path.py``
compares both).
"""

from __future__ import annotations

import numpy as np

from pyrsia.services.embedded import fast_kernels
from pyrsia.services.embedded.local_ps import LocalPS
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_worker import kernels as worker_kernels
from pyrsia.services.embedding_worker.gathering import Awaited, gather_plan
from pyrsia.services.embedding_worker.plans import DimGroup, PreparedBatch
from pyrsia.services.embedding_worker.replica import Worker
from pyrsia.shared.warming import warming_in_progress
from pyrsia.shared.wire.gathered import EmbeddingTable, SlotEmbeddings
from pyrsia.shared.wire.ps import UpdateTotals
from pyrsia.shared.wire.worker import Embeddings, Gradients, GradientsApplied


class FastPath:
    """The fast path over one in-process embedding worker and its one PS replica."""

    def __init__(self, worker: Worker, store: EmbeddingStore, ps: LocalPS, *, enabled: bool = True):
        self.enabled = enabled
        """False: every call answers None (the general path takes every batch)."""
        self.worker = worker
        self.store = store
        self.ps = ps
        self.lookups = 0
        """Lookups answered here (the others took the general path)."""
        self.updates = 0
        """Gradients applied here."""

    def _inline(self, n_ids: int) -> bool:
        """Whether the general path would run ``n_ids`` ids inline on the loop now."""
        offload = self.worker.offload
        return n_ids <= offload.max_inline_ids and offload.idle and not warming_in_progress()

    def _group(self, prepared: PreparedBatch) -> DimGroup | None:
        """The one dim group of a plain single-id batch for one replica; else None."""
        if not prepared.single_ids or prepared.replica_count != 1 or len(prepared.groups) != 1:
            return None
        (group,) = prepared.groups.values()
        if not self._inline(group.inverse.shape[0]):
            return None
        return group

    def lookup(self, batch_id: int, train: bool) -> Embeddings | None:
        """``/lookup`` of a buffered batch with ``gathered``, or None (the general path's)."""
        worker = self.worker
        if not self.enabled or worker.metrics is not None or batch_id not in worker.forward:
            return None
        pending = worker.forward.peek(batch_id)
        prepared = pending.prepared
        group = self._group(prepared)
        if group is None:
            return None
        plan = gather_plan(prepared)
        entries = plan.entries
        if entries is None:
            return None
        trainable = train and pending.requires_grad
        worker.forward.pop(batch_id)
        vectors = self.store.lookup(group.ids, group.dim, train=trainable)
        slots, batch = len(group.members), prepared.batch_size
        index = np.empty((slots, batch), np.int32)
        block = np.empty((batch, slots, group.dim), np.float32)
        if not fast_kernels.gather_block(vectors, group.inverse, index, block):
            raise AssertionError(f"batch {batch_id}: a lookup row outside its unique ids")
        table = EmbeddingTable(group.dim, vectors, index, plan.table_slots[0], block=block)
        if trainable:
            worker.awaiting.put(batch_id, Awaited(prepared, plan))
        self.lookups += 1
        return Embeddings(SlotEmbeddings(entries, (table,)), batch_id, pending.requires_grad)

    def gradients(self, request: Gradients) -> GradientsApplied | None:
        """``/gradients`` of a batch answered with one table and no pooled slot, or None."""
        tables, scale = request.tables, request.loss_scale
        if (
            not self.enabled
            or request.gradients
            or request.skipped_slots
            or tables is None
            or len(tables) != 1
        ):
            return None
        if not (isinstance(scale, float) and 0.0 < scale < float("inf")):
            return None
        awaiting = self.worker.awaiting
        if request.batch_id not in awaiting:
            return None
        prepared = awaiting.peek(request.batch_id).prepared
        group = self._group(prepared)
        dim, grad = tables[0]
        if (
            group is None
            or dim != group.dim
            or not isinstance(grad, np.ndarray)
            or grad.dtype != np.float32
            or grad.shape != (group.ids.shape[0], dim)
            or not grad.flags.c_contiguous
            or not worker_kernels.all_finite(grad, dim)
        ):
            return None
        awaiting.pop(request.batch_id)
        # the general path's 0 + grad / scale, bit for bit (a -0.0 becomes +0.0 there too)
        scaled = grad * np.float32(1.0 / scale) + np.float32(0.0)
        result = self.store.update(group.ids, scaled)
        totals = UpdateTotals(result.applied, result.skipped_unknown, result.skipped_nonfinite)
        self.ps.applied_updates += totals.applied
        self.updates += 1
        return GradientsApplied(request.batch_id, (), totals, 0)
