"""Embedding checkpoints: full dumps per replica, resharding loads.

Layout of a checkpoint directory (every replica of a job writes into the same one)::

    replica_<i>.manifest.json              the commit marker of replica i's part
    replica_<i>.<token>.dim<d>.ids.npy     uint64 (n,)          ids stored at dim d
    replica_<i>.<token>.dim<d>.rows.npy    float32 (n, width)   [embedding | optimizer state]

A dump writes its data files (with ``checkpointing_config.num_workers`` threads:
``checkpoint_files.py``) under a fresh token, then atomically replaces the manifest
(``os.replace``), then deletes the files of the previous dump. The manifest records each data
file's size and CRC-32 (``dims.<d>.{ids,rows}_{bytes,crc32}``), which every load checks before
it touches the store (``checkpoint_verify.py``). A dump that fails (disk full, I/O error) before
the replace removes its own files and leaves the previous manifest and its files untouched
(still loadable), so it does not keep the disk full; files a killed dump left behind are
removed by the next dump of that replica before it writes. Only ``.npy`` files written and read
with ``allow_pickle=False`` and JSON: no pickle.

A checkpoint written by N replicas loads into M: every replica reads every part and keeps the ids
with ``replica_of(id, M) == its index`` (vectorized).

Incremental packets (the entries updates changed, in the same file format) are ``packets.py``.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pyrsia.services.embedding_ps.checkpoint_files import (
    export_parallel,
    fsync_dir,
    read_routed,
    unlink_quietly,
    write_json,
    write_npy_files,
)
from pyrsia.services.embedding_ps.checkpoint_verify import check_dims, check_replica, verify_parts
from pyrsia.services.embedding_ps.manifest_seal import seal
from pyrsia.services.embedding_ps.manifest_seal import verify as verify_seal
from pyrsia.services.embedding_ps.optimizers import state_layout, state_width
from pyrsia.shared.constants import EMBEDDING_CHECKPOINT_FORMAT, EMBEDDING_CHECKPOINT_VERSION
from pyrsia.shared.embedding_spec import OptimizerSpec, optimizer_from_dict, optimizer_to_dict
from pyrsia.shared.errors import ConflictError, InvalidInputError
from pyrsia.shared.validate import positive_int

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.bulk import BulkStore

log = logging.getLogger(__name__)

FORMAT = EMBEDDING_CHECKPOINT_FORMAT
FORMAT_VERSION = EMBEDDING_CHECKPOINT_VERSION
_MANIFEST = re.compile(r"^replica_(\d+)\.manifest\.json$")


_DUMPING = threading.Lock()
"""Dumps of one process run one at a time, so a dump never mistakes another's files in progress
for a killed dump's leftovers (``_remove_leftovers``); they share one disk anyway."""


def _remove_leftovers(directory: Path, replica_index: int) -> None:
    """Remove the files of this replica that its committed manifest does not name: those of a
    dump killed before its manifest (kill -9, power loss) and temporary manifests. Left alone
    when the manifest exists but cannot be read (a person should look at it first)."""
    manifest_path = directory / f"replica_{replica_index}.manifest.json"
    token = None
    if manifest_path.exists():
        try:
            token = json.loads(manifest_path.read_text()).get("token")
        except (OSError, ValueError, AttributeError):
            return
        if not isinstance(token, str) or not token:
            return
    for path in directory.iterdir():
        name = path.name
        if name.startswith(f".replica_{replica_index}.manifest.json.tmp-") or (
            name.startswith(f"replica_{replica_index}.")
            and name.endswith(".npy")
            and (token is None or f".{token}." not in name)
        ):
            unlink_quietly(path)


def dump_store(
    store: BulkStore,
    directory: str | Path,
    replica_index: int,
    replica_count: int,
    *,
    workers: int = 1,
) -> dict:
    """Write ``store`` as replica ``replica_index`` of ``replica_count`` with ``workers`` threads
    (``checkpointing_config.num_workers``; the files do not depend on it); returns the manifest."""
    replica_index, replica_count = check_replica(replica_index, replica_count)
    workers = positive_int(workers, "num_workers")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _DUMPING:
        _remove_leftovers(directory, replica_index)
        started_ms = int(time.time() * 1000)  # incremental packets stamped later are newer
        token = f"{started_ms:x}{secrets.token_hex(4)}"
        prefix = f"replica_{replica_index}.{token}."
        committed = False
        try:
            manifest = _write_part(
                store, directory, replica_index, replica_count, workers, token, started_ms
            )
            committed = True
        finally:
            if not committed:  # a failed dump (disk full, I/O error) takes its files with it
                for path in directory.glob(f"{prefix}*"):
                    unlink_quietly(path)
        fsync_dir(directory)
        _remove_stale(directory, replica_index, replica_count, token)
    log.info(
        "dumped %d entries to %s as replica %d/%d",
        manifest["entries"],
        directory,
        replica_index,
        replica_count,
    )
    return manifest


