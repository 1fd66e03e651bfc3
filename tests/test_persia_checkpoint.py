"""A checkpoint written by PERSIA (``s<r>/replica_<r>_shard_<i>.emb``) read, converted by
``persia-launcher convert-checkpoint``, and loaded into a real PS with every value intact.

The PERSIA files are written by ``tests/persia_emb_writer.py`` byte for byte as PERSIA's sources
lay them out (speedy ``ArrayLinkedList<HashMapEmbeddingEntry>``), from a known table; the PS's
``/checksum`` (ids and full rows: embedding and optimizer state) and ``/lookup`` prove that every
id's vector and state arrived.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.persia_convert import convert
from pyrsia.services.embedding_ps.persia_format import read_checkpoint, read_emb_file
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, SGDSpec, optimizer_from_dict
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.http_client import HttpClient
from tests.persia_emb_writer import emb_file_bytes, write_checkpoint

REPO = Path(__file__).resolve().parents[1]
ADAGRAD = {"type": "adagrad", "lr": 0.01}


def _table(seed: int, n: int, dim: int, state: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = (rng.permutation(10 * n)[:n].astype(np.uint64) + np.uint64(base)) * np.uint64(2654435761)
    inner = rng.standard_normal((n, dim + state)).astype(np.float32)
    inner[:, dim:] = np.abs(inner[:, dim:])  # accumulators are >= 0
    return ids, inner


def _persia_checkpoint(directory: Path, state_of) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """2 PS replicas x 3 internal shards, dims 8 and 16 mixed in each file, freed slots and a
    list order unlike the element order; returns the known table {dim: (ids, inner)}."""
    known = {dim: _table(dim, 90, dim, state_of(dim), dim << 40) for dim in (8, 16)}
    files = {}
    for replica in range(2):
        for shard in range(3):
            k = replica * 3 + shard
            pick = {dim: slice(15 * k, 15 * (k + 1)) for dim in known}
            signs = np.concatenate([known[d][0][pick[d]] for d in known])
            inners = [row for d in known for row in known[d][1][pick[d]]]
            dims = [d for d in known for _ in range(15)]
            order = np.random.default_rng(k).permutation(len(signs))
            n_slots = len(signs) + 4
            slots = np.random.default_rng(100 + k).permutation(n_slots)[: len(signs)]
            files[(replica, shard)] = emb_file_bytes(
                signs[order],
                [inners[i] for i in order],
                [dims[i] for i in order],
                slots=slots,
                n_slots=n_slots,
            )
    write_checkpoint(directory, files)
    return known


def _checksum(rows_by_dim: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict:
    """What the PS's /checksum answers for these ids and full rows (pyrsia/services/embedding_ps/checksum.py)."""
    digest = hashlib.blake2b(digest_size=16)
    entries = 0
    for dim, (ids, rows) in sorted(rows_by_dim.items()):
        order = np.argsort(ids, kind="stable")
        digest.update(np.int64(dim).tobytes() + np.int64(ids.shape[0]).tobytes())
        digest.update(ids[order].tobytes() + np.ascontiguousarray(rows[order]).tobytes())
        entries += ids.shape[0]
    return {"entries": entries, "checksum": digest.hexdigest()}


def test_one_file_reads_in_list_order_with_freed_slots_and_two_dims(tmp_path):
    ids8, inner8 = _table(1, 5, 8, 8, 1 << 40)
    ids4, inner4 = _table(2, 3, 4, 4, 2 << 40)
    signs = [ids8[0], ids4[0], ids8[1], ids8[2], ids4[1], ids8[3], ids4[2], ids8[4]]
    dims = [8, 4, 8, 8, 4, 8, 4, 8]
    rows = {8: iter(inner8), 4: iter(inner4)}
    inners = [next(rows[d]) for d in dims]
    data = emb_file_bytes(signs, inners, dims, slots=[9, 0, 4, 2, 7, 1, 3, 5], n_slots=11)
    path = tmp_path / "replica_0_shard_0.emb"
    path.write_bytes(data)
    tables = {t.dim: t for t in read_emb_file(path)}
    assert sorted(tables) == [4, 8]
    np.testing.assert_array_equal(tables[8].ids, ids8)  # list order kept per dim
    np.testing.assert_array_equal(tables[8].inner, inner8)
    np.testing.assert_array_equal(tables[4].ids, ids4)
    np.testing.assert_array_equal(tables[4].inner, inner4)


