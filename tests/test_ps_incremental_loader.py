"""IncrementalLoader: an Infer replica applies finished packets in order, never a torn one."""

from __future__ import annotations

import logging
import os
import shutil
import time

import numpy as np
import pytest

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.incremental import IncrementalLoader
from pyrsia.services.embedding_ps.packets import IncrementalWriter
from pyrsia.shared.embedding_spec import AdagradSpec, SGDSpec
from pyrsia.shared.farmhash import replica_of

SPEC = AdagradSpec(lr=0.1)
IDS = np.arange(1, 201, dtype=np.uint64)


def _training(tmp_path, replica: int = 0) -> tuple[EmbeddingStore, IncrementalWriter]:
    store = EmbeddingStore(10_000, optimizer=SPEC)
    store.lookup(IDS, 4, train=True)
    writer = IncrementalWriter(tmp_path / "inc" / f"replica_{replica}", buffer_size=10_000)
    return store, writer


def _step(store: EmbeddingStore, writer: IncrementalWriter, ids: np.ndarray, seed: int):
    grads = np.random.default_rng(seed).normal(size=(ids.shape[0], 4)).astype(np.float32)
    store.update(ids, grads)
    writer.notify(store, ids)
    return writer.flush(store)


def _rows(store: EmbeddingStore, ids: np.ndarray) -> np.ndarray:
    return store.lookup(ids, 4, train=False)


def test_packets_apply_in_order_and_match_the_training_store(tmp_path):
    train, writer = _training(tmp_path)
    infer = EmbeddingStore(10_000)  # no optimizer: adopts the packets'
    loader = IncrementalLoader(infer, tmp_path / "inc", 0, 1)
    assert loader.scan() == 0
    _step(train, writer, IDS[:50], 1)
    _step(train, writer, IDS[:80], 2)  # the same ids again: the later packet must win
    assert loader.scan() == 2
    np.testing.assert_array_equal(_rows(infer, IDS[:80]), _rows(train, IDS[:80]))
    assert infer.optimizer == SPEC
    assert loader.scan() == 0  # nothing new: nothing applied twice
    _step(train, writer, IDS[100:120], 3)
    assert loader.scan() == 1
    np.testing.assert_array_equal(_rows(infer, IDS[100:120]), _rows(train, IDS[100:120]))
    assert loader.stats.packets_applied == 3 and loader.stats.entries_applied == 150


def test_each_infer_replica_keeps_its_own_ids(tmp_path):
    train, writer = _training(tmp_path)
    _step(train, writer, IDS, 1)
    stores = [EmbeddingStore(10_000) for _ in range(3)]
    for i, store in enumerate(stores):
        IncrementalLoader(store, tmp_path / "inc", i, 3).scan()
        mine = IDS[replica_of(IDS, 3) == i]
        assert len(store) == mine.shape[0]
        np.testing.assert_array_equal(_rows(store, mine), _rows(train, mine))


def test_packets_of_several_writers_are_all_applied(tmp_path):
    a, wa = _training(tmp_path, 0)
    b, wb = _training(tmp_path, 1)
    _step(a, wa, IDS[replica_of(IDS, 2) == 0], 1)
    _step(b, wb, IDS[replica_of(IDS, 2) == 1], 2)
    infer = EmbeddingStore(10_000)
    assert IncrementalLoader(infer, tmp_path / "inc", 0, 1).scan() == 2
    assert len(infer) == IDS.shape[0]


def test_unfinished_newest_packet_waits_and_is_applied_once_done(tmp_path):
    train, writer = _training(tmp_path)
    packet = _step(train, writer, IDS[:10], 1)
    (packet / "done").unlink()  # as if the writer had not finished it yet
    infer = EmbeddingStore(10_000)
    loader = IncrementalLoader(infer, tmp_path / "inc", 0, 1)
    assert loader.scan() == 0 and len(infer) == 0 and loader.stats.packets_skipped_torn == 0
    (packet / "done").write_text("")
    assert loader.scan() == 1 and len(infer) == 10


