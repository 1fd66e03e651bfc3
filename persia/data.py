"""Datasets and the data loader of the training loop (PERSIA's ``persia.data`` API).

- :class:`StreamingDataset`: the batches data loaders push to this rank (``DataCtx``).
  It ends by itself once every data loader said it is done.
- :class:`IterableDataset`: subclass it and yield :class:`PersiaBatch` es from
  ``__iter__`` (test sets, local data); lookups take the direct path, and a batch with
  ``requires_grad=False`` inserts nothing on the servers.
- :class:`DataLoader`: looks embeddings up ahead of the loop and yields
  :class:`PersiaTrainingBatch` es for ``ctx.forward`` / ``ctx.prepare_features``.
  Iterate it inside a context (``TrainCtx``, ``eval_ctx``, ``InferCtx``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from persia import env
from persia.ctx import BaseCtx, EmbeddingCtx, PreprocessMode, TrainCtx, cnt_ctx
from persia.embedding.data import PersiaBatch
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.even_steps import EvenSteps, agreeing
from pyrsia.services.nn_worker.prefetch import IteratorReader, Prefetcher
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import positive_int

__all__ = [
    "DataLoader",
    "IterableDataset",
    "IterableDatasetBase",
    "PersiaTrainingBatch",
    "StreamingDataset",
]

_logger = logging.getLogger(__name__)


class IterableDatasetBase:
    """Base of the datasets a :class:`DataLoader` accepts.

    Arguments:
        buffer_size: batches read ahead of the embedding lookups (for a StreamingDataset:
            the bound of this rank's ingress queue; a full queue answers 429 to the loaders).
    """

    def __init__(self, buffer_size: int = 10):
        self.buffer_size = positive_int(buffer_size, "buffer_size")

    def consume_dataset(self) -> Iterator[int]:
        """PERSIA's hook: the indexes of the batches this dataset produces, in order.

        :class:`DataLoader` reads the dataset itself; this is for PERSIA code that calls it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement consume_dataset")


class StreamingDataset(IterableDatasetBase):
    """Batches pushed to this NN-worker rank by the data loaders; ends when all are done."""

    def __iter__(self):
        raise TypeError("a StreamingDataset is read through persia.data.DataLoader(dataset)")

    def consume_dataset(self) -> Iterator[int]:
        """0, 1, 2, ... without end: the batches come from the data loaders, read by DataLoader."""
        index = 0
        while True:
            yield index
            index += 1


class IterableDataset(IterableDatasetBase):
    """Implement ``__iter__`` to yield :class:`PersiaBatch` es (it is read in a helper thread)."""

    def __iter__(self) -> Iterator[PersiaBatch]:
        raise NotImplementedError(
            f"{type(self).__name__} must implement __iter__ yielding PersiaBatch"
        )

    def consume_dataset(self) -> Iterator[int]:
        """Iterate the dataset once, checking each item, and yield its index."""
        for index, item in enumerate(self):
            _check_batch(item)
            yield index


def _check_batch(item) -> PersiaBatch:
    if not isinstance(item, PersiaBatch):
        raise TypeError(
            f"the dataset yielded {type(item).__name__}: expected persia.embedding.data.PersiaBatch"
        )
    return item


class DataLoader:
    """Yields :class:`PersiaTrainingBatch` es with their embeddings looked up ahead of time.

    Arguments:
        dataset: a :class:`StreamingDataset` or an :class:`IterableDataset`.
        forward_buffer_size: looked-up batches kept ready ahead of the loop.
        is_training: with False, batches are looked up without gradients even inside a
            TrainCtx (PERSIA's argument); in a plain BaseCtx lookups never train.
        timeout_ms: longest wait for the next batch; then the loop ends with a warning
            naming the timeout and the batches yielded, as PERSIA's did.
        num_workers: embedding lookups in flight at once.
        reproducible: hand streamed batches out in batch-id order (rank, rank + world
            size, ...); with ``embedding_staleness=1`` a run repeats bit for bit.
        embedding_staleness: most training batches whose embeddings are out while their
            gradients are not yet applied (None: no bound).
    """

    def __init__(self, dataset: IterableDatasetBase, forward_buffer_size: int = 10, is_training: bool = True,
                 timeout_ms: int = 1000 * 60 * 10, num_workers: int = 10, reproducible: bool = False,
                 embedding_staleness: int | None = None):  # fmt: skip
        if not isinstance(dataset, IterableDatasetBase):
            raise TypeError(
                f"dataset: expected persia.data.StreamingDataset or IterableDataset, got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.forward_buffer_size = positive_int(forward_buffer_size, "forward_buffer_size")
        self.timeout_ms = positive_int(timeout_ms, "timeout_ms")
        self.num_workers = positive_int(num_workers, "num_workers")
        if not isinstance(reproducible, bool):
            raise InvalidInputError("reproducible", "true or false", reproducible)
        self.reproducible = reproducible
        if not isinstance(is_training, bool):
            raise InvalidInputError("is_training", "true or false", is_training)
        self.is_training = is_training
        self.embedding_staleness = (
            None
            if embedding_staleness is None
            else positive_int(embedding_staleness, "embedding_staleness")
        )

    def __iter__(self) -> Iterator[PersiaTrainingBatch]:
        ctx = cnt_ctx()
        if not isinstance(ctx, BaseCtx) or (
            not isinstance(ctx, EmbeddingCtx) and not isinstance(self.dataset, StreamingDataset)
        ):
            raise RuntimeError(
                "iterate a persia DataLoader inside a context: `with TrainCtx(...)`, `eval_ctx(...)` or `InferCtx(...)`"
                " (a StreamingDataset may also be read inside a plain BaseCtx)"
            )
        prefetcher = self._prefetcher(ctx).start()
        timeout_s = self.timeout_ms / 1000.0
        yielded = 0

        def fetch() -> PersiaTrainingBatch | None:
            try:
                return prefetcher.next(timeout_s)
            except TimeoutError:
                _logger.warning(
                    "DataLoader: no batch within timeout_ms=%d after %d batch(es): ending the "
                    "loop, as PERSIA did; are the data loaders running?",
                    self.timeout_ms,
                    yielded,
                )
                return None

        # streamed training on several ranks: every rank takes the same number of steps
        even = (
            EvenSteps(ctx, fetch)
            if isinstance(self.dataset, StreamingDataset)
            and isinstance(ctx, TrainCtx)
            and agreeing(ctx.world_size)
            else None
        )
        try:
            while True:
                batch = fetch() if even is None else even.next()
                if batch is None:
                    return
                yielded += 1
                yield batch
        finally:
            if even is not None:
                even.close()
            prefetcher.close()

    def _prefetcher(self, ctx: BaseCtx) -> Prefetcher:
        session = ctx.session if isinstance(ctx, EmbeddingCtx) else ctx.common_context.session
        client = session.client
        train = (
            isinstance(ctx, EmbeddingCtx)
            and ctx.preprocess_mode == PreprocessMode.TRAIN
            and self.is_training
        )
        staleness = self.embedding_staleness if train else None
        common = dict(
            num_workers=self.num_workers, buffer_size=self.forward_buffer_size,
            staleness=staleness, just_in_time=train,
            on_wait=session.stats.waited if train else None,  # the rank's lookup wait
        )  # fmt: skip
        if isinstance(self.dataset, StreamingDataset):
            queue = session.ingress(rank=env.get_rank() or 0, world_size=env.get_world_size() or 1,
                                    capacity=self.dataset.buffer_size, reproducible=self.reproducible)  # fmt: skip

            async def lookup_streamed(item) -> PersiaTrainingBatch:
                embeddings, trainable = await client.lookup(
                    item.worker, item.batch_id, train, item.dense.batch_size, gathered=True
                )
                batch = PersiaTrainingBatch(
                    item.dense, embeddings.embeddings, trainable,
                    worker=item.worker if trainable else None,
                    batch_id=item.batch_id if trainable else None, device_id=ctx.device_id,
                )  # fmt: skip
                batch.build_tensors(requires_grad=train)  # here, off the training thread
                return batch

            return Prefetcher(
                session.runtime, fetch_next=queue.get, lookup=lookup_streamed, **common
            )

        reader = IteratorReader(iter(self.dataset), self.dataset.buffer_size, _check_batch)

        async def lookup_direct(batch: PersiaBatch) -> PersiaTrainingBatch:
            answer, worker = await client.lookup_direct(
                batch.id_part(), train and batch.requires_grad, gathered=True
            )
            looked_up = PersiaTrainingBatch(
                batch.dense_part(), answer.embeddings, batch.requires_grad,
                worker=worker if answer.batch_id is not None else None,
                batch_id=answer.batch_id, device_id=ctx.device_id,
            )  # fmt: skip
            looked_up.build_tensors(requires_grad=train)  # here, off the training thread
            return looked_up

        return Prefetcher(session.runtime, fetch_next=reader.next, lookup=lookup_direct,
                          on_close=lambda: reader.close(session.runtime), **common)  # fmt: skip