async def test_converted_checkpoint_loads_into_a_real_ps_with_every_value(services, tmp_path):
    known = _persia_checkpoint(tmp_path / "persia", lambda dim: dim)  # Adagrad: a (dim)
    manifest = convert(tmp_path / "persia", tmp_path / "pyrsia", optimizer_from_dict(ADAGRAD))
    assert manifest["entries"] == 180 and sorted(manifest["dims"]) == ["16", "8"]
    ps = services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    client = HttpClient(retries=0)
    try:
        await client.call(f"{ps.url}/register_optimizer", {"optimizer": ADAGRAD})
        loaded = await client.call(f"{ps.url}/load", {"dir": str(tmp_path / "pyrsia")})
        assert loaded["entries"] == 180
        # every id's embedding and Adagrad state, bit for bit
        assert await client.call(f"{ps.url}/checksum") == _checksum(known)
        groups = [{"dim": dim, "ids": ids} for dim, (ids, _) in sorted(known.items())]
        answer = await client.call(f"{ps.url}/lookup", {"train": False, "groups": groups})
        for got, (dim, (_, inner)) in zip(answer["groups"], sorted(known.items()), strict=True):
            np.testing.assert_array_equal(np.asarray(got), inner[:, :dim])
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("optimizer", "persia_state", "check_state"),
    [
        (SGDSpec(lr=0.1), lambda d: 0, lambda rows, inner, d: rows.shape[1] == d),
        (
            SGDSpec(lr=0.1, momentum=0.9),
            lambda d: 0,
            lambda rows, inner, d: rows.shape[1] == 2 * d and not rows[:, d:].any(),
        ),
        (
            AdagradSpec(vectorwise_shared=True),
            lambda d: 1,
            lambda rows, inner, d: np.array_equal(rows[:, d:], inner[:, d:]),
        ),
        (
            AdamSpec(),
            lambda d: 2 * d,
            lambda rows, inner, d: (
                np.array_equal(rows[:, d : 3 * d], inner[:, d:]) and (rows[:, 3 * d] == 7).all()
            ),
        ),
    ],
)
def test_each_optimizers_state_lands_where_pyrsia_keeps_it(
    tmp_path, optimizer, persia_state, check_state
):
    known = _persia_checkpoint(tmp_path / "persia", persia_state)
    convert(tmp_path / "persia", tmp_path / "pyrsia", optimizer, adam_step=7, workers=2)
    store = EmbeddingStore(1000, num_shards=4)
    try:
        assert store.load(tmp_path / "pyrsia", 0, 1) == 180
        got = store.export_entries()
        for dim, (ids, inner) in known.items():
            order = np.argsort(got[dim][0])
            want = np.argsort(ids)
            np.testing.assert_array_equal(got[dim][0][order], ids[want])
            rows = got[dim][1][order]
            np.testing.assert_array_equal(rows[:, :dim], inner[want, :dim])
            assert check_state(rows, inner[want], dim)
    finally:
        store.close()


