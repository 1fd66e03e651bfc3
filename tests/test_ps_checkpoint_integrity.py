"""A checkpoint proves itself, and a refused load changes nothing.

Every load checks the whole checkpoint (manifests, file names, .npy headers, sizes and, for
checkpoints that carry them, each file's CRC-32) before the live store is touched: a damaged
checkpoint is refused (400 naming ``directory``) and ``store_checksum`` is bit-identical
before and after, also when the damage sits in the last part read. Checkpoints written
before checksums existed still load.
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path

import numpy as np
import pytest

from pyrsia.services.embedding_ps.checkpoint import read_manifests
from pyrsia.services.embedding_ps.checksum import store_checksum
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec
from pyrsia.shared.errors import InvalidInputError

SPEC = AdagradSpec(lr=0.05)


def _store(ids: np.ndarray, seed: int, spec=SPEC, dim: int = 8) -> EmbeddingStore:
    rng = np.random.default_rng(seed)
    store = EmbeddingStore(100_000, num_shards=2, optimizer=spec)
    store.lookup(ids, dim, train=True)
    store.update(ids, rng.normal(size=(ids.shape[0], dim)).astype(np.float32))
    return store


def _checkpoint(directory: Path, replicas: int = 2) -> None:
    """A checkpoint of 3,000 entries written by ``replicas`` replicas (each writes all ids:
    enough to test the reader, which routes them)."""
    ids = np.arange(1, 3001, dtype=np.uint64)
    writer = _store(ids, seed=1)
    for i in range(replicas):
        writer.dump(directory, i, replicas)


def _last_part_file(directory: Path, kind: str) -> Path:
    """The ids or rows file of the last replica's part: the one a load reads last."""
    last = read_manifests(directory)[-1]
    return directory / last["dims"]["8"][kind]


def _flip_middle(path: Path, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + n] = bytes(b ^ 0xFF for b in data[mid : mid + n])
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


