"""``hb.data``: each rank's share of a torch dataset, as TF-style iterators.

::

    it = hb.data.make_one_shot_iterator(dataset, batch_size=256)      # one pass
    for batch in it: ...

    it = hb.data.make_initializable_iterator(eval_dataset, batch_size=1024)
    it.initialize()                     # (re)start a pass; initialize(epoch=e) reshuffles
    for batch in it: ...

A map-style dataset is split by index: rank ``r`` takes every ``world_size``-th sample
from ``r`` on, after an optional shuffle (``seed`` >= 0) that every rank draws
identically; no sample is repeated. An ``IterableDataset`` is split round-robin by
sample, across ranks and then across the ``num_workers`` DataLoader worker processes of
each rank, so every sample is read once in all (its ``__iter__`` must yield the whole
stream in every process: a dataset that also splits itself by
``torch.utils.data.get_worker_info()`` would lose samples). With
``data_sync_drop_remainder`` (default true) every rank yields the same number of
batches, so no rank waits in an all-reduce that another rank never joins: the map-style
split drops the last ``len % world_size`` samples, and an iterable split stops every
rank when the shortest one ends (one one-element all-reduce per batch). Without it (evaluation: every sample counted exactly once) the shares differ by at
most one sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from persia.hb._context import context
from pyrsia.shared.errors import InvalidInputError, MisuseError

__all__ = ["InitializableIterator", "make_initializable_iterator", "make_one_shot_iterator"]


class _ShareSampler(Sampler[int]):
    """Indices of this rank's share of a map-style dataset (shuffled per epoch when seeded)."""

    def __init__(self, length: int, rank: int, world_size: int, seed: int, drop_remainder: bool):
        self.length, self.rank, self.world_size = length, rank, world_size
        self.seed, self.drop_remainder, self.epoch = seed, drop_remainder, 0

    def _order(self) -> torch.Tensor:
        if self.seed < 0:
            return torch.arange(self.length)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator)

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        if self.drop_remainder:
            order = order[: self.length - self.length % self.world_size]
        return iter(order[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        usable = self.length - (self.length % self.world_size if self.drop_remainder else 0)
        return max(0, (usable - self.rank + self.world_size - 1) // self.world_size)


class _RankShare(IterableDataset):
    """This rank's share of an iterable dataset, split again across DataLoader workers.

    Sample ``i`` of the stream goes to rank ``i % world_size``; within the rank, its
    ``j``-th sample goes to worker ``j % num_workers``. Both splits compose into one
    stride: worker ``w`` of rank ``r`` takes samples ``r + world_size * w`` on, every
    ``world_size * num_workers``-th. Without the worker split, torch replicates an
    ``IterableDataset`` in each worker process and every sample would come once per
    worker (torch.utils.data documents that the dataset must split itself; here
    hb.data does it, so the dataset must not).
    """

    def __init__(self, dataset: IterableDataset, rank: int, world_size: int):
        self.dataset, self.rank, self.world_size = dataset, rank, world_size

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        stride = self.world_size * num_workers
        return itertools.islice(
            iter(self.dataset), self.rank + self.world_size * worker_id, None, stride
        )


def _batch_size(batch_size: int | None) -> int:
    size = context.options.batch_size if batch_size is None else batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InvalidInputError(
            "batch_size", "an integer >= 1 (or set hb.context.options.batch_size)", size
        )
    return size


def _all_ranks_have(has_batch: bool) -> bool:
    """True while every rank still has a batch (MIN all-reduce of one flag)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return has_batch
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    flag = torch.tensor([1 if has_batch else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class InitializableIterator:
    """This rank's batches of ``dataset``; :meth:`initialize` starts (or restarts) a pass."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = None,
        *,
        collate_fn: Callable[[list], Any] | None = None,
        num_workers: int = 0,
        drop_remainder: bool | None = None,
        seed: int | None = None,
    ):
        if not isinstance(dataset, Dataset):
            raise InvalidInputError("dataset", "a torch.utils.data.Dataset", type(dataset).__name__)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise InvalidInputError(
                "num_workers", "an integer >= 0 (DataLoader worker processes)", num_workers
            )
        options = context.options
        self.dataset = dataset
        self.batch_size = _batch_size(batch_size)
        self.sync = (
            options.data_sync_drop_remainder if drop_remainder is None else bool(drop_remainder)
        )
        self.seed = options.seed if seed is None else seed
        self.rank, self.world_size = context.rank, context.world_size
        self._iterable = isinstance(dataset, IterableDataset)
        self._sampler = None
        if self._iterable:
            source: Dataset = _RankShare(dataset, self.rank, self.world_size)
        else:
            source = dataset
            self._sampler = _ShareSampler(
                len(dataset),
                self.rank,
                self.world_size,
                self.seed,
                self.sync,  # type: ignore[arg-type]
            )
        self._loader = DataLoader(
            source,
            batch_size=self.batch_size,
            sampler=self._sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            drop_last=False,
        )
        self._it: Iterator[Any] | None = None
        if self._iterable and self.sync and self.world_size > 1:
            context.init_process_group()  # the per-batch "every rank has one" all-reduce

    def initialize(self, epoch: int = 0) -> None:
        """Start a pass over this rank's share (``epoch`` reseeds the shuffle)."""
        if self._sampler is not None:
            self._sampler.epoch = epoch
        self._it = iter(self._loader)

    initializer = initialize  # TF's spelling: ``sess.run(iterator.initializer)``

    def get_next(self) -> Any:
        """The next batch; StopIteration at the end of the pass (on every rank together)."""
        if self._it is None:
            raise MisuseError("InitializableIterator: call initialize() before get_next()")
        batch = next(self._it, None)
        if self._iterable and self.sync and not _all_ranks_have(batch is not None):
            self._it = None
            raise StopIteration
        if batch is None:
            self._it = None
            raise StopIteration
        return batch

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            raise StopIteration
        return self.get_next()

    def __len__(self) -> int:
        """Batches per pass on this rank (map-style datasets only)."""
        return len(self._loader)


def make_initializable_iterator(
    dataset: Dataset, batch_size: int | None = None, **kwargs: Any
) -> InitializableIterator:
    """An :class:`InitializableIterator` (call ``initialize()`` before each pass)."""
    return InitializableIterator(dataset, batch_size, **kwargs)


def make_one_shot_iterator(
    dataset: Dataset, batch_size: int | None = None, **kwargs: Any
) -> InitializableIterator:
    """One pass over this rank's share of ``dataset``, already initialized."""
    iterator = InitializableIterator(dataset, batch_size, **kwargs)
    iterator.initialize()
    return iterator
