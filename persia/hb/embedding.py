"""torch embeddings whose table lives on Pyrsia's sharded embedding parameter servers.

``hb.scope(sharding=True)`` turns every ``torch.nn.Embedding`` / ``torch.nn.EmbeddingBag``
created inside it into a :class:`ShardedEmbedding` / :class:`ShardedEmbeddingBag`
(subclasses, so ``isinstance`` checks keep working). The module holds no weight: the
rows are rows of the embedding-worker slot named :attr:`slot` (by default the
attribute name the module was assigned to, e.g. ``self.user = nn.EmbeddingBag(...)``
-> slot ``user``), and the user's code keeps calling the module as before.

One call of the module is one ``/lookup_direct`` request (the whole batch, ids
deduplicated by the worker) and, in training, one ``/gradients`` request from
``backward``::

    input ids ──(vectorized: bags -> uint64 ids + int64 offsets, padding_idx dropped)──▶
        embedding worker /lookup_direct {train} ──▶ pooled rows (bags, dim)  [forward]
    d loss / d rows (bags, dim) ──▶ /gradients {batch_id} ──▶ per-id sums ──▶ PS optimizer [backward]

``EmbeddingBag(mode="sum")`` is the worker's summed slot; ``mode="mean"`` divides that
sum by the bag sizes in torch (so the gradient is scaled by autograd); ``Embedding``
sends each position as a bag of one id and reshapes to ``input.shape + (dim,)``. The
slot must be summed (``embedding_summation: true``), of the module's dim, and for bags
without ``sqrt_scaling``; this is checked once, on the first call.
Not supported (refused with an error): ``max_norm``, ``scale_grad_by_freq``,
``mode="max"``, ``per_sample_weights``, a preset ``_weight``.
"""

from __future__ import annotations

import numpy as np
import torch

from persia.hb._ps import connection
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.wire.batch import MAX_BATCH_SIZE, IDFeature, IDPart

__all__ = ["ShardedEmbedding", "ShardedEmbeddingBag"]


class _PSLookup(torch.autograd.Function):
    """Forward: pooled rows from the embedding worker; backward: their gradient back to it."""

    @staticmethod
    def forward(ctx, anchor, slot, id_part):  # noqa: D401 - torch's signature
        embeddings, worker, batch_id = connection.lookup(id_part, True)
        ctx.reference = (worker, batch_id, slot)
        return _rows_tensor(embeddings, anchor.device)

    @staticmethod
    def backward(ctx, grad):
        worker, batch_id, slot = ctx.reference
        if batch_id is not None:
            array = grad.detach().to(torch.float32).cpu().contiguous().numpy()
            connection.send_gradients(worker, batch_id, slot, array)
        return None, None, None


def _rows_tensor(embeddings, device: torch.device) -> torch.Tensor:
    (_, rows), *_ = embeddings
    tensor = torch.from_numpy(np.array(rows, dtype=np.float32, copy=True))
    return tensor.to(device) if device.type != "cpu" else tensor


def _ids_array(ids: torch.Tensor, num_embeddings: int, field: str) -> np.ndarray:
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise InvalidInputError(field, "an integer tensor of ids", f"dtype {ids.dtype}")
    array = ids.detach().reshape(-1).to(torch.int64).cpu().numpy()
    if array.size and (array.min() < 0 or array.max() >= num_embeddings):
        bad = int(array.min()) if array.min() < 0 else int(array.max())
        raise InvalidInputError(field, f"ids in [0, num_embeddings={num_embeddings})", bad)
    return array


def _drop_padding(ids: np.ndarray, offsets: np.ndarray, padding_idx: int | None):
    """Remove ``padding_idx`` entries; bag boundaries move accordingly (vectorized)."""
    if padding_idx is None:
        return ids, offsets
    keep = ids != padding_idx
    kept_before = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
    return ids[keep], kept_before[offsets]


