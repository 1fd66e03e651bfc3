"""Checkpoints: round trip, N -> M resharding, crash safety, optimizer checks, incremental packets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyrsia.services.embedding_ps import checkpoint_files
from pyrsia.services.embedding_ps.checkpoint import read_manifests
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.packets import IncrementalWriter, apply_packet
from pyrsia.shared.embedding_spec import (
    AdagradSpec,
    AdamSpec,
    EmbeddingHyperparams,
    SGDSpec,
    optimizer_to_dict,
)
from pyrsia.shared.errors import ConflictError, InvalidInputError
from pyrsia.shared.farmhash import replica_of

SPEC = AdamSpec(lr=0.01, weight_decay=0.01)


def _trained(
    ids: np.ndarray, spec=SPEC, steps: int = 3, seed: int = 0, dims=(8,)
) -> EmbeddingStore:
    rng = np.random.default_rng(seed)
    store = EmbeddingStore(100_000, num_shards=2, optimizer=spec)
    for k, dim in enumerate(dims):  # one dim per id: a lookup at another dim re-initializes
        part = ids[k :: len(dims)]
        store.lookup(part, dim, train=True)
        for _ in range(steps):
            store.update(part, rng.normal(size=(part.shape[0], dim)).astype(np.float32))
    return store


def _rows(store: EmbeddingStore) -> dict[int, dict[int, np.ndarray]]:
    return {
        dim: dict(zip(ids.tolist(), rows, strict=True))
        for dim, (ids, rows) in store.export_entries().items()
    }


def _ids(n: int, seed: int = 1) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64))


def test_round_trip_values_state_and_continued_training(tmp_path):
    ids = _ids(3000)
    a = _trained(ids, dims=(8, 4))
    manifest = a.dump(tmp_path, 0, 1)
    assert manifest["entries"] == len(a) and manifest["optimizer"] == optimizer_to_dict(SPEC)
    assert set(manifest["dims"]) == {"8", "4"}
    b = EmbeddingStore(100_000, num_shards=3)  # no optimizer: adopts the checkpoint's
    assert b.load(tmp_path, 0, 1) == len(a)
    assert b.optimizer == SPEC
    ra, rb = _rows(a), _rows(b)
    assert ra.keys() == rb.keys()
    for dim in ra:
        assert ra[dim].keys() == rb[dim].keys()
        for k, row in ra[dim].items():
            np.testing.assert_array_equal(row, rb[dim][k])
    part = ids[1::2]
    g = np.random.default_rng(9).normal(size=(part.shape[0], 4)).astype(np.float32)
    a.update(part, g)
    b.update(part, g)
    np.testing.assert_array_equal(a.lookup(part, 4, train=False), b.lookup(part, 4, train=False))
    files = {p.name for p in tmp_path.iterdir()}
    assert all(n.endswith((".npy", ".json")) for n in files)
    for p in tmp_path.glob("*.npy"):
        np.load(p, allow_pickle=False)  # plain arrays, no pickle


def test_reshard_three_into_two(tmp_path):
    ids = _ids(6000)
    whole = _trained(ids, spec=AdagradSpec(), steps=1)
    owner = replica_of(ids, 3)
    writers = []
    for i in range(3):
        mine = ids[owner == i]
        ((all_ids, all_rows),) = whole.export_entries().values()
        s = EmbeddingStore(10_000, optimizer=AdagradSpec())
        keep = np.isin(all_ids, mine)
        s.import_entries(8, all_ids[keep], all_rows[keep])
        s.dump(tmp_path, i, 3)
        writers.append(s)
    readers = [EmbeddingStore(10_000, optimizer=AdagradSpec()) for _ in range(2)]
    loaded = [r.load(tmp_path, j, 2) for j, r in enumerate(readers)]
    assert sum(loaded) == ids.shape[0]
    union: dict[int, np.ndarray] = {}
    for j, r in enumerate(readers):
        got = _rows(r)[8]
        assert np.all(replica_of(np.array(list(got), dtype=np.uint64), 2) == j)
        union.update(got)
    expect = _rows(whole)[8]
    assert union.keys() == expect.keys()
    for k in expect:
        np.testing.assert_array_equal(union[k], expect[k])


@pytest.mark.parametrize("workers", [1, 4])
def test_crash_during_dump_keeps_previous_checkpoint(tmp_path, monkeypatch, workers):
    ids = _ids(2000)
    old = _trained(ids, steps=1)
    old.dump(tmp_path, 0, 1)
    old_rows = _rows(old)
    new = _trained(ids, steps=4, seed=5)
    calls = {"n": 0}
    real_write = checkpoint_files._pwrite_all

    def crashing_write(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == 3:  # after the headers, in the middle of the data pieces
            raise OSError("disk full (simulated)")
        real_write(fd, data, offset)

    monkeypatch.setattr(checkpoint_files, "_pwrite_all", crashing_write)
    monkeypatch.setattr(checkpoint_files, "CHUNK_BYTES", 4096)  # many pieces per file
    with pytest.raises(OSError, match="simulated"):
        new.dump(tmp_path, 0, 1, workers=workers)
    monkeypatch.undo()
    fresh = EmbeddingStore(100_000)
    assert fresh.load(tmp_path, 0, 1) == len(old)
    got = _rows(fresh)[8]
    for k, row in old_rows[8].items():
        np.testing.assert_array_equal(got[k], row)
    # a later successful dump replaces it and removes the previous and the stray files
    new.dump(tmp_path, 0, 1)
    manifest = json.loads((tmp_path / "replica_0.manifest.json").read_text())
    assert sorted(p.name for p in tmp_path.glob("*.npy")) == sorted(
        [manifest["dims"]["8"]["ids"], manifest["dims"]["8"]["rows"]]
    )
    fresh.load(tmp_path, 0, 1)
    np.testing.assert_array_equal(
        fresh.lookup(ids, 8, train=False), new.lookup(ids, 8, train=False)
    )


def test_dump_with_fewer_replicas_removes_extra_parts(tmp_path):
    ids = _ids(500)
    s = _trained(ids, steps=1)
    for i in range(3):
        s.dump(tmp_path, i, 3)
    s.dump(tmp_path, 0, 1)
    assert [m["replica_count"] for m in read_manifests(tmp_path)] == [1]


def test_load_errors(tmp_path):
    store = EmbeddingStore(100, optimizer=SGDSpec(0.1))
    with pytest.raises(InvalidInputError, match="directory"):
        store.load(tmp_path / "missing", 0, 1)
    with pytest.raises(InvalidInputError, match="directory"):
        store.load(tmp_path, 0, 1)
    ids = _ids(50)
    _trained(ids, steps=1).dump(tmp_path, 1, 2)
    with pytest.raises(InvalidInputError, match=r"missing replica\(s\) \[0\]"):
        store.load(tmp_path, 0, 1)
    _trained(ids, steps=1).dump(tmp_path, 0, 2)
    store.lookup(ids[:5], 8, train=True)
    with pytest.raises(ConflictError, match="register the checkpoint's optimizer"):
        store.load(tmp_path, 0, 1)
    assert len(store) == 5  # unchanged
    with pytest.raises(InvalidInputError, match="replica_index"):
        store.load(tmp_path, 2, 2)
    adam = EmbeddingStore(100_000, optimizer=AdamSpec(lr=0.5))  # same layout, other lr: kept
    adam.load(tmp_path, 0, 1)  # both parts hold the same ids here: the later overwrites
    assert len(adam) == ids.shape[0]
    assert adam.optimizer == AdamSpec(lr=0.5)


def test_incremental_packets(tmp_path):
    store = EmbeddingStore(
        10_000, optimizer=SGDSpec(0.1), hyperparams=EmbeddingHyperparams(weight_bound=0)
    )
    writer = IncrementalWriter(tmp_path / "inc", buffer_size=100)
    store.incremental = writer
    ids = np.arange(1000, dtype=np.uint64)
    store.lookup(ids, 4, train=True)
    store.update(ids[:60], np.ones((60, 4), np.float32))
    store.update(ids[30:90], np.ones((60, 4), np.float32))  # 90 distinct: not yet
    assert writer.packets_written == 0
    store.update(ids[85:95], np.ones((10, 4), np.float32))  # 95 distinct
    store.update(
        np.array([5, 500, 501, 502, 503, 504, 505], dtype=np.uint64), np.ones((7, 4), np.float32)
    )
    assert writer.packets_written == 1
    store.update(
        np.array([999, 12345], dtype=np.uint64), np.ones((2, 4), np.float32)
    )  # 12345 unknown
    last = writer.flush(store)
    packets = sorted(p for p in (tmp_path / "inc").iterdir())
    assert [p.name.startswith("packet_") for p in packets] == [True, True] and packets[-1] == last
    assert all((p / "done").exists() for p in packets)
    first = json.loads((packets[0] / "manifest.json").read_text())
    assert first["entries"] == 101 and first["dims"]["4"]["entries"] == 101
    assert np.load(packets[1] / "dim4.ids.npy").tolist() == [999]
    replica = EmbeddingStore(10_000, optimizer=SGDSpec(0.1))
    for p in packets:
        apply_packet(replica, p)
    changed = np.concatenate([np.arange(95), np.arange(500, 506), [999]]).astype(np.uint64)
    np.testing.assert_array_equal(
        replica.lookup(changed, 4, train=False), store.lookup(changed, 4, train=False)
    )
    assert len(replica) == changed.shape[0]
    again = IncrementalWriter(tmp_path / "inc", buffer_size=5)
    assert again._seq == 2