def test_wrong_optimizer_is_refused_naming_what_the_file_holds(tmp_path):
    _persia_checkpoint(tmp_path / "persia", lambda dim: dim)
    with pytest.raises(InvalidInputError) as info:
        convert(tmp_path / "persia", tmp_path / "pyrsia", AdamSpec())
    assert info.value.field == "--optimizer"
    assert "8 state values each, which is Adagrad" in str(info.value)
    assert not (tmp_path / "pyrsia").exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "embedding_dump_done").unlink(), "complete PERSIA checkpoint"),
        (lambda d: (d / "s1" / "embedding_dump_done").unlink(), "complete PERSIA checkpoint"),
        (lambda d: (d / "s1" / "replica_1_shard_2.emb").unlink(), "replica_1_shard_<i>.emb"),
        (lambda d: _truncate(d / "s0" / "replica_0_shard_1.emb", 10), "past the end of the file"),
        (lambda d: _append(d / "s0" / "replica_0_shard_1.emb", b"\0"), "bytes after the last node"),
        (
            lambda d: _poke(d / "s0" / "replica_0_shard_0.emb", 0, 99),
            "as many live entries as its count (99)",
        ),
        (lambda d: _poke(d / "s0" / "replica_0_shard_0.emb", 8, 0), "linked list"),
    ],
)
def test_damaged_or_incomplete_checkpoints_are_refused_naming_the_file(tmp_path, damage, message):
    _persia_checkpoint(tmp_path / "persia", lambda dim: dim)
    damage(tmp_path / "persia")
    with pytest.raises(InvalidInputError) as info:
        read_checkpoint(tmp_path / "persia")
    assert message in str(info.value) and str(tmp_path / "persia") in str(info.value)


def _truncate(path: Path, by: int) -> None:
    path.write_bytes(path.read_bytes()[:-by])


def _append(path: Path, extra: bytes) -> None:
    path.write_bytes(path.read_bytes() + extra)


def _poke(path: Path, offset: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = value.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_the_launcher_command_converts_and_fails_in_one_line(tmp_path):
    _persia_checkpoint(tmp_path / "persia", lambda dim: dim)
    argv = [
        sys.executable,
        "-m",
        "persia.launcher",
        "convert-checkpoint",
        "--persia-dir",
        str(tmp_path / "persia"),
        "--output",
        str(tmp_path / "pyrsia"),
    ]
    ok = subprocess.run(
        [*argv, "--optimizer", '{"type": "adagrad", "lr": 0.01}'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "wrote 180 entries (dim 8, dim 16)" in ok.stdout
    assert (tmp_path / "pyrsia" / "replica_0.manifest.json").is_file()
    bad = subprocess.run(
        [*argv, "--optimizer", '{"type": "adam"}'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "--optimizer" in bad.stderr and "Adagrad" in bad.stderr


def test_empty_preallocated_shards_and_ids_at_two_dims(tmp_path):
    # PERSIA preallocates capacity + 1 freed slots per shard (EvictionMap::with_capacity)
    ids, inner = _table(3, 4, 8, 8, 1 << 40)
    files = {
        (0, 0): emb_file_bytes([], [], [], slots=[], n_slots=6),
        (0, 1): emb_file_bytes(ids, inner, [8] * 4, slots=[5, 2, 0, 3], n_slots=7),
    }
    write_checkpoint(tmp_path / "persia", files)
    (table,) = read_checkpoint(tmp_path / "persia")
    np.testing.assert_array_equal(table.ids, ids)
    assert convert(tmp_path / "persia", tmp_path / "pyrsia", AdagradSpec())["entries"] == 4
    # the same id at dim 8 and dim 4 (PERSIA keys entries by id alone): refused
    files[(0, 0)] = emb_file_bytes(ids[:1], [inner[0, :8]], [4])
    write_checkpoint(tmp_path / "twice", files)
    with pytest.raises(InvalidInputError, match="ids at two dims"):
        convert(tmp_path / "twice", tmp_path / "pyrsia2", AdagradSpec())


def test_loading_a_persia_directory_directly_names_the_converter(tmp_path):
    """A PS pointed at PERSIA's files refuses them (nothing is touched) and says how to convert."""
    from pyrsia.services.embedding_ps.checkpoint import read_manifests

    _persia_checkpoint(tmp_path / "persia", lambda dim: 0)
    with pytest.raises(InvalidInputError, match="written by PERSIA.*convert-checkpoint"):
        read_manifests(tmp_path / "persia")
