"""Datasets and the data loader of the training loop (PERSIA's ``persia.data`` API).

- :class:`StreamingDataset`: the batches data loaders push to this rank (``DataCtx``).
  It ends by itself once every data loader said it is done.
- :class:`IterableDataset`: subclass it and yield :class:`PersiaBatch` es from
  ``__iter__`` (test sets, local data); lookups take the direct path, and a batch with
  ``requires_grad=False`` inserts nothing on the servers.
- :class:`DataLoader`: looks embeddings up ahead of the loop and yields
  :class:`PersiaTrainingBatch` es for ``ctx.forward`` / ``ctx.prepare_features``.
  Iterate it inside a context (``TrainCtx``, ``eval_ctx``, ``InferCtx``).

The path of a batch: the DataLoader builds a source from the context's session
(:class:`~pyrsia.services.nn_worker.lookups.StreamedLookups` over this rank's ingress queue,
or :class:`~pyrsia.services.nn_worker.lookups.DirectLookups` over the dataset's iterator)
and a :class:`~pyrsia.services.nn_worker.prefetch.Prefetcher` that reads it ahead of the
loop; on several ranks, :class:`~pyrsia.services.nn_worker.even_steps.EvenSteps` keeps
their steps in lockstep.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from persia import env
from persia.ctx import BaseCtx, EmbeddingCtx, PreprocessMode, TrainCtx, cnt_ctx
from persia.embedding.data import PersiaBatch
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.even_steps import EvenSteps, agreeing
from pyrsia.services.nn_worker.lookups import DirectLookups, StreamedLookups
from pyrsia.services.nn_worker.prefetch import Prefetcher
from pyrsia.services.nn_worker.session import TrainingLoopClass
from pyrsia.shared.constants import AUTO_EMBEDDING_STALENESS, DATALOADER_TIMEOUT_MS
from pyrsia.shared.errors import InvalidInputError, InvalidTypeError, MisuseError
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
        raise InvalidTypeError(
            "StreamingDataset",
            "persia.data.DataLoader(dataset) to read it",
            message="a StreamingDataset is read through persia.data.DataLoader(dataset)",
        )

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
        raise InvalidTypeError(
            "dataset item",
            "persia.embedding.data.PersiaBatch",
            message=f"the dataset yielded {type(item).__name__}: "
            "expected persia.embedding.data.PersiaBatch",
        )
    return item


class DataLoader:
    """Yields :class:`PersiaTrainingBatch` es with their embeddings looked up ahead of time.

    Arguments:
        dataset: a :class:`StreamingDataset` or an :class:`IterableDataset`.
        forward_buffer_size: looked-up batches kept ready ahead of the loop.
        timeout_ms: longest wait for the next batch; then the loop ends with a warning
            naming the timeout and the batches yielded, as PERSIA's did.
        num_workers: embedding lookups in flight at once.
        reproducible: hand streamed batches out in batch-id order (rank, rank + world
            size, ...); with ``embedding_staleness=1`` a run repeats bit for bit.
        embedding_staleness: most training batches whose embeddings are out while their
            gradients are not yet applied. None (the default): the automatic bound,
            ``AUTO_EMBEDDING_STALENESS`` (8) per rank, under which the measured window
            keeps what the latencies need; PERSIA's None is no bound, which trained less
            accurately here (docs/concepts/staleness.md, "Defaults").
        is_training: keyword only (PERSIA's current DataLoader no longer takes it, and its
            positional order is the one above): with False, batches are looked up without
            gradients even inside a TrainCtx; in a plain BaseCtx lookups never train.
    """

    def __init__(
        self,
        dataset: IterableDatasetBase,
        forward_buffer_size: int = 10,
        timeout_ms: int = DATALOADER_TIMEOUT_MS,
        num_workers: int = 10,
        reproducible: bool = False,
        embedding_staleness: int | None = None,
        *,
        is_training: bool = True,
    ):
        if not isinstance(dataset, IterableDatasetBase):
            raise InvalidTypeError(
                "dataset", "persia.data.StreamingDataset or IterableDataset", type(dataset).__name__
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

    @property
    def staleness_bound(self) -> int:
        """The staleness bound a training iteration applies: ``embedding_staleness``, or the
        automatic bound when it is None."""
        if self.embedding_staleness is None:
            return AUTO_EMBEDDING_STALENESS
        return self.embedding_staleness

    def __iter__(self) -> Iterator[PersiaTrainingBatch]:
        ctx = cnt_ctx()
        if not isinstance(ctx, BaseCtx) or (
            not isinstance(ctx, EmbeddingCtx) and not isinstance(self.dataset, StreamingDataset)
        ):
            raise MisuseError(
                "iterate a persia DataLoader inside a context: `with TrainCtx(...)`, `eval_ctx(...)` or `InferCtx(...)`"
                " (a StreamingDataset may also be read inside a plain BaseCtx)"
            )
        prefetcher = self._prefetcher(ctx).start()
        timeout_s = self.timeout_ms / 1000.0
        yielded = 0
        loop_class = (
            TrainingLoopClass(ctx.session)
            if isinstance(ctx, TrainCtx) and self.is_training
            else None
        )

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
                if loop_class is not None:
                    loop_class.settle()
                yielded += 1
                yield batch
        finally:
            if loop_class is not None:
                loop_class.release()
            if even is not None:
                even.close()
            prefetcher.close()

    def _prefetcher(self, ctx: BaseCtx) -> Prefetcher:
        """The path of this loader's batches: a source (``StreamedLookups`` from this rank's
        ingress, or ``DirectLookups`` of the dataset's iterator) read by a Prefetcher."""
        session = ctx.session if isinstance(ctx, EmbeddingCtx) else ctx.common_context.session
        train = (
            isinstance(ctx, EmbeddingCtx)
            and ctx.preprocess_mode == PreprocessMode.TRAIN
            and self.is_training
        )
        source: StreamedLookups | DirectLookups
        if isinstance(self.dataset, StreamingDataset):
            queue = session.ingress(
                rank=env.get_rank() or 0,
                world_size=env.get_world_size() or 1,
                capacity=self.dataset.buffer_size,
                reproducible=self.reproducible,
            )
            source = StreamedLookups(queue, session.client, train=train, device_id=ctx.device_id)
        else:
            source = DirectLookups(
                iter(self.dataset),
                self.dataset.buffer_size,
                _check_batch,
                session.client,
                train=train,
                device_id=ctx.device_id,
            )
        return Prefetcher(
            session.runtime,
            source,
            num_workers=self.num_workers,
            buffer_size=self.forward_buffer_size,
            staleness=self.staleness_bound if train else None,
            just_in_time=train,
            on_wait=session.stats.waited if train else None,  # the rank's lookup wait
            before_wait=ctx.training_step.hand_over
            if train and isinstance(ctx, TrainCtx)
            else None,
            ranks=env.get_world_size() or 1,  # the ranks share the staleness window
        )
