"""A checkpoint's manifest is verified like the files it describes (issue 49, item 2).

Each replica's manifest carries ``manifest_crc32``, the CRC-32 of its own canonical JSON: a
manifest edited after the dump (its ``entries`` count, its hyperparameters) is refused with
400 naming ``directory`` before the store changes. A manifest written before manifests had a
checksum still loads, with its ``entries`` total checked against its dims and one log line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from pyrsia.services.embedding_ps.checksum import store_checksum
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec
from pyrsia.shared.errors import InvalidInputError


def _checkpoint(directory: Path, replicas: int = 2) -> None:
    ids = np.arange(1, 3001, dtype=np.uint64)
    writer = EmbeddingStore(100_000, num_shards=2, optimizer=AdagradSpec(lr=0.05))
    writer.lookup(ids, 8, train=True)
    for i in range(replicas):
        writer.dump(directory, i, replicas)


def _edit(directory: Path, change, replica: int = 1) -> None:
    path = directory / f"replica_{replica}.manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


EDITS = {
    "entries count": lambda m: m.update(entries=m["entries"] + 1),
    "hyperparameters": lambda m: m["hyperparams"].update(weight_bound=1.0),
    "creation time": lambda m: m.update(created_unix_ms=m["created_unix_ms"] - 1),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_manifest_is_refused_and_the_store_is_unchanged(tmp_path, edit):
    _checkpoint(tmp_path)
    _edit(tmp_path, EDITS[edit])
    live = EmbeddingStore(100_000)
    live.lookup(np.arange(10_000, 10_100, dtype=np.uint64), 8, train=True)
    before = store_checksum(live)
    with pytest.raises(InvalidInputError) as err:
        live.load(tmp_path, 0, 1)
    assert err.value.field == "directory"
    assert "replica_1.manifest.json" in str(err.value) and "manifest_crc32" in str(err.value)
    assert store_checksum(live) == before


def test_a_manifest_records_its_own_checksum(tmp_path):
    _checkpoint(tmp_path, replicas=1)
    manifest = json.loads((tmp_path / "replica_0.manifest.json").read_text())
    assert isinstance(manifest["manifest_crc32"], int)


def _unseal(directory: Path) -> None:
    for path in directory.glob("replica_*.manifest.json"):
        manifest = json.loads(path.read_text())
        manifest.pop("manifest_crc32", None)
        path.write_text(json.dumps(manifest))


def test_a_manifest_without_a_checksum_loads_and_says_so_once(tmp_path, caplog):
    _checkpoint(tmp_path)
    _unseal(tmp_path)
    fresh = EmbeddingStore(100_000)
    with caplog.at_level(logging.WARNING, logger="pyrsia.services.embedding_ps"):
        assert fresh.load(tmp_path, 0, 1) > 0
    notes = [r for r in caplog.records if "without a manifest checksum" in r.getMessage()]
    assert len(notes) == 1


def test_a_manifest_without_a_checksum_still_has_its_entries_checked(tmp_path):
    _checkpoint(tmp_path)
    _unseal(tmp_path)
    _edit(tmp_path, EDITS["entries count"])
    with pytest.raises(InvalidInputError) as err:
        EmbeddingStore(100_000).load(tmp_path, 0, 1)
    assert "entries" in str(err.value)


async def test_a_real_ps_refuses_an_edited_manifest_with_400(services, tmp_path):
    from pyrsia.shared.constants import ROLE_EMBEDDING_PS
    from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError

    root = tmp_path / "root"
    _checkpoint(root / "ckpt")
    _edit(root / "ckpt", EDITS["entries count"])
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
        with pytest.raises(RemoteBadRequestError) as err:
            await client.call(f"{ps.url}/load", {"dir": str(root / "ckpt")})
        assert err.value.field == "directory" and "manifest_crc32" in err.value.expected
    finally:
        await client.close()


def test_an_incremental_packet_with_an_edited_manifest_is_skipped(tmp_path, caplog):
    from pyrsia.services.embedding_ps.incremental import IncrementalLoader
    from pyrsia.services.embedding_ps.packets import IncrementalWriter

    ids = np.arange(1, 2001, dtype=np.uint64)
    train = EmbeddingStore(100_000, optimizer=AdagradSpec(lr=0.05))
    train.lookup(ids, 8, train=True)
    writer = IncrementalWriter(tmp_path / "inc" / "replica_0", buffer_size=100_000)
    writer.notify(train, ids)
    packet = writer.flush(train)
    manifest = json.loads((packet / "manifest.json").read_text())
    manifest["entries"] += 5
    (packet / "manifest.json").write_text(json.dumps(manifest))
    serving = EmbeddingStore(100_000)
    loader = IncrementalLoader(serving, tmp_path / "inc", 0, 1)
    with caplog.at_level(logging.ERROR):
        assert loader.scan() == 0
    assert any("manifest_crc32" in r.getMessage() for r in caplog.records)
    assert len(serving) == 0