def _write_part(
    store: BulkStore,
    directory: Path,
    replica_index: int,
    replica_count: int,
    workers: int,
    token: str,
    started_ms: int,
) -> dict:
    """Write the data files under ``token``, then commit them with the manifest (atomic)."""
    prefix = f"replica_{replica_index}.{token}."
    dims: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ps-checkpoint") as pool:
        files = []
        for dim, (ids, rows) in export_parallel(store, pool).items():
            ids_name, rows_name = f"{prefix}dim{dim}.ids.npy", f"{prefix}dim{dim}.rows.npy"
            files += [(directory / ids_name, ids), (directory / rows_name, rows)]
            dims[str(dim)] = {
                "entries": sum(int(x.shape[0]) for x in ids),
                "width": int(rows[0].shape[1]),
                "ids": ids_name,
                "rows": rows_name,
            }
        written = iter(write_npy_files(pool, files))  # complete and fsynced before the manifest
        for info in dims.values():  # files are in dims order: (ids, rows) per dim
            for kind in ("ids", "rows"):
                info[f"{kind}_bytes"], info[f"{kind}_crc32"] = next(written)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "replica_index": replica_index,
        "replica_count": replica_count,
        "token": token,
        "started_unix_ms": started_ms,
        "created_unix_ms": int(time.time() * 1000),
        "optimizer": optimizer_to_dict(store.optimizer) if store.optimizer is not None else None,
        "hyperparams": store.hyperparams.to_dict(),
        "entries": sum(d["entries"] for d in dims.values()),
        "dims": dims,
    }
    fsync_dir(directory)
    manifest = seal(manifest)
    write_json(directory / f"replica_{replica_index}.manifest.json", manifest)
    return manifest


def _remove_stale(directory: Path, replica_index: int, replica_count: int, token: str) -> None:
    """Delete the previous dump of this replica, and parts of replicas beyond ``replica_count``."""
    for path in directory.iterdir():
        name = path.name
        m = _MANIFEST.match(name)
        try:
            if m and int(m.group(1)) >= replica_count:
                path.unlink()
            elif (
                name.startswith(f"replica_{replica_index}.") and not m and f".{token}." not in name
            ):
                path.unlink()
            elif (
                name.startswith("replica_")
                and name.endswith(".npy")
                and int(name.split("_")[1].split(".")[0]) >= replica_count
            ):
                path.unlink()
        except (FileNotFoundError, ValueError):
            pass


def read_manifests(directory: str | Path) -> list[dict]:
    """The manifests of a complete checkpoint, by replica index; errors name what is missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidInputError("directory", "an existing checkpoint directory", str(directory))
    manifests, unsealed = {}, []
    for path in directory.iterdir():
        m = _MANIFEST.match(path.name)
        if m:
            index = int(m.group(1))
            manifests[index] = _read_manifest(path, index, unsealed)
    if not manifests:
        _refuse_no_manifest(directory)
    if unsealed:
        log.warning(
            "checkpoint %s: %s written without a manifest checksum (an older dump); "
            "checked for consistency only",
            directory,
            ", ".join(sorted(unsealed)),
        )
    counts = {m["replica_count"] for m in manifests.values()}
    if len(counts) != 1:
        raise InvalidInputError(
            "directory", "manifests of one dump (one replica_count)", sorted(counts)
        )
    count = counts.pop()
    missing = sorted(set(range(count)) - set(manifests))
    if missing:
        raise InvalidInputError(
            "directory", f"parts of all {count} replicas", f"missing replica(s) {missing}"
        )
    return [manifests[i] for i in range(count)]


def _read_manifest(path: Path, index: int, unsealed: list[str]) -> dict:
    """Replica ``index``'s manifest at ``path``, checked: readable JSON of this format and
    version, naming itself replica ``index`` of a replica_count above it, with valid dims and
    its own checksum (``manifest_seal.py``); its name goes to ``unsealed`` when it has none."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError("directory", f"a readable manifest {path.name}", str(exc)) from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or manifest.get("format_version") != FORMAT_VERSION
    ):
        raise InvalidInputError(
            "directory",
            f"{FORMAT} version {FORMAT_VERSION} in {path.name}",
            manifest.get("format_version") if isinstance(manifest, dict) else None,
        )
    count = manifest.get("replica_count")
    if (
        manifest.get("replica_index") != index
        or isinstance(count, bool)
        or not isinstance(count, int)
        or not 0 <= index < count
    ):
        raise InvalidInputError(
            "directory",
            f"{path.name}: replica_index {index} of an integer replica_count > {index}",
            {k: manifest.get(k) for k in ("replica_index", "replica_count")},
        )
    check_dims(manifest.get("dims"), path.name)
    if not verify_seal(manifest, path.name, "directory"):
        unsealed.append(path.name)
    return manifest


