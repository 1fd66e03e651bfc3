"""``PersiaTrainingBatch``: a batch with its embeddings, as the training loop receives it.

Iterating a :class:`persia.data.DataLoader` (or calling
``EmbeddingCtx.get_embedding_from_data``) yields these; ``ctx.prepare_features`` and
``ctx.forward`` turn them into torch tensors. The arrays are what the wire decoded
(read-only numpy arrays); the context copies them into tensors. A batch from
``persia.data.DataLoader`` arrives with those tensors already built (on the runtime's
event-loop thread, :meth:`PersiaTrainingBatch.build_tensors`), so the training thread
takes them without copying (:meth:`PersiaTrainingBatch.take_tensors`, once).

Layout::

    non_id_type_features  [ndarray (batch, ...), ...]   dtype and shape as the loader sent
    labels                [ndarray (batch, ...), ...]   empty for inference batches
    embeddings            [(slot name, float32 ndarray), ...] in embedding-config slot order
                          summed slot (batch, dim); raw slot (batch, sample_fixed_size, dim + 1)
    reference             (embedding worker index, batch id) to send gradients to, or None
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyrsia.services.nn_worker.features import (
    BatchTensors,
    build_tensors,
    embedding_tensors,
    place,
    to_tensor,
)
from pyrsia.shared.wire.batch import LABEL_DEFAULT_NAME, NON_ID_TYPE_FEATURE_DEFAULT_NAME, DensePart
from pyrsia.shared.wire.gathered import EmbeddingTable, SlotEmbeddings


@dataclass
class PersiaTrainingBatch:
    """Dense features, labels and looked-up embeddings of one batch.

    Built in one way, from the batch's checked dense half (``pyrsia.shared.wire.batch.DensePart``,
    which ``PersiaBatch.dense_part()`` also gives) and the embedding worker's answer; the
    array attributes below are views of the dense half (no copy).
    """

    dense: DensePart
    embeddings: Sequence[tuple[str, np.ndarray]]
    requires_grad: bool
    worker: int | None = None
    batch_id: int | None = None
    device_id: int | None = None
    _release: Callable[[], None] | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _tensors: BatchTensors | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return self.dense.batch_size

    @property
    def tables(self) -> tuple[EmbeddingTable, ...]:
        """The gathered answer's tables (their gradients go back summed per unique vector)."""
        embeddings = self.embeddings
        return embeddings.tables if isinstance(embeddings, SlotEmbeddings) else ()

    @property
    def meta(self) -> bytes | None:
        return self.dense.meta

    @property
    def non_id_type_features(self) -> list[np.ndarray]:
        return [f.data for f in self.dense.non_id_type_features]

    @property
    def labels(self) -> list[np.ndarray]:
        return [f.data for f in self.dense.labels]

    @property
    def non_id_type_feature_names(self) -> list[str]:
        default = NON_ID_TYPE_FEATURE_DEFAULT_NAME
        return [f.name or default for f in self.dense.non_id_type_features]

    @property
    def label_names(self) -> list[str]:
        return [f.name or LABEL_DEFAULT_NAME for f in self.dense.labels]

    @property
    def trainable(self) -> bool:
        """Whether gradients of this batch can be sent (a training lookup kept it for them)."""
        return self.requires_grad and self.batch_id is not None and self.worker is not None

    def hold_permit(self, release: Callable[[], None]) -> None:
        """Attach the embedding-staleness permit this batch holds until its gradients are
        sent (the prefetcher's; ``release()`` gives it back)."""
        self._release = release

    @property
    def permit(self) -> Callable[[], None] | None:
        """The release function of the permit this batch holds (None: it holds none)."""
        return self._release

    def take_release(self) -> Callable[[], None] | None:
        """Hand over the embedding-staleness permit of this batch (at most once)."""
        with self._lock:
            if self._released:
                return None
            self._released = True
            return self._release

    def release(self) -> None:
        """Give back the staleness permit without sending gradients (batch abandoned)."""
        release = self.take_release()
        if release is not None:
            release()

    def build_tensors(self, *, requires_grad: bool) -> None:
        """Build this batch's tensors now (off the training thread), for one ``take_tensors``."""
        self._tensors = build_tensors(
            self.non_id_type_features,
            self.labels,
            self.embeddings,
            requires_grad=requires_grad,
            cuda=self.device_id is not None,
        )

    def take_tensors(self, *, requires_grad: bool) -> BatchTensors | None:
        """The tensors :meth:`build_tensors` made, at most once and only for the same
        ``requires_grad`` (a second forward of a batch needs fresh leaves); else None."""
        tensors, self._tensors = self._tensors, None
        if tensors is None or tensors.requires_grad != requires_grad:
            return None
        return tensors

    def tensors(self, device_id: int | None, *, requires_grad: bool, labels: bool) -> BatchTensors:
        """The batch's tensors on ``device_id``: the prebuilt ones when there are (the
        training thread then only places them), else copies made now. Without ``labels``
        the label list is None (inference)."""
        built = self.take_tensors(requires_grad=requires_grad)
        if built is not None:
            built = place(built, device_id)
        else:
            built = BatchTensors(
                non_id=[to_tensor(a, device_id) for a in self.non_id_type_features],
                labels=[to_tensor(a, device_id) for a in self.labels] if labels else [],
                embeddings=embedding_tensors(list(self.embeddings), device_id, requires_grad),
                requires_grad=requires_grad,
            )
        if not labels:
            built.labels = None
        return built