DAMAGE = {
    "rows truncated": lambda d: _truncate(_last_part_file(d, "rows")),
    "ids truncated": lambda d: _truncate(_last_part_file(d, "ids")),
    "rows deleted": lambda d: _last_part_file(d, "rows").unlink(),
    "ids deleted": lambda d: _last_part_file(d, "ids").unlink(),
    "64 bytes flipped in rows": lambda d: _flip_middle(_last_part_file(d, "rows")),
    "64 bytes flipped in ids": lambda d: _flip_middle(_last_part_file(d, "ids")),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_and_the_store_is_bit_identical(tmp_path, damage):
    _checkpoint(tmp_path)
    DAMAGE[damage](tmp_path)
    live = _store(np.arange(10_000, 12_000, dtype=np.uint64), seed=7)
    before = store_checksum(live)
    assert before["entries"] == 2000
    with pytest.raises(InvalidInputError) as err:
        live.load(tmp_path, 0, 1, workers=2)
    assert err.value.field == "directory"
    assert store_checksum(live) == before
    assert live.optimizer == SPEC


def test_a_refused_load_does_not_adopt_the_checkpoints_optimizer(tmp_path):
    """A store with no optimizer adopts the checkpoint's, but only once the load is accepted."""
    _checkpoint(tmp_path)
    _flip_middle(_last_part_file(tmp_path, "rows"))
    bare = EmbeddingStore(1000)
    bare.import_entries(4, np.arange(5, dtype=np.uint64), np.ones((5, 4), np.float32))
    before = store_checksum(bare)
    with pytest.raises(InvalidInputError, match="CRC-32"):
        bare.load(tmp_path, 0, 1)
    assert bare.optimizer is None and store_checksum(bare) == before


def test_names_that_leave_the_directory_are_refused(tmp_path):
    """A manifest is outside input: its file names must be plain names in the directory."""
    _checkpoint(tmp_path, replicas=1)
    (tmp_path / "sub").mkdir()
    manifest_path = tmp_path / "replica_0.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    rows = manifest["dims"]["8"]["rows"]
    (tmp_path / rows).rename(tmp_path / "sub" / rows)
    manifest["dims"]["8"]["rows"] = f"sub/{rows}"
    manifest_path.write_text(json.dumps(manifest))
    live = _store(np.arange(10, 20, dtype=np.uint64), seed=3)
    before = store_checksum(live)
    with pytest.raises(InvalidInputError, match="plain file name"):
        live.load(tmp_path / "sub" / "..", 0, 1)
    assert store_checksum(live) == before


def test_the_manifest_records_each_files_size_and_crc32(tmp_path):
    _checkpoint(tmp_path, replicas=1)
    (manifest,) = read_manifests(tmp_path)
    info = manifest["dims"]["8"]
    for kind in ("ids", "rows"):
        data = (tmp_path / info[kind]).read_bytes()
        assert info[f"{kind}_bytes"] == len(data)
        assert info[f"{kind}_crc32"] == zlib.crc32(data)


def test_a_checkpoint_without_checksums_still_loads_and_says_so_once(tmp_path, caplog):
    _checkpoint(tmp_path)
    for path in tmp_path.glob("replica_*.manifest.json"):
        manifest = json.loads(path.read_text())
        manifest.pop("manifest_crc32", None)  # older than the manifest's own checksum too
        for info in manifest["dims"].values():
            for key in ("ids_bytes", "rows_bytes", "ids_crc32", "rows_crc32"):
                info.pop(key, None)
        path.write_text(json.dumps(manifest))
    reader = EmbeddingStore(100_000, optimizer=AdamSpec(lr=0.1))  # other layout: refused below
    with caplog.at_level(logging.WARNING, logger="pyrsia.services.embedding_ps.checkpoint"):
        fresh = EmbeddingStore(100_000)
        assert fresh.load(tmp_path, 0, 1) > 0
    notes = [r for r in caplog.records if "without checksums" in r.getMessage()]
    assert len(notes) == 1
    assert str(tmp_path) in notes[0].getMessage()
    # sizes are still checked without checksums: a truncated file is refused, nothing changes
    _truncate(_last_part_file(tmp_path, "rows"))
    before = store_checksum(fresh)
    with pytest.raises(InvalidInputError):
        fresh.load(tmp_path, 0, 1)
    assert store_checksum(fresh) == before
    assert len(reader) == 0


async def test_a_real_ps_refuses_a_damaged_checkpoint_and_keeps_serving_what_it_had(
    services, tmp_path
):
    from pyrsia.shared.constants import ROLE_EMBEDDING_PS
    from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError

    root = tmp_path / "root"
    root.mkdir()
    _checkpoint(root / "ckpt")
    _flip_middle(_last_part_file(root / "ckpt", "rows"))
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--checkpoint-root", str(root)],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )
    client = HttpClient(retries=0)
    try:
        hyper = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
        await client.call(f"{ps.url}/configure", {"hyperparams": hyper})
        await client.call(
            f"{ps.url}/register_optimizer", {"optimizer": {"type": "adagrad", "lr": 0.05}}
        )
        ids = np.arange(10_000, 12_000, dtype=np.uint64)
        await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 8, "ids": ids}]})
        before = await client.call(f"{ps.url}/checksum")
        assert before["entries"] == 2000
        with pytest.raises(RemoteBadRequestError) as err:
            await client.call(f"{ps.url}/load", {"dir": str(root / "ckpt")})
        assert err.value.field == "directory" and "CRC-32" in err.value.expected
        assert await client.call(f"{ps.url}/checksum") == before
        assert ps.health()[0] == 200
    finally:
        await client.close()


def test_an_incremental_packet_with_flipped_bytes_is_skipped_and_changes_nothing(tmp_path, caplog):
    """Packets carry the same per-file size and CRC-32: a damaged one is never applied."""
    from pyrsia.services.embedding_ps.incremental import IncrementalLoader
    from pyrsia.services.embedding_ps.packets import IncrementalWriter

    ids = np.arange(1, 2001, dtype=np.uint64)
    train = _store(ids, seed=2)
    writer = IncrementalWriter(tmp_path / "inc" / "replica_0", buffer_size=100_000)
    train.update(ids, np.ones((ids.shape[0], 8), np.float32))
    writer.notify(train, ids)
    packet = writer.flush(train)
    manifest = json.loads((packet / "manifest.json").read_text())
    assert manifest["dims"]["8"]["rows_crc32"] == zlib.crc32(
        (packet / "dim8.rows.npy").read_bytes()
    )
    _flip_middle(packet / "dim8.rows.npy")
    serving = _store(np.arange(50_000, 50_100, dtype=np.uint64), seed=3)
    before = store_checksum(serving)
    loader = IncrementalLoader(serving, tmp_path / "inc", 0, 1)
    with caplog.at_level(logging.ERROR):
        assert loader.scan() == 0
    assert loader.stats.packets_skipped_torn == 1
    assert any("CRC-32" in r.getMessage() for r in caplog.records)
    assert store_checksum(serving) == before
