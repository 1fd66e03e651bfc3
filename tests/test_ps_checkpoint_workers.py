"""``checkpointing_config.num_workers``: a PS dumps and loads its checkpoint with that many
threads, and the checkpoint does not depend on it (pyrsia/services/embedding_ps/checkpoint_files.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyrsia.services.embedding_ps import checkpoint_files
from pyrsia.services.embedding_ps.checksum import store_checksum
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.config import parse_global_config
from pyrsia.shared.embedding_spec import AdagradSpec
from pyrsia.shared.errors import ConfigError, InvalidInputError
from pyrsia.shared.farmhash import replica_of


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Pieces of 4 KiB, so the small tables here are cut into hundreds of tasks."""
    monkeypatch.setattr(checkpoint_files, "CHUNK_BYTES", 4096)


def _store(n: int = 20_000, dims=(8, 16), shards: int = 4) -> EmbeddingStore:
    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(0, 2**64, n, dtype=np.uint64))
    store = EmbeddingStore(100_000, num_shards=shards, optimizer=AdagradSpec())
    for k, dim in enumerate(dims):
        part = ids[k :: len(dims)]
        store.lookup(part, dim, train=True)
        store.update(part, rng.normal(size=(part.shape[0], dim)).astype(np.float32))
    return store


def _data(directory) -> dict[str, bytes]:
    """Each data file's bytes, by name without the dump's token (``replica_0.dim8.rows.npy``)."""
    out = {}
    for path in directory.glob("*.npy"):
        replica, _token, rest = path.name.split(".", 2)
        out[f"{replica}.{rest}"] = path.read_bytes()
    return out


def test_one_and_four_workers_write_identical_files_np_save_would_write(tmp_path):
    store = _store()
    one, four = tmp_path / "one", tmp_path / "four"
    m1 = store.dump(one, 0, 1, workers=1)
    m4 = store.dump(four, 0, 1, workers=4)
    assert _data(one) == _data(four) and len(_data(one)) == 4  # ids + rows for 2 dims
    for key in ("entries", "optimizer", "hyperparams", "replica_count"):
        assert m1[key] == m4[key]
    assert {
        d: {k: v for k, v in i.items() if k in ("entries", "width")} for d, i in m1["dims"].items()
    } == {
        d: {k: v for k, v in i.items() if k in ("entries", "width")} for d, i in m4["dims"].items()
    }
    # the bytes are exactly what np.save writes for the concatenated export
    for dim, (ids, rows) in store.export_entries().items():
        info = m4["dims"][str(dim)]
        np.save(tmp_path / "ids.npy", ids, allow_pickle=False)
        np.save(tmp_path / "rows.npy", rows, allow_pickle=False)
        assert (four / info["ids"]).read_bytes() == (tmp_path / "ids.npy").read_bytes()
        assert (four / info["rows"]).read_bytes() == (tmp_path / "rows.npy").read_bytes()
    assert json.loads((four / "replica_0.manifest.json").read_text()) == m4


@pytest.mark.parametrize("write_workers, read_workers", [(1, 4), (4, 1), (4, 4)])
def test_reshard_two_into_three_with_any_worker_counts(tmp_path, write_workers, read_workers):
    whole = _store()
    everything = whole.export_entries()
    for i in range(2):  # two writer replicas, each holding the ids routed to it
        part = EmbeddingStore(100_000, num_shards=3, optimizer=AdagradSpec())
        for dim, (ids, rows) in everything.items():
            mine = replica_of(ids, 2) == i
            part.import_entries(dim, ids[mine], rows[mine])
        part.dump(tmp_path, i, 2, workers=write_workers)
    readers = [EmbeddingStore(100_000, num_shards=2) for _ in range(3)]
    baseline = [EmbeddingStore(100_000, num_shards=2) for _ in range(3)]
    loaded = [r.load(tmp_path, j, 3, workers=read_workers) for j, r in enumerate(readers)]
    assert loaded == [b.load(tmp_path, j, 3, workers=1) for j, b in enumerate(baseline)]
    assert sum(loaded) == len(whole)
    for reader, base in zip(readers, baseline, strict=True):
        assert store_checksum(reader) == store_checksum(base)  # same entries, rows and state
    merged = EmbeddingStore(100_000, num_shards=4)
    merged.load(tmp_path, 0, 1, workers=read_workers)
    assert store_checksum(merged)["checksum"] == store_checksum(whole)["checksum"]


def test_load_with_workers_checks_the_files_as_before(tmp_path):
    store = _store(n=2_000)
    manifest = store.dump(tmp_path, 0, 1, workers=4)
    rows_file = tmp_path / manifest["dims"]["8"]["rows"]
    rows_file.write_bytes(rows_file.read_bytes()[:-64])  # a truncated data file
    with pytest.raises(InvalidInputError, match="dim 8"):
        EmbeddingStore(100_000).load(tmp_path, 0, 1, workers=4)
    with pytest.raises(InvalidInputError, match="num_workers"):
        store.dump(tmp_path / "x", 0, 1, workers=0)


def test_num_workers_is_read_and_bounded_in_global_config():
    cfg = parse_global_config({"common_config": {"checkpointing_config": {"num_workers": 8}}})
    assert cfg.common_config.checkpointing_config.num_workers == 8
    for bad in (0, 65, "four"):
        with pytest.raises(ConfigError, match="num_workers"):
            parse_global_config({"common_config": {"checkpointing_config": {"num_workers": bad}}})