def test_packet_without_done_before_a_finished_one_is_skipped_as_torn(tmp_path, caplog):
    train, writer = _training(tmp_path)
    torn = _step(train, writer, IDS[:10], 1)
    (torn / "done").unlink()
    _step(train, writer, IDS[50:60], 2)
    infer = EmbeddingStore(10_000)
    loader = IncrementalLoader(infer, tmp_path / "inc", 0, 1)
    with caplog.at_level(logging.WARNING, logger="pyrsia.services.embedding_ps.incremental"):
        assert loader.scan() == 1
    assert any(
        "skipped as torn" in r.getMessage() and torn.name in r.getMessage() for r in caplog.records
    )
    assert loader.stats.packets_skipped_torn == 1
    assert len(infer) == 10 and (_rows(infer, IDS[:10]) == 0).all()  # the torn ids never arrived
    (torn / "done").write_text("")  # finishing it late does not apply it out of order
    assert loader.scan() == 0


@pytest.mark.parametrize("damage", ["truncate_rows", "drop_manifest", "bad_json"])
def test_finished_but_damaged_packet_is_skipped_whole(tmp_path, caplog, damage):
    train, writer = _training(tmp_path)
    _step(train, writer, IDS[:20], 1)
    bad = _step(train, writer, IDS[100:140], 2)
    good = _step(train, writer, IDS[150:160], 3)
    rows = next(bad.glob("*.rows.npy"))
    if damage == "truncate_rows":
        with open(rows, "r+b") as f:
            f.truncate(os.path.getsize(rows) // 2)
    elif damage == "drop_manifest":
        (bad / "manifest.json").unlink()
    else:
        (bad / "manifest.json").write_text("{")
    infer = EmbeddingStore(10_000)
    loader = IncrementalLoader(infer, tmp_path / "inc", 0, 1)
    with caplog.at_level(logging.ERROR, logger="pyrsia.services.embedding_ps.incremental"):
        assert loader.scan() == 2
    assert any(bad.name in r.getMessage() and "torn" in r.getMessage() for r in caplog.records)
    assert len(infer) == 30  # the first and the last packet; nothing of the damaged one
    np.testing.assert_array_equal(_rows(infer, IDS[150:160]), _rows(train, IDS[150:160]))
    assert good.exists()


def test_packets_older_than_the_loaded_checkpoint_are_skipped(tmp_path):
    train, writer = _training(tmp_path)
    _step(train, writer, IDS[:20], 1)
    time.sleep(0.01)
    manifest = train.dump(tmp_path / "ckpt", 0, 1)
    _step(train, writer, IDS[20:30], 2)
    infer = EmbeddingStore(10_000)
    infer.load(tmp_path / "ckpt", 0, 1)
    loader = IncrementalLoader(
        infer, tmp_path / "inc", 0, 1, since_unix_ms=manifest["started_unix_ms"]
    )
    assert loader.scan() == 1
    assert loader.stats.packets_skipped_old == 1
    np.testing.assert_array_equal(_rows(infer, IDS), _rows(train, IDS))


def test_incompatible_optimizer_layout_is_refused_with_a_log_line(tmp_path, caplog):
    train, writer = _training(tmp_path)
    _step(train, writer, IDS[:5], 1)
    infer = EmbeddingStore(10_000, optimizer=SGDSpec(lr=0.1, momentum=0.5))
    loader = IncrementalLoader(infer, tmp_path / "inc", 0, 1)
    with caplog.at_level(logging.ERROR, logger="pyrsia.services.embedding_ps.incremental"):
        assert loader.scan() == 0
    assert loader.stats.packets_skipped_torn == 1 and len(infer) == 0
    assert any("incompatible" in r.getMessage() for r in caplog.records)


def test_missing_directory_is_not_an_error(tmp_path):
    loader = IncrementalLoader(EmbeddingStore(100), tmp_path / "nothing", 0, 1)
    assert loader.scan() == 0
    (tmp_path / "nothing").mkdir()
    shutil.rmtree(tmp_path / "nothing")
    assert loader.scan() == 0
