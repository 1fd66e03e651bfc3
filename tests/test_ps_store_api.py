"""The PS store's public surface: the snapshot ``stats()`` renders and the bulk protocol.

Checkpoints, packets and checksums see a store only through ``bulk.BulkStore``; ``/stats``
only through ``store_stats.StoreSnapshot``. These tests pin both surfaces on a real store.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from pyrsia.services.embedding_ps.bulk import BulkStore
from pyrsia.services.embedding_ps.checksum import store_checksum
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.store_stats import StoreSnapshot
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec


def _trained(num_shards: int) -> EmbeddingStore:
    store = EmbeddingStore(1_000, num_shards=num_shards, optimizer=AdagradSpec())
    ids = np.arange(1, 301, dtype=np.uint64)
    store.lookup(ids[:200], 4, train=True)
    store.lookup(ids[200:], 8, train=True)
    store.update(ids[:50], np.ones((50, 4), np.float32))
    store.update(np.arange(5_000, 5_003, dtype=np.uint64), np.ones((3, 4), np.float32))
    return store


@pytest.mark.parametrize("num_shards", [1, 4])
def test_stats_are_the_snapshot_rendered(num_shards: int) -> None:
    store = _trained(num_shards)
    snap = store.snapshot()
    assert isinstance(snap, StoreSnapshot) and store.stats() == snap.to_stats()
    assert snap.entries == 300 and snap.entries_per_dim == {4: 200, 8: 100}
    assert (snap.updates_applied, snap.skipped_unknown, snap.admitted) == (50, 3, 300)
    assert snap.row_widths == {4: 8, 8: 16}  # Adagrad keeps one accumulator per element
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.entries = 0  # type: ignore[misc]


def test_row_width_follows_the_optimizer() -> None:
    assert EmbeddingStore(10).row_width(4) == 4
    assert EmbeddingStore(10, optimizer=AdagradSpec()).row_width(4) == 8
    store = EmbeddingStore(10, optimizer=AdamSpec())
    store.lookup(np.arange(3, dtype=np.uint64), 4, train=True)
    assert store.export_entries()[4][1].shape[1] == store.row_width(4)


def test_the_store_implements_the_bulk_protocol() -> None:
    members = [n for n in vars(BulkStore) if not n.startswith("_") or n == "__len__"]
    members += list(BulkStore.__annotations__)
    store = EmbeddingStore(10)
    for name in members:
        assert hasattr(store, name), name
        if inspect.isfunction(vars(BulkStore).get(name)):
            expected = inspect.signature(vars(BulkStore)[name]).parameters
            assert list(inspect.signature(getattr(EmbeddingStore, name)).parameters) == list(
                expected
            ), name


@pytest.mark.parametrize("num_shards", [1, 4])
def test_bulk_round_trip_through_the_protocol(num_shards: int) -> None:
    source = _trained(num_shards)
    target = EmbeddingStore(1_000, num_shards=3, optimizer=AdagradSpec())
    bulk: BulkStore = target
    for dim, (ids, rows) in source.export_entries().items():
        bulk.import_entries(dim, ids, rows)
    assert store_checksum(target) == store_checksum(source)
    assert bulk.stored_dims() == source.stored_dims() == [4, 8]
    parts = [source.export_shard(4, k) for k in range(source.num_shards)]
    assert sum(p[0].shape[0] for p in parts if p is not None) == 200