def _refuse_no_manifest(directory: Path) -> NoReturn:
    """Refuse a directory holding no manifest, pointing at the converter when it holds a
    checkpoint PERSIA wrote (``persia_format.py``)."""
    if any(directory.glob("s*/replica_*_shard_*.emb")):
        raise InvalidInputError(
            "directory",
            "a Pyrsia checkpoint (replica_<i>.manifest.json files)",
            str(directory),
            message=f"directory: {directory} holds a checkpoint written by PERSIA "
            "(s<r>/replica_<r>_shard_<i>.emb); convert it first with "
            "`persia-launcher convert-checkpoint --persia-dir DIR --output OUT "
            "--optimizer JSON` and load OUT",
        )
    raise InvalidInputError(
        "directory", "a checkpoint (replica_<i>.manifest.json files)", str(directory)
    )


def _checkpoint_optimizer(store: BulkStore, manifests: list[dict]) -> OptimizerSpec | None:
    """The optimizer the store will have after loading ``manifests`` (the store's own, or the
    checkpoint's when the store has none); refuses one it cannot take. Changes nothing."""
    specs = {json.dumps(m.get("optimizer"), sort_keys=True) for m in manifests}
    if len(specs) != 1:
        raise InvalidInputError("directory", "parts written with one optimizer", sorted(specs))
    raw = manifests[0].get("optimizer")
    saved = optimizer_from_dict(raw, "manifest.optimizer") if raw is not None else None
    if store.optimizer is None:
        return saved
    if state_layout(saved) != state_layout(store.optimizer):
        raise ConflictError(
            f"optimizer: the checkpoint was trained with {raw}, the store has "
            f"{optimizer_to_dict(store.optimizer)} registered; register the checkpoint's optimizer "
            "(or clear and register nothing) before loading",
        )
    return store.optimizer


def _check_widths(manifests: list[dict], optimizer: OptimizerSpec | None) -> None:
    """Refuse (ConflictError) parts whose rows are not ``dim`` + ``optimizer``'s state wide."""
    for m in manifests:
        for dim, info in m["dims"].items():
            expect = int(dim) + state_width(optimizer, int(dim))
            if info["width"] != expect:
                raise ConflictError(
                    f"checkpoint dim {dim} rows are {info['width']} wide, the store expects {expect}",
                )


def _empty_for(store: BulkStore, optimizer: OptimizerSpec | None) -> None:
    """Clear ``store`` for a load; a store with no optimizer yet takes the checkpoint's."""
    if store.optimizer is None:
        store.clear()
        if optimizer is not None:
            store.register_optimizer(optimizer)
    store.clear()


def load_store(
    store: BulkStore,
    directory: str | Path,
    replica_index: int,
    replica_count: int,
    *,
    workers: int = 1,
) -> int:
    """Replace ``store``'s entries with those of the checkpoint routed to ``replica_index``,
    reading with ``workers`` threads (the loaded store does not depend on it).

    Check first, then swap: the whole checkpoint is proven (``checkpoint_verify.py``: manifests,
    headers, sizes, per-file CRC-32) before the store is cleared, so every refusal (a bad
    manifest, a missing, truncated or damaged file, an optimizer or width conflict) leaves the
    store bit-identical. The trade-off chosen over loading into a staging store and swapping:
    peak memory stays one store (plus ``2 * workers`` pieces of at most ``CHUNK_BYTES`` in
    flight) instead of two, at the price of reading the files twice (the CRC pass, then the
    load, mostly from the page cache). What is not a refusal can still fail after the clear: the
    disk failing mid-read (EIO) or memory running out leaves a partly loaded store, as it would
    a staging store's process.
    """
    replica_index, replica_count = check_replica(replica_index, replica_count)
    workers = positive_int(workers, "num_workers")
    directory = Path(directory)
    manifests = read_manifests(directory)
    optimizer = _checkpoint_optimizer(store, manifests)
    _check_widths(manifests, optimizer)  # before reading any file
    loaded = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ps-checkpoint") as pool:
        parts, checksummed = verify_parts(directory, manifests, pool)
        if not checksummed:
            log.warning(
                "checkpoint %s was written without checksums (before they existed): its "
                "manifests, headers and sizes are checked, its contents cannot be",
                directory,
            )
        _empty_for(store, optimizer)  # nothing was refused: from here on the store changes
        for part in parts:
            for pair in part:
                loaded += read_routed(
                    pool,
                    workers,
                    pair.ids,
                    pair.rows,
                    replica_index,
                    replica_count,
                    lambda i, r, dim=pair.dim: store.import_entries(dim, i, r, pool),
                )
    log.info(
        "loaded %d entries from %s as replica %d/%d",
        loaded,
        directory,
        replica_index,
        replica_count,
    )
    return loaded
