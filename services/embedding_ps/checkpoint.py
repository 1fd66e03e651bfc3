"""Embedding checkpoints: full dumps per replica, resharding loads, incremental packets.

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

Incremental packets (:class:`IncrementalWriter`) are directories ``packet_<seq>_<ms>`` holding the
same ``dim<d>.ids.npy``/``dim<d>.rows.npy`` pairs, a ``manifest.json`` and a ``done`` marker;
they appear atomically (written under a temporary name, then renamed).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from services.embedding_ps.checkpoint_files import (
    export_parallel,
    read_routed,
    write_entries,
    write_npy_files,
)
from services.embedding_ps.checkpoint_verify import check_dims, read_checked, verify_parts
from services.embedding_ps.optimizers import state_layout, state_width
from shared.constants import EMBEDDING_CHECKPOINT_FORMAT, EMBEDDING_CHECKPOINT_VERSION
from shared.embedding_spec import OptimizerSpec, optimizer_from_dict, optimizer_to_dict
from shared.errors import ConflictError, InvalidInputError
from shared.farmhash import replica_of
from shared.validate import positive_int

if TYPE_CHECKING:
    from services.embedding_ps.engine import EmbeddingStore

log = logging.getLogger(__name__)

FORMAT = EMBEDDING_CHECKPOINT_FORMAT
FORMAT_VERSION = EMBEDDING_CHECKPOINT_VERSION
_MANIFEST = re.compile(r"^replica_(\d+)\.manifest\.json$")


def _check_replica(replica_index: object, replica_count: object) -> tuple[int, int]:
    replica_count = positive_int(replica_count, "replica_count")
    if (
        isinstance(replica_index, bool)
        or not isinstance(replica_index, (int, np.integer))
        or not 0 <= replica_index < replica_count
    ):
        raise InvalidInputError(
            "replica_index", f"an integer in [0, {replica_count})", replica_index
        )
    return int(replica_index), int(replica_count)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` to ``path`` atomically (temporary file, fsync, rename); a failure removes
    the temporary file."""
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:  # already gone, or the disk refuses: nothing more to do here
        pass


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
            _unlink_quietly(path)


