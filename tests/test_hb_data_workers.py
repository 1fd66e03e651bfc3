"""hb.data over an IterableDataset: every sample exactly once across DataLoader workers and ranks.

torch replicates an ``IterableDataset`` in each DataLoader worker process; hb.data splits
the stream across ranks and workers itself, so ``num_workers`` never repeats a sample.
"""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.data import DataLoader, IterableDataset

import persia.hb as hb
from persia.hb.data import _RankShare
from pyrsia.shared.errors import InvalidInputError


@pytest.fixture(autouse=True)
def fresh_options():
    hb.context.options.reload_env({})
    yield
    hb.context.options.reload_env({})


class Stream(IterableDataset):
    """The whole stream in every process (the dataset does not split itself)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


# this machine has 2 cores: torch warns that 3 workers are more than it suggests
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_iterable_dataset_yields_each_sample_once_across_workers(num_workers):
    iterator = hb.data.make_one_shot_iterator(Stream(23), batch_size=4, num_workers=num_workers)
    seen = Counter(int(x) for batch in iterator for x in batch)
    assert seen == Counter(range(23))


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_rank_and_worker_shares_compose_to_the_source_once(num_workers):
    seen: Counter[int] = Counter()
    for rank in range(2):
        loader = DataLoader(_RankShare(Stream(31), rank, 2), batch_size=3, num_workers=num_workers)
        seen.update(int(x) for batch in loader for x in batch)
    assert seen == Counter(range(31))


def test_num_workers_is_validated():
    with pytest.raises(InvalidInputError, match="num_workers"):
        hb.data.make_one_shot_iterator(Stream(3), batch_size=2, num_workers=-1)