class _Sharded:
    """What both sharded classes share: the slot, the call, the weight that is not there."""

    slot: str | None
    _hb_checked: bool

    def _hb_init(self) -> None:
        self.slot = None
        self._hb_checked = False

    def reset_parameters(self) -> None:
        """The table is initialized on the PS (``emb_initialization``): drop the local stub."""
        self._parameters.pop("weight", None)

    def _fill_padding_idx_with_zero(self) -> None:
        """The padding row is never looked up (ids equal to ``padding_idx`` are dropped)."""

    def __getattr__(self, name: str):
        if name == "weight":
            raise AttributeError(
                f"{type(self).__name__} (slot {self.slot!r}) has no local weight: its rows live "
                "on the embedding parameter servers (initialized by embedding_config's "
                "emb_initialization; saved with hb.train.export / the PS checkpoint)"
            )
        return super().__getattr__(name)

    def _check_slot(self, summed_bags: bool) -> None:
        if self._hb_checked:
            return
        if not self.slot:
            raise InvalidInputError(
                f"{type(self).__name__}.slot",
                "the embedding-worker slot name of this table: assign the module to an "
                "attribute inside hb.scope(sharding=True) or set module.slot = '<slot>'",
                self.slot,
            )
        config = connection.slot(self.slot)
        if config.dim != self.embedding_dim:
            raise InvalidInputError(
                f"slots_config.{self.slot}.dim",
                f"{self.embedding_dim} (embedding_dim of the torch module)",
                config.dim,
            )
        if not config.embedding_summation:
            raise InvalidInputError(
                f"slots_config.{self.slot}.embedding_summation",
                "true for a torch embedding",
                False,
            )
        if summed_bags and config.sqrt_scaling:
            raise InvalidInputError(
                f"slots_config.{self.slot}.sqrt_scaling",
                "false for an EmbeddingBag (torch sums or averages the bag)",
                True,
            )
        self._hb_checked = True

    def _pooled(self, ids: np.ndarray, offsets: np.ndarray, device: torch.device) -> torch.Tensor:
        """(bags, dim) sums of the bags' rows, differentiable towards the PS when training.

        One request per ``MAX_BATCH_SIZE`` bags (the wire's batch limit; one in practice).
        """
        bags = len(offsets) - 1
        if bags == 0:
            return torch.zeros(0, self.embedding_dim, device=device)
        parts = []
        for start in range(0, bags, MAX_BATCH_SIZE):
            stop = min(start + MAX_BATCH_SIZE, bags)
            chunk = offsets[start : stop + 1]
            parts.append(self._lookup(ids[chunk[0] : chunk[-1]], chunk - chunk[0], device))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _lookup(self, ids: np.ndarray, offsets: np.ndarray, device: torch.device) -> torch.Tensor:
        assert self.slot is not None
        train = self.training and torch.is_grad_enabled()
        feature = IDFeature(self.slot, np.ascontiguousarray(ids).view(np.uint64), offsets)
        id_part = IDPart(len(offsets) - 1, train, (feature,))
        if not train:
            embeddings, _, _ = connection.lookup(id_part, False)
            return _rows_tensor(embeddings, device)
        anchor = torch.empty(0, device=device, requires_grad=True)
        return _PSLookup.apply(anchor, self.slot, id_part)


class ShardedEmbeddingBag(_Sharded, torch.nn.EmbeddingBag):
    """``torch.nn.EmbeddingBag`` whose table is an embedding-worker slot (sum or mean)."""

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002 - torch's name
        if per_sample_weights is not None:
            raise InvalidInputError(
                "per_sample_weights", "None for a sharded EmbeddingBag", "a tensor"
            )
        if self.mode not in ("sum", "mean"):
            raise InvalidInputError(f"{type(self).__name__}.mode", "'sum' or 'mean'", self.mode)
        self._check_slot(summed_bags=True)
        ids = _ids_array(input, self.num_embeddings, "input")
        if input.dim() == 2:
            if offsets is not None:
                raise InvalidInputError(
                    "offsets", "None when input is 2-D (one bag per row)", "a tensor"
                )
            bag_offsets = np.arange(0, ids.size + 1, max(input.shape[1], 1), dtype=np.int64)
            if input.shape[1] == 0:
                bag_offsets = np.zeros(input.shape[0] + 1, dtype=np.int64)
        elif input.dim() == 1:
            bag_offsets = self._offsets(offsets, ids.size)
            ids = ids[
                : bag_offsets[-1]
            ]  # include_last_offset: ids after the last offset are unused
        else:
            raise InvalidInputError(
                "input", "a 1-D (with offsets) or 2-D tensor of ids", tuple(input.shape)
            )
        ids, bag_offsets = _drop_padding(ids, bag_offsets, self.padding_idx)
        pooled = self._pooled(ids, bag_offsets, input.device)
        if self.mode == "mean":
            counts = torch.from_numpy(np.maximum(np.diff(bag_offsets), 1).astype(np.float32))
            pooled = pooled / counts.to(pooled.device).unsqueeze(1)
        return pooled

    def _offsets(self, offsets, n_ids: int) -> np.ndarray:
        if offsets is None or not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
            raise InvalidInputError(
                "offsets", "a 1-D tensor of bag starts when input is 1-D", offsets
            )
        array = offsets.detach().to(torch.int64).cpu().numpy()
        if not self.include_last_offset:
            array = np.concatenate((array, [n_ids]))
        if array.size < 2 or array[0] != 0 or array[-1] > n_ids or np.any(np.diff(array) < 0):
            raise InvalidInputError(
                "offsets",
                f"non-decreasing bag starts from 0, at most len(input)={n_ids}",
                array[:8].tolist(),
            )
        return array


class ShardedEmbedding(_Sharded, torch.nn.Embedding):
    """``torch.nn.Embedding`` whose table is an embedding-worker slot; any input shape."""

    def forward(self, input):  # noqa: A002 - torch's name
        self._check_slot(summed_bags=False)
        ids = _ids_array(input, self.num_embeddings, "input")
        offsets = np.arange(ids.size + 1, dtype=np.int64)  # every position is a bag of one id
        ids, offsets = _drop_padding(ids, offsets, self.padding_idx)
        rows = self._pooled(ids, offsets, input.device)
        return rows.reshape(*input.shape, self.embedding_dim)


SHARDED_CLASSES: dict[type, type] = {
    torch.nn.Embedding: ShardedEmbedding,
    torch.nn.EmbeddingBag: ShardedEmbeddingBag,
}
