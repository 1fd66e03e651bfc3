"""A PS store's batch spread over threads (``embedding_ps/parallel.py``) gives the serial result
bit for bit: lookups, updates, counters and stored rows, under duplicates, new ids, refused
admissions, evictions inside a batch, dim changes and skipped updates; plus the split, the
dealing of shards to threads, errors in a thread, and the thread setting's validation."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pyrsia.services.embedding_ps import parallel
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.parallel import (
    MAX_THREADS,
    ShardRunner,
    deal,
    resolve_threads,
    split_positions,
)
from pyrsia.services.embedding_ps.table import shard_of
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, EmbeddingHyperparams, SGDSpec
from pyrsia.shared.errors import InvalidInputError


@pytest.mark.parametrize("num_shards", [1, 2, 3, 7, 64])
def test_split_is_a_stable_sort_by_shard(num_shards):
    rng = np.random.default_rng(num_shards)
    ids = np.concatenate(
        [np.array([0, 2**64 - 1, 2**63], np.uint64), rng.integers(0, 2**64, 5000, np.uint64)]
    )
    ids = np.concatenate([ids, ids[:700]])  # duplicates
    order, starts = split_positions(ids, num_shards)
    expected = np.argsort(shard_of(ids, num_shards), kind="stable")
    np.testing.assert_array_equal(order, expected)
    np.testing.assert_array_equal(
        np.diff(starts), np.bincount(shard_of(ids, num_shards), minlength=num_shards)
    )
    empty_order, empty_starts = split_positions(np.empty(0, np.uint64), num_shards)
    assert empty_order.shape == (0,) and not empty_starts.any()


@pytest.mark.parametrize(
    "sizes,groups",
    [
        ([5], 4),
        ([1, 1, 1, 1], 2),
        ([100, 1, 1, 1], 2),
        ([3, 3, 3, 3, 3, 3, 3], 3),
        ([4999, 5001], 2),  # a first shard a little under half still gets its own thread
        ([10, 30, 10, 10], 2),
        (list(range(1, 65)), 2),
        ([7] * 64, 16),
    ],
)
def test_deal_gives_every_thread_a_run_of_about_equal_size(sizes, groups):
    runs = deal(sizes, groups)
    assert [i for run in runs for i in run] == list(range(len(sizes)))
    assert len(runs) == min(groups, len(sizes)) and all(runs)
    share = sum(sizes) / groups
    assert max(sum(sizes[i] for i in run) for run in runs) <= share + max(sizes)


def _workload(store: EmbeddingStore, seed: int) -> list:
    """Every answer of a mixed sequence of calls, then the counters and the stored rows."""
    rng = np.random.default_rng(seed)
    space = rng.integers(0, 2**64, 3000, dtype=np.uint64)
    answers: list = []
    for step in range(12):
        ids = rng.choice(space, size=int(rng.integers(2000, 6000)))  # duplicates, new ids
        dim = 8 if step % 5 else 4  # dim 4 now and then: ids re-initialized at another dim
        answers.append(store.lookup(ids, dim, train=True))
        uniq = np.unique(ids)
        grads = rng.normal(size=(uniq.shape[0] + 50, dim)).astype(np.float32)
        grads[rng.integers(0, grads.shape[0], 20)] = np.nan  # skipped, counted
        extra = rng.integers(0, 2**64, 50, dtype=np.uint64)  # mostly unknown: skipped
        result = store.update(np.concatenate([uniq, extra]), grads)
        answers.append(result)
        answers.append(store.lookup(space[:2500], 8, train=False))
    answers.append(store.stats())
    answers.append(store.lookup_counters())
    for dim, (ids, rows) in sorted(store.export_entries().items()):
        order = np.argsort(ids)
        answers.append((dim, ids[order], rows[order]))
    return answers


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))
        elif isinstance(x, tuple):
            _assert_same(list(x), list(y))
        else:
            assert x == y


@pytest.mark.parametrize(
    "optimizer,admit,num_shards",
    [(AdagradSpec(), 1.0, 2), (AdamSpec(), 0.6, 3), (SGDSpec(0.1, momentum=0.9), 0.9, 5)],
)
def test_parallel_store_equals_serial_store_bit_for_bit(monkeypatch, optimizer, admit, num_shards):
    """Capacity below the ids seen, so batches evict; admission refuses some ids."""
    monkeypatch.setattr(parallel, "PARALLEL_MIN_IDS", 1)
    hp = EmbeddingHyperparams(admit_probability=admit, weight_bound=0.5)
    stores = [EmbeddingStore(1800, num_shards, hp, optimizer, seed=7, threads=t) for t in (1, 2)]
    assert [s.threads for s in stores] == [1, 2]
    serial, threaded = (_workload(s, seed=num_shards) for s in stores)
    assert any(t.name.startswith("ps-shard") for t in threading.enumerate())
    stats = next(x for x in serial if isinstance(x, dict) and "evictions" in x)
    assert stats["evictions"] > 0 and stats["reinitialized_dim"] > 0
    assert stats["skipped_nonfinite"] > 0 and stats["skipped_unknown"] > 0
    assert (stats["admission_refusals"] > 0) == (admit < 1)
    _assert_same(serial, threaded)
    for s in stores:
        s.close()


def test_a_store_has_no_more_threads_than_shards_and_defaults_to_the_node_default():
    assert EmbeddingStore(100, num_shards=2, threads=8).threads == 2
    assert EmbeddingStore(100, num_shards=64).threads == parallel.default_threads()
    assert EmbeddingStore(100, num_shards=1).threads == 1


@pytest.mark.parametrize("bad", [0, -1, MAX_THREADS + 1, True, 2.0, "2", None])
def test_the_thread_setting_is_checked_and_named(bad):
    if bad is None:
        assert resolve_threads(None) == parallel.default_threads()
        return
    with pytest.raises(InvalidInputError, match=r"^threads: expected an integer in \[1, 64\]"):
        EmbeddingStore(100, num_shards=2, threads=bad)
    with pytest.raises(InvalidInputError, match="^--threads"):
        resolve_threads(bad, "--threads")


def test_runner_uses_its_threads_keeps_shard_order_and_raises_after_every_group():
    runner = ShardRunner(3, min_ids=1)
    parts = [np.arange(k, dtype=np.int64) for k in (4, 0, 4, 4, 4, 4)]
    seen: list[str] = []
    together = threading.Barrier(3, timeout=30)  # each group's thread waits for the others

    def fn(i: int, pos: np.ndarray) -> int:
        name = threading.current_thread().name
        if name not in seen and not together.broken:
            together.wait()
        seen.append(name)
        return i

    assert runner.run(fn, parts) == [0, 2, 3, 4, 5]
    assert len(set(seen)) == 3
    done: list[int] = []

    def failing(i: int, pos: np.ndarray) -> int:
        if i == 2:  # the last shard of the calling thread's group
            raise ValueError("shard 2 failed")
        done.append(i)
        return i

    with pytest.raises(ValueError, match="shard 2 failed"):
        runner.run(failing, parts)
    assert sorted(done) == [0, 3, 4, 5]  # the other groups finished before the raise
    runner.close()
    seen.clear()
    together.abort()  # no waiting from here on
    assert runner.run(fn, parts) == [0, 2, 3, 4, 5]  # closed: the calling thread alone
    assert set(seen) == {threading.current_thread().name}


def test_small_batches_stay_on_the_calling_thread():
    runner = ShardRunner(2, min_ids=100)
    names: set[str] = set()
    parts = [np.arange(40, dtype=np.int64), np.arange(40, dtype=np.int64)]
    runner.run(lambda i, p: names.add(threading.current_thread().name), parts)
    assert names == {threading.current_thread().name}
    runner.close()
