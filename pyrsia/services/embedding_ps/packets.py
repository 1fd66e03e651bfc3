"""Incremental packets, writing side: the entries updates changed, every ``buffer_size`` ids.

A training PS with ``enable_incremental_update`` writes packets as directories
``<incremental_dir>/replica_<i>/packet_<seq>_<unix ms>/`` holding the same ``dim<d>.ids.npy`` /
``dim<d>.rows.npy`` pairs as a checkpoint (each file's size and CRC-32 in ``manifest.json``),
and a ``done`` marker; they appear atomically (written under a hidden temporary name, then
renamed). ``incremental.py`` is the reading side (an Infer PS's scan); :func:`apply_packet`
applies one packet directly.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pyrsia.services.embedding_ps.checkpoint_files import fsync_dir, write_entries, write_json
from pyrsia.services.embedding_ps.checkpoint_verify import check_dims, check_replica, read_pair
from pyrsia.services.embedding_ps.manifest_seal import seal
from pyrsia.services.embedding_ps.manifest_seal import verify as verify_seal
from pyrsia.shared.constants import EMBEDDING_CHECKPOINT_FORMAT, EMBEDDING_CHECKPOINT_VERSION
from pyrsia.shared.embedding_spec import optimizer_to_dict
from pyrsia.shared.errors import ConflictError, InvalidInputError
from pyrsia.shared.farmhash import replica_of
from pyrsia.shared.validate import positive_int

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.bulk import BulkStore

PACKET_FORMAT = EMBEDDING_CHECKPOINT_FORMAT + "-packet"
FORMAT_VERSION = EMBEDDING_CHECKPOINT_VERSION


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

    def notify(self, store: BulkStore, ids: np.ndarray) -> None:
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

    def flush(self, store: BulkStore) -> Path | None:
        """Write the pending ids now (if any); returns the packet directory."""
        with self._lock:
            if not self._pending_n:
                return None
            return self._write(store, np.unique(np.concatenate(self._pending)))

    def _write(self, store: BulkStore, ids: np.ndarray) -> Path:
        self._pending, self._pending_n = [], 0
        name = f"packet_{self._seq:08d}_{int(time.time() * 1000)}"
        self._seq += 1
        tmp = self.directory / f".{name}.tmp"
        tmp.mkdir()
        entries = store.export_entries(ids)
        dims = write_entries(tmp, "", entries)
        manifest = {
            "format": PACKET_FORMAT,
            "format_version": FORMAT_VERSION,
            "optimizer": optimizer_to_dict(store.optimizer)
            if store.optimizer is not None
            else None,
            "entries": sum(d["entries"] for d in dims.values()),
            "dims": dims,
        }
        write_json(tmp / "manifest.json", seal(manifest))
        (tmp / "done").write_text("")
        fsync_dir(tmp)
        final = self.directory / name
        os.replace(tmp, final)
        fsync_dir(self.directory)
        self.packets_written += 1
        return final


def apply_packet(
    store: BulkStore, packet: str | Path, replica_index: int = 0, replica_count: int = 1
) -> int:
    """Load one finished packet (``done`` present) into ``store``, keeping this replica's ids."""
    replica_index, replica_count = check_replica(replica_index, replica_count)
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
    verify_seal(manifest, f"{packet.name}/manifest.json", "packet")
    pairs = []
    for dim, info in dims.items():  # every file checked before the store changes
        if info["width"] != store.row_width(dim):
            raise ConflictError(
                f"packet dim {dim} rows are {info['width']} wide, the store expects {store.row_width(dim)}",
            )
        pairs.append((dim, *read_pair(packet, info, dim)))
    applied = 0
    for dim, ids, rows in pairs:
        mask = replica_of(ids, replica_count) == replica_index
        store.import_entries(dim, ids[mask], np.asarray(rows[mask]))
        applied += int(mask.sum())
    return applied
