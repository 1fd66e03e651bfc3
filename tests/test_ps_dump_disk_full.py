"""A dump that fails (disk full) removes its own partial files, so the next dump succeeds as
soon as the space exists, and the previous checkpoint stays loadable.

The real-disk test mounts a small tmpfs (needs root and mount(2); skipped with the reason
otherwise); the other tests inject the failure and run anywhere.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyrsia.services.embedding_ps import checkpoint_files
from pyrsia.services.embedding_ps.checkpoint import read_manifests
from pyrsia.services.embedding_ps.checksum import store_checksum
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import AdagradSpec
from pyrsia.shared.errors import ServiceUnavailableError
from pyrsia.shared.http_client import HttpClient

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}


def _store(n: int = 5000, seed: int = 0) -> EmbeddingStore:
    store = EmbeddingStore(100_000, num_shards=2, optimizer=AdagradSpec(lr=0.1))
    ids = np.arange(1, n + 1, dtype=np.uint64)
    store.lookup(ids, 16, train=True)
    rng = np.random.default_rng(seed)
    store.update(ids, rng.normal(size=(n, 16)).astype(np.float32))
    return store


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("workers", [1, 3])
def test_a_failed_dump_leaves_only_the_previous_checkpoint(tmp_path, monkeypatch, workers):
    store = _store()
    store.dump(tmp_path, 0, 1)
    before = _listing(tmp_path)
    real_write = checkpoint_files._pwrite_all
    calls = {"n": 0}

    def full_disk(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == 4:  # mid-way through the data pieces
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(fd, data, offset)

    monkeypatch.setattr(checkpoint_files, "_pwrite_all", full_disk)
    monkeypatch.setattr(checkpoint_files, "CHUNK_BYTES", 4096)
    with pytest.raises(OSError) as err:
        store.dump(tmp_path, 0, 1, workers=workers)
    assert err.value.errno == errno.ENOSPC
    assert _listing(tmp_path) == before  # no partial data file, no temporary manifest
    monkeypatch.undo()
    fresh = EmbeddingStore(100_000)
    assert fresh.load(tmp_path, 0, 1) == len(store)


def test_a_failed_manifest_write_removes_the_data_files_and_its_temporary(tmp_path, monkeypatch):
    store = _store(n=500)
    store.dump(tmp_path, 0, 1)
    before = _listing(tmp_path)
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("manifest.json"):
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        store.dump(tmp_path, 0, 1)
    monkeypatch.undo()
    assert _listing(tmp_path) == before


def test_files_a_killed_dump_left_are_removed_before_the_next_one_writes(tmp_path):
    """A dump killed mid-way (kill -9) cannot clean up; the next dump of the same replica removes
    the files its manifest does not name before writing, so they cannot keep the disk full."""
    store = _store(n=500)
    store.dump(tmp_path, 0, 1)
    kept = _listing(tmp_path)
    stray = [
        tmp_path / "replica_0.0123abcd.dim16.rows.npy",
        tmp_path / ".replica_0.manifest.json.tmp-1a2b3c4d",
    ]
    for path in stray:
        path.write_bytes(b"x" * 1000)
    other = tmp_path / "replica_1.0123abcd.dim16.rows.npy"  # another replica's: not ours to judge
    other.write_bytes(b"y")
    seen = {}
    real = checkpoint_files.write_npy_files

    def spy(pool, files):
        seen["at_write"] = _listing(tmp_path)
        return real(pool, files)

    checkpoint_files_write = "pyrsia.services.embedding_ps.checkpoint.write_npy_files"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint_files_write, spy)
        store.dump(tmp_path, 0, 2)
    assert not any(p.name in seen["at_write"] for p in stray)
    assert set(kept) <= set(seen["at_write"])  # the committed checkpoint stays until replaced
    assert other.exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs mounted at ``tmp_path/disk`` for this test (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (mount(2))")
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


async def test_a_real_ps_whose_disk_fills_answers_503_and_dumps_again_once_space_exists(
    services, small_disk
):
    ckpt = small_disk / "ckpt"
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--checkpoint-root", str(small_disk)],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )
    client = HttpClient(retries=0)
    try:
        await client.call(f"{ps.url}/configure", {"hyperparams": HYPER})
        await client.call(
            f"{ps.url}/register_optimizer", {"optimizer": {"type": "adagrad", "lr": 0.1}}
        )
        ids = np.arange(1, 8001, dtype=np.uint64)
        await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 16, "ids": ids}]})
        first = (await client.call(f"{ps.url}/dump", {"dir": str(ckpt)}))["manifest"]
        need = sum(first["dims"]["16"][k] for k in ("ids_bytes", "rows_bytes"))  # ~0.33 MB
        grads = np.ones((ids.shape[0], 16), np.float32)
        await client.call(f"{ps.url}/update", {"groups": [{"dim": 16, "ids": ids, "grads": grads}]})
        # leave less room than the next dump's files need
        filler = small_disk / "filler"
        filler.write_bytes(b"\0" * (_free(small_disk) - need + (64 << 10)))
        free_before = _free(small_disk)
        committed = _listing(ckpt)
        for _ in range(3):  # every attempt fails the same way and leaves nothing behind
            with pytest.raises(ServiceUnavailableError, match="checkpoint I/O"):
                await client.call(f"{ps.url}/dump", {"dir": str(ckpt)})
            assert _listing(ckpt) == committed
            assert _free(small_disk) == free_before
        # make room for the new files (but not for the new files plus an old attempt's)
        with open(filler, "r+b") as f:
            f.truncate(filler.stat().st_size - (192 << 10))
        second = (await client.call(f"{ps.url}/dump", {"dir": str(ckpt)}))["manifest"]
        assert second["token"] != first["token"]
        after = EmbeddingStore(100_000)
        after.load(ckpt, 0, 1)
        assert store_checksum(after) == await client.call(f"{ps.url}/checksum")
        assert [m["token"] for m in read_manifests(ckpt)] == [second["token"]]
        assert ps.health()[0] == 200
    finally:
        await client.close()
