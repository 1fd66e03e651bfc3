"""EmbeddingStore semantics: LRU, admission, initialization, dims, skips, validation, shards, memory."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pytest

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, EmbeddingHyperparams, SGDSpec
from pyrsia.shared.errors import ConflictError, InvalidInputError, InvalidTypeError
from pyrsia.shared.wire.ps import PSLookup, PSUpdate


def u64(*xs) -> np.ndarray:
    return np.array(xs, dtype=np.uint64)


def stored(store: EmbeddingStore) -> set[int]:
    return {int(i) for ids, _ in store.export_entries().values() for i in ids}


@pytest.mark.parametrize(
    "batches", [[range(10)], [range(3), range(3, 7), range(7, 10)], [[i] for i in range(10)]]
)
def test_lru_keeps_most_recent_and_refresh_protects(batches):
    store = EmbeddingStore(5, num_shards=1, optimizer=AdagradSpec())
    for b in batches:
        store.lookup(np.array(list(b), dtype=np.uint64), 4, train=True)
    assert stored(store) == {5, 6, 7, 8, 9}
    store.lookup(u64(5), 4, train=True)  # refresh
    store.lookup(u64(10), 4, train=True)
    assert stored(store) == {5, 7, 8, 9, 10}
    assert store.stats()["evictions"] == 6


def test_eval_lookups_and_updates_do_not_refresh():
    store = EmbeddingStore(3, optimizer=SGDSpec(0.1))
    store.lookup(u64(1, 2, 3), 4, train=True)
    store.lookup(u64(1), 4, train=False)
    store.update(u64(1), np.ones((1, 4), np.float32))
    store.lookup(u64(4), 4, train=True)
    assert stored(store) == {2, 3, 4}


def test_hash_table_and_lru_match_a_reference_under_churn():
    """Random training lookups over a small key space (incl. 0 and 2**64-1) against an OrderedDict LRU."""
    rng = np.random.default_rng(3)
    space = np.concatenate([u64(0, 2**64 - 1, 2**63), rng.integers(0, 2**64, 300, dtype=np.uint64)])
    store = EmbeddingStore(100, num_shards=1, optimizer=SGDSpec(0.1))
    ref: OrderedDict[int, None] = OrderedDict()
    for _ in range(60):
        batch = rng.choice(space, size=rng.integers(1, 80))
        store.lookup(batch, 4, train=True)
        for k in batch.tolist():
            ref[k] = None
            ref.move_to_end(k)
            if len(ref) > 100:
                ref.popitem(last=False)
        assert stored(store) == set(ref)
    evals = store.lookup(space, 4, train=False)
    known = np.isin(space, np.array(list(ref), dtype=np.uint64))
    assert np.all(evals[~known] == 0) and np.all(evals[known] != 0)


def test_admission_probability_and_eval_inserts_nothing():
    store = EmbeddingStore(
        200_000,
        hyperparams=EmbeddingHyperparams(admit_probability=0.3),
        optimizer=AdagradSpec(),
        seed=7,
    )
    ids = np.arange(100_000, dtype=np.uint64) * np.uint64(7919)
    out = store.lookup(ids, 2, train=True)
    n = len(store)
    sigma = np.sqrt(100_000 * 0.3 * 0.7)
    assert abs(n - 30_000) < 5 * sigma
    assert store.stats()["admission_refusals"] == 100_000 - n
    refused = ~np.isin(ids, np.array(sorted(stored(store)), dtype=np.uint64))
    assert np.all(out[refused] == 0) and np.all(out[~refused] != 0)
    before = len(store)
    evals = store.lookup(np.arange(10**6, 10**6 + 5000, dtype=np.uint64), 2, train=False)
    assert len(store) == before and np.all(evals == 0)


def test_admit_probability_zero_and_one():
    store = EmbeddingStore(
        100, hyperparams=EmbeddingHyperparams(admit_probability=0.0), optimizer=SGDSpec(0.1)
    )
    assert (
        np.all(store.lookup(np.arange(50, dtype=np.uint64), 4, train=True) == 0) and len(store) == 0
    )
    store.configure(EmbeddingHyperparams(admit_probability=1.0))
    store.lookup(np.arange(50, dtype=np.uint64), 4, train=True)
    assert len(store) == 50


def test_initial_values_depend_only_on_the_id():
    ids = np.random.default_rng(5).integers(0, 2**64, 5000, dtype=np.uint64)
    hp = EmbeddingHyperparams((-0.2, 0.3))
    outs = []
    for shards, seed, order in [
        (1, 1, slice(None)),
        (4, 2, slice(None, None, -1)),
        (3, 3, slice(None)),
    ]:
        store = EmbeddingStore(
            10_000, num_shards=shards, hyperparams=hp, optimizer=AdamSpec(), seed=seed
        )
        out = store.lookup(ids[order], 16, train=True)[order]
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    assert outs[0].min() >= -0.2 and outs[0].max() <= 0.3
    assert abs(outs[0].mean() - 0.05) < 0.005 and outs[0].std() > 0.13  # uniform: std 0.144
    # rows of different ids differ, and element values within a row differ
    assert len(np.unique(outs[0][:, 0])) > 4990 and len(np.unique(outs[0][0])) == 16


def test_optimizer_state_initialized():
    store = EmbeddingStore(10, optimizer=AdagradSpec(initial_accumulator_value=0.25))
    store.lookup(u64(1, 2), 3, train=True)
    ((_, rows),) = store.export_entries().values()
    assert rows.shape == (2, 6) and np.all(rows[:, 3:] == 0.25)
    store = EmbeddingStore(10, optimizer=AdamSpec())
    store.lookup(u64(1, 2), 3, train=True)
    ((_, rows),) = store.export_entries().values()
    assert rows.shape == (2, 10) and np.all(rows[:, 3:] == 0)


def test_dim_change_reinitializes():
    store = EmbeddingStore(10, optimizer=SGDSpec(1.0))
    a8 = store.lookup(u64(1, 2), 8, train=True)
    store.update(u64(1, 2), np.ones((2, 8), np.float32))
    a4 = store.lookup(u64(1, 3), 4, train=True)
    assert store.stats()["reinitialized_dim"] == 1
    assert len(store) == 3 and store.stats()["entries_per_dim"] == {"4": 2, "8": 1}
    fresh = EmbeddingStore(10, optimizer=SGDSpec(1.0)).lookup(u64(1), 4, train=True)
    np.testing.assert_array_equal(a4[0], fresh[0])
    np.testing.assert_array_equal(
        a4[0], a8[0, :4]
    )  # same hash stream: fresh init, not the trained value
    assert np.all(store.lookup(u64(1), 8, train=False) == 0)  # no longer stored at dim 8
    res = store.update(u64(1), np.ones((1, 8), np.float32))
    assert res.skipped_unknown == 1
    # the freed dim-8 row is reused
    store.lookup(u64(9), 8, train=True)
    assert store.stats()["entries_per_dim"] == {"4": 2, "8": 2}


def test_update_skips_unknown_and_nonfinite():
    store = EmbeddingStore(10, optimizer=SGDSpec(0.5))
    before = store.lookup(u64(1, 2, 3), 4, train=True)
    g = np.ones((5, 4), np.float32)
    g[1, 2] = np.nan
    g[2, 0] = np.inf
    res = store.update(u64(1, 2, 3, 77, 78), g)
    assert (res.applied, res.skipped_unknown, res.skipped_nonfinite) == (1, 2, 2)
    after = store.lookup(u64(1, 2, 3), 4, train=False)
    np.testing.assert_allclose(after[0], before[0] - 0.5, rtol=1e-6)
    np.testing.assert_array_equal(after[1:], before[1:])
    s = store.stats()
    assert (s["skipped_unknown"], s["skipped_nonfinite"]) == (2, 2)
    res = store.update(u64(1), np.ones((1, 5), np.float32))  # a dim nothing is stored at
    assert res.skipped_unknown == 1


def test_validation_errors_name_the_field():
    """Bodies are checked once, by pyrsia.shared.wire.ps; the store checks its own arguments."""
    store = EmbeddingStore(10, optimizer=SGDSpec(0.1))
    group = {"dim": 4, "ids": u64(1)}
    for bad in [np.arange(3, dtype=np.int64), np.zeros((2, 2), np.uint64), [1, 2]]:
        with pytest.raises(InvalidInputError, match=r"^groups\[0\]\.ids: expected"):
            PSLookup.from_wire({"train": True, "groups": [{**group, "ids": bad}]})
    for dim in [0, -1, 2.0, True, 1 << 20]:
        with pytest.raises(InvalidInputError, match=r"^groups\[0\]\.dim:"):
            PSLookup.from_wire({"train": True, "groups": [{**group, "dim": dim}]})
    for grads in [np.ones((1, 4)), np.ones(4, np.float32), np.ones((2, 4), np.float32)]:
        with pytest.raises(InvalidInputError, match=r"^groups\[0\]\.grads:"):
            PSUpdate.from_wire({"groups": [{**group, "grads": grads}]})
    with pytest.raises(InvalidInputError, match="^capacity"):
        EmbeddingStore(0)
    with pytest.raises(InvalidInputError, match="^num_hashmap_internal_shards"):
        EmbeddingStore(10, num_shards=0)
    assert len(store) == 0


def test_register_optimizer_rules():
    store = EmbeddingStore(10)
    assert store.optimizer is None
    out = store.lookup(u64(1, 2), 4, train=True)  # allowed before an optimizer
    with pytest.raises(ConflictError, match="no optimizer registered"):
        store.update(u64(1), np.ones((1, 4), np.float32))
    store.register_optimizer(AdagradSpec(initial_accumulator_value=0.5))  # adds state columns
    ((_, rows),) = store.export_entries().values()
    assert rows.shape == (2, 8) and np.all(rows[:, 4:] == 0.5)
    np.testing.assert_array_equal(store.lookup(u64(1, 2), 4, train=False), out)
    store.register_optimizer(AdagradSpec(initial_accumulator_value=0.5))  # same: no-op
    store.register_optimizer(
        AdagradSpec(lr=0.5, initial_accumulator_value=0.5)
    )  # same layout: new params
    assert store.optimizer.lr == 0.5
    with pytest.raises(ConflictError, match="clear it before"):
        store.register_optimizer(SGDSpec(0.1))
    store.clear()
    store.register_optimizer(SGDSpec(0.1))
    assert store.optimizer == SGDSpec(0.1) and len(store) == 0


def test_sharding_spreads_capacity_and_parallel_is_consistent():
    rng = np.random.default_rng(11)
    ids = np.unique(rng.integers(0, 2**64, 50_000, dtype=np.uint64))
    single = EmbeddingStore(100_000, num_shards=1, optimizer=AdagradSpec())
    multi = EmbeddingStore(100_000, num_shards=4, optimizer=AdagradSpec())
    grads = [rng.normal(size=(ids.shape[0], 8)).astype(np.float32) for _ in range(3)]
    for store in (single, multi):
        store.lookup(ids, 8, train=True)
        for g in grads:
            store.update(ids, g)
    np.testing.assert_array_equal(
        single.lookup(ids, 8, train=False), multi.lookup(ids, 8, train=False)
    )
    small = EmbeddingStore(10, num_shards=3, optimizer=SGDSpec(0.1))
    small.lookup(np.arange(1000, dtype=np.uint64), 4, train=True)
    assert len(small) <= 12 and all(s.n == 4 for s in small._shards)
    multi.close()


def test_concurrent_threads():
    store = EmbeddingStore(50_000, num_shards=4, optimizer=SGDSpec(0.01))
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(20):
                ids = np.unique(rng.integers(0, 100_000, 20_000).astype(np.uint64))
                store.lookup(ids, 8, train=True)
                store.update(ids, np.ones((ids.shape[0], 8), np.float32))
                store.lookup(ids, 8, train=False)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(store) == 50_000
    assert len(stored(store)) == 50_000
    store.close()


def test_memory_close_to_raw():
    store = EmbeddingStore(300_000, optimizer=AdagradSpec())
    store.lookup(np.arange(300_000, dtype=np.uint64), 16, train=True)
    s = store.stats()
    assert s["raw_bytes_per_entry"] == 8 + 16 * 4 * 2
    assert s["bytes_per_entry"] / s["raw_bytes_per_entry"] < 1.3


def test_eviction_inside_a_batch_follows_batch_order():
    """A batch that evicts sees recency as of each position: the first new id evicts 0, the LRU
    entry, even though 0 comes later in the same batch (and is then re-inserted, evicting 1)."""
    store = EmbeddingStore(5, num_shards=1, optimizer=SGDSpec(0.1))
    store.lookup(u64(0, 1, 2, 3, 4), 4, train=True)
    store.lookup(u64(10, 0), 4, train=True)
    assert stored(store) == {0, 2, 3, 4, 10}


@pytest.mark.parametrize("admit", [1.0, 0.7])
def test_lru_exact_with_eviction_pool_smaller_than_capacity(admit):
    """Capacity 3000 (eviction pool of 1024 candidates, refilled many times), duplicates in
    batches, hits and misses mixed, some batches evicting and some not: same set as an exact LRU."""
    rng = np.random.default_rng(11)
    space = rng.integers(0, 2**64, 6000, dtype=np.uint64)
    hp = EmbeddingHyperparams(admit_probability=admit)
    store = EmbeddingStore(3000, num_shards=1, hyperparams=hp, optimizer=SGDSpec(0.1), seed=5)
    ref: OrderedDict[int, None] = OrderedDict()
    for step in range(40):
        hot = space[: rng.integers(500, 6000)]
        batch = rng.choice(hot, size=rng.integers(1, 1500))
        store.lookup(batch, 4, train=True)
        kept = stored(store)
        for k in batch.tolist():
            if k in ref:
                ref.move_to_end(k)
            elif admit == 1.0 or k in kept:  # refused ids are never stored (seeded: deterministic)
                ref[k] = None
                if len(ref) > 3000:
                    ref.popitem(last=False)
        assert kept == set(ref), step


class _Owner:
    def __init__(self, rows: np.ndarray):
        from pyrsia.services.embedding_ps.shard import aligned_empty

        self.rows = aligned_empty(rows.shape, rows.dtype)
        self.rows[...] = rows


def test_arrays_grow_in_place_and_keep_their_rows():
    from pyrsia.services.embedding_ps.shard import ALIGN, _grow

    owner = _Owner(np.arange(12, dtype=np.float32).reshape(6, 2))
    assert _grow(owner, "rows", 1000) is True
    assert owner.rows.shape == (1000, 2) and owner.rows.ctypes.data % ALIGN == 0
    assert owner.rows[:6].ravel().tolist() == list(range(12))
    assert not owner.rows[6:].any()  # new rows are zeros
    owner.rows = np.zeros((6, 2), np.float32)  # owns its memory: no aligned buffer under it
    with pytest.raises(InvalidTypeError, match="aligned_empty"):
        _grow(owner, "rows", 1000)


def test_an_array_someone_still_holds_is_copied_not_moved():
    from pyrsia.services.embedding_ps.shard import ALIGN, _grow

    owner = _Owner(np.arange(12, dtype=np.float32).reshape(6, 2))
    view = owner.rows[:3]  # e.g. a reader still looking at the old rows
    assert _grow(owner, "rows", 1000) is False
    assert owner.rows.shape == (1000, 2) and not np.shares_memory(owner.rows, view)
    assert owner.rows.ctypes.data % ALIGN == 0
    assert owner.rows[:6].ravel().tolist() == list(range(12))
    assert view.ravel().tolist() == list(range(6))  # the old array is intact


def test_growth_keeps_rows_zeros_and_the_boundary_wherever_realloc_puts_the_block():
    """realloc may move a small block to another offset from a 64-byte boundary: the rows
    are then shifted back onto one (it happens a few times in these 300 growths)."""
    from pyrsia.services.embedding_ps.shard import ALIGN, _grow

    owner = _Owner(np.empty((0, 3), np.float32))
    for step in range(300):
        m = owner.rows.shape[0]
        owner.rows[:] = np.arange(m * 3, dtype=np.float32).reshape(m, 3)
        assert _grow(owner, "rows", m + 7 + step) is True
        assert owner.rows.ctypes.data % ALIGN == 0, step
        assert owner.rows[:m].ravel().tolist() == list(range(m * 3)), step
        assert not owner.rows[m:].any(), step


def test_every_arena_row_of_a_grown_store_starts_on_a_cache_line():
    """dim 16 with Adagrad: 128-byte rows, each on 2 cache lines rather than 3."""
    from pyrsia.services.embedding_ps.shard import ALIGN

    store = EmbeddingStore(1 << 20, num_shards=2, optimizer=AdagradSpec())
    store.lookup(np.arange(1, 50_001, dtype=np.uint64), 16, train=True)
    arenas = [a for shard in store._shards for a in shard.arenas if a is not None]
    assert arenas and all(a.data.ctypes.data % ALIGN == 0 for a in arenas)
    assert all(a.data.strides[0] % ALIGN == 0 for a in arenas)
    assert all(s.ent.ctypes.data % ALIGN == 0 for s in store._shards)


def test_a_store_growing_to_many_entries_never_copies_its_arrays(monkeypatch):
    """The store's own growth path holds no other reference, so every growth is in place
    (a copy would write the table again: 38 copies and 1 s of CPU on the Criteo benchmark)."""
    from pyrsia.services.embedding_ps import shard

    grown: list[tuple[str, bool]] = []
    real = shard._grow

    def recording(owner, name, n):
        grown.append((name, real(owner, name, n)))
        return grown[-1][1]

    monkeypatch.setattr(shard, "_grow", recording)
    store = EmbeddingStore(1 << 20, num_shards=1, optimizer=AdagradSpec())
    ids = np.arange(1, 200_001, dtype=np.uint64) * np.uint64(2654435761)
    first = np.array(store.lookup(ids[:10_000], 8, train=True))
    for chunk in np.array_split(ids[10_000:], 19):
        store.lookup(chunk, 8, train=True)
    assert {name for name, _ in grown} >= {"data", "ent"}
    assert all(in_place for _, in_place in grown), grown
    again = store.lookup(ids[:10_000], 8, train=False)
    np.testing.assert_array_equal(again, first)  # the first rows survived every growth