def dump_store(
    store: EmbeddingStore,
    directory: str | Path,
    replica_index: int,
    replica_count: int,
    *,
    workers: int = 1,
) -> dict:
    """Write ``store`` as replica ``replica_index`` of ``replica_count`` with ``workers`` threads
    (``checkpointing_config.num_workers``; the files do not depend on it); returns the manifest."""
    replica_index, replica_count = _check_replica(replica_index, replica_count)
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
            manifest = _write_part(store, directory, replica_index, replica_count, workers, token, started_ms)  # fmt: skip
            committed = True
        finally:
            if not committed:  # a failed dump (disk full, I/O error) takes its files with it
                for path in directory.glob(f"{prefix}*"):
                    _unlink_quietly(path)
        _fsync_dir(directory)
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
    store: EmbeddingStore,
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
    _fsync_dir(directory)
    _write_json(directory / f"replica_{replica_index}.manifest.json", manifest)
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
    manifests = {}
    for path in directory.iterdir():
        m = _MANIFEST.match(path.name)
        if m:
            try:
                manifest = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise InvalidInputError(
                    "directory", f"a readable manifest {path.name}", str(exc)
                ) from exc
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
            index = int(m.group(1))
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
            manifests[index] = manifest
    if not manifests:
        raise InvalidInputError(
            "directory", "a checkpoint (replica_<i>.manifest.json files)", str(directory)
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


def _checkpoint_optimizer(store: EmbeddingStore, manifests: list[dict]) -> OptimizerSpec | None:
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


def _read_pair(directory: Path, info: dict, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A packet's (ids, rows) for ``dim`` (``info`` checked by ``check_dims``), each file's
    header, size and CRC-32 (when recorded) checked first."""
    n, width = info["entries"], info["width"]
    ids = read_checked(f"dim {dim} ids", directory, info, "ids", (n,))
    rows = read_checked(f"dim {dim} rows", directory, info, "rows", (n, width))
    return ids, rows


def load_store(
    store: EmbeddingStore,
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
    replica_index, replica_count = _check_replica(replica_index, replica_count)
    workers = positive_int(workers, "num_workers")
    directory = Path(directory)
    manifests = read_manifests(directory)
    optimizer = _checkpoint_optimizer(store, manifests)
    for m in manifests:  # widths before reading any file
        for dim, info in m["dims"].items():
            expect = int(dim) + state_width(optimizer, int(dim))
            if info["width"] != expect:
                raise ConflictError(
                    f"checkpoint dim {dim} rows are {info['width']} wide, the store expects {expect}",
                )
    loaded = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ps-checkpoint") as pool:
        parts, checksummed = verify_parts(directory, manifests, pool)
        if not checksummed:
            log.warning(
                "checkpoint %s was written without checksums (before they existed): its "
                "manifests, headers and sizes are checked, its contents cannot be",
                directory,
            )
        # nothing was refused: from here on the store changes
        if store.optimizer is None:
            store.clear()
            if optimizer is not None:
                store.register_optimizer(optimizer)
        store.clear()
        for part in parts:
            for pair in part:
                loaded += read_routed(
                    pool, workers, pair.ids, pair.rows, replica_index, replica_count,
                    lambda i, r, dim=pair.dim: store.import_entries(dim, i, r, pool),
                )  # fmt: skip
    log.info(
        "loaded %d entries from %s as replica %d/%d",
        loaded,
        directory,
        replica_index,
        replica_count,
    )
    return loaded


class IncrementalWriter:
    """Writes the entries changed by updates as packets, every ``buffer_size`` distinct ids.

    The store calls :meth:`notify` with the ids it applied gradients to; :meth:`flush` writes
    whatever is pending (e.g. at shutdown). Thread-safe.
    """

    def __init__(self, directory: str | Path, buffer_size: int):
        buffer_size = positive_int(buffer_size, "incremental_buffer_size")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.buffer_size = int(buffer_size)
        self._lock = threading.Lock()
        self._pending: list[np.ndarray] = []
        self._pending_n = 0
        seqs = [
            int(p.name.split("_")[1])
            for p in self.directory.glob("packet_*_*")
            if p.name.split("_")[1].isdigit()
        ]
        self._seq = max(seqs, default=-1) + 1
        self.packets_written = 0

    def notify(self, store: EmbeddingStore, ids: np.ndarray) -> None:
        """Record updated ids; write a packet once ``buffer_size`` distinct ids are pending."""
        with self._lock:
            self._pending.append(ids)
            self._pending_n += ids.shape[0]
            if self._pending_n < self.buffer_size:
                return
            unique = np.unique(np.concatenate(self._pending))
            self._pending, self._pending_n = [unique], unique.shape[0]
            if unique.shape[0] >= self.buffer_size:
                self._write(store, unique)

    def flush(self, store: EmbeddingStore) -> Path | None:
        """Write the pending ids now (if any); returns the packet directory."""
        with self._lock:
            if not self._pending_n:
                return None
            return self._write(store, np.unique(np.concatenate(self._pending)))

    def _write(self, store: EmbeddingStore, ids: np.ndarray) -> Path:
        self._pending, self._pending_n = [], 0
        name = f"packet_{self._seq:08d}_{int(time.time() * 1000)}"
        self._seq += 1
        tmp = self.directory / f".{name}.tmp"
        tmp.mkdir()
        entries = store.export_entries(ids)
        dims = write_entries(tmp, "", entries)
        manifest = {
            "format": FORMAT + "-packet",
            "format_version": FORMAT_VERSION,
            "optimizer": optimizer_to_dict(store.optimizer)
            if store.optimizer is not None
            else None,
            "entries": sum(d["entries"] for d in dims.values()),
            "dims": dims,
        }
        _write_json(tmp / "manifest.json", manifest)
        (tmp / "done").write_text("")
        _fsync_dir(tmp)
        final = self.directory / name
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        self.packets_written += 1
        return final


def apply_packet(
    store: EmbeddingStore, packet: str | Path, replica_index: int = 0, replica_count: int = 1
) -> int:
    """Load one finished packet (``done`` present) into ``store``, keeping this replica's ids."""
    replica_index, replica_count = _check_replica(replica_index, replica_count)
    packet = Path(packet)
    if not (packet / "done").exists():
        raise InvalidInputError(
            "packet", "a finished packet directory (with a done marker)", str(packet)
        )
    try:
        manifest = json.loads((packet / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError("packet", "a readable manifest.json", str(exc)) from exc
    dims = check_dims(manifest.get("dims") if isinstance(manifest, dict) else None, packet.name)
    pairs = []
    for dim, info in dims.items():  # every file checked before the store changes
        if info["width"] != store._width(dim):
            raise ConflictError(
                f"packet dim {dim} rows are {info['width']} wide, the store expects {store._width(dim)}",
            )
        pairs.append((dim, *_read_pair(packet, info, dim)))
    applied = 0
    for dim, ids, rows in pairs:
        mask = replica_of(ids, replica_count) == replica_index
        store.import_entries(dim, ids[mask], np.asarray(rows[mask]))
        applied += int(mask.sum())
    return applied
