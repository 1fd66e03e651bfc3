"""Incremental update, serving side: an Infer PS applies the packets training PS replicas write.

Training replica ``i`` (``enable_incremental_update: true``) writes finished packets as
``<incremental_dir>/replica_<i>/packet_<seq>_<unix ms>/`` (``packets.IncrementalWriter``:
written under a hidden temporary name, ``done`` marker last, then renamed). An Infer replica
scans every ``replica_*`` directory each ``incremental_scan_interval_seconds`` (PERSIA scans
every 10 s, hard-coded) and applies each new packet, per writer in sequence order, keeping the
ids routed to itself (any writer replica count)::

    packet with its done marker, readable       -> applied whole (every file checked first:
                                                   header, size, CRC-32 when recorded)
    packet without done, a later one finished   -> torn: skipped with a warning, never applied
    packet without done, the newest             -> not finished yet: looked at again next scan
    packet with done but unreadable/inconsistent-> torn: skipped with an error line
    packet stamped before the loaded checkpoint -> already in it: skipped

Writers' ids are disjoint (an id lives on one training replica), so the order only matters
within one writer's directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pyrsia.services.embedding_ps.checkpoint_verify import check_dims, read_pair
from pyrsia.services.embedding_ps.manifest_seal import verify as verify_seal
from pyrsia.services.embedding_ps.optimizers import state_layout
from pyrsia.services.embedding_ps.packets import FORMAT_VERSION, PACKET_FORMAT
from pyrsia.shared.embedding_spec import optimizer_from_dict
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.farmhash import replica_of
from pyrsia.shared.thread_offload import Offloader

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.bulk import BulkStore

log = logging.getLogger(__name__)

_PACKET = re.compile(r"^packet_(\d+)_(\d+)$")


@dataclass
class _Writer:
    """What this replica knows about one training replica's packet directory."""

    next_seq: int = 0


@dataclass
class LoaderStats:
    packets_applied: int = 0
    entries_applied: int = 0
    packets_skipped_torn: int = 0
    packets_skipped_old: int = 0
    last_packet: str = ""
    last_delay_s: float = 0.0
    scans: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_packet(
    store: BulkStore, packet: Path
) -> tuple[dict | None, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Every file of a finished packet, checked before anything is applied: (optimizer, {dim: (ids, rows)})."""
    try:
        manifest = json.loads((packet / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError("packet", "a readable manifest.json", str(exc)) from exc
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != PACKET_FORMAT
        or manifest.get("format_version") != FORMAT_VERSION
        or not isinstance(manifest.get("dims"), dict)
    ):
        raise InvalidInputError(
            "packet", f"a {PACKET_FORMAT} version {FORMAT_VERSION} manifest", packet.name
        )
    raw = manifest.get("optimizer")
    entries = {}
    dims = check_dims(manifest["dims"], f"{packet.name}/manifest.json")
    verify_seal(manifest, f"{packet.name}/manifest.json", "packet")
    for dim, info in dims.items():
        entries[dim] = read_pair(packet, info, dim)  # header, size and CRC-32 checked
    return raw, entries


class IncrementalLoader:
    """Scans ``root`` for training replicas' packets and applies the finished ones to ``store``."""

    def __init__(
        self,
        store: BulkStore,
        root: str | Path,
        replica_index: int,
        replica_count: int,
        *,
        since_unix_ms: int = 0,
    ):
        self.store = store
        self.root = Path(root)
        self.replica_index, self.replica_count = replica_index, replica_count
        self.since_unix_ms = since_unix_ms
        self.stats = LoaderStats()
        self._writers: dict[str, _Writer] = {}
        self._warned_missing = False

    async def scan_forever(self, offload: Offloader, interval_s: float) -> None:
        """:meth:`scan` now and every ``interval_s``, on ``offload``'s pool (an Infer PS's
        scanner task); a failed scan is logged and the next one retries."""
        while True:
            try:
                await offload.run(None, self.scan)
            except Exception:
                log.exception("incremental scan of %s failed", self.root)
            await asyncio.sleep(interval_s)

    def scan(self) -> int:
        """One pass over every writer directory; returns the number of packets applied."""
        self.stats.scans += 1
        if not self.root.is_dir():
            if not self._warned_missing:
                log.warning("incremental_dir %s does not exist (yet): nothing to load", self.root)
                self._warned_missing = True
            return 0
        applied = 0
        for sub in sorted(
            p for p in self.root.iterdir() if p.name.startswith("replica_") and p.is_dir()
        ):
            applied += self._scan_writer(sub, self._writers.setdefault(sub.name, _Writer()))
        return applied

    def _scan_writer(self, directory: Path, writer: _Writer) -> int:
        packets = []
        for path in directory.iterdir():
            m = _PACKET.match(path.name)
            if m and int(m.group(1)) >= writer.next_seq and path.is_dir():
                packets.append((int(m.group(1)), int(m.group(2)), path))
        packets.sort()
        finished = [(path / "done").exists() for _, _, path in packets]
        applied = 0
        for k, (seq, stamp_ms, path) in enumerate(packets):
            if not finished[k]:
                if not any(finished[k + 1 :]):
                    break  # the newest packet, still being written: next scan
                self.stats.packets_skipped_torn += 1
                log.warning(
                    "incremental packet %s has no done marker and a later packet is finished: skipped as torn",
                    path,
                )
            elif stamp_ms < self.since_unix_ms:
                self.stats.packets_skipped_old += 1
                log.debug("incremental packet %s predates the loaded checkpoint: skipped", path)
            else:
                applied += self._apply(path, stamp_ms)
            writer.next_seq = seq + 1
        return applied

    def _apply(self, path: Path, stamp_ms: int) -> int:
        try:
            raw, entries = read_packet(self.store, path)
            self._adopt_optimizer(raw)
            for dim, (_, rows) in entries.items():
                if rows.shape[1] != self.store.row_width(dim):
                    raise InvalidInputError(
                        "packet",
                        f"rows {self.store.row_width(dim)} wide at dim {dim}",
                        rows.shape[1],
                    )
        except InvalidInputError as exc:
            self.stats.packets_skipped_torn += 1
            log.error("incremental packet %s is torn or incompatible, skipped: %s", path, exc)
            return 0
        n = 0
        for dim, (ids, rows) in entries.items():
            mask = replica_of(ids, self.replica_count) == self.replica_index
            if mask.any():
                self.store.import_entries(dim, ids[mask], np.ascontiguousarray(rows[mask]))
                n += int(mask.sum())
        self.stats.packets_applied += 1
        self.stats.entries_applied += n
        self.stats.last_packet = f"{path.parent.name}/{path.name}"
        self.stats.last_delay_s = max(0.0, time.time() - stamp_ms / 1000.0)
        log.info(
            "incremental packet %s: %d entries applied (%.1fs after it was written)",
            self.stats.last_packet,
            n,
            self.stats.last_delay_s,
        )
        return 1

    def _adopt_optimizer(self, raw: object) -> None:
        """Rows carry the optimizer state: a store without an optimizer takes the packet's."""
        if raw is None:
            if self.store.optimizer is not None:
                raise InvalidInputError(
                    "packet", "rows with optimizer state (optimizer: null in packet)"
                )
            return
        spec = optimizer_from_dict(raw, "packet.optimizer")
        if self.store.optimizer is None:
            self.store.register_optimizer(spec)
        elif state_layout(spec) != state_layout(self.store.optimizer):
            raise InvalidInputError(
                "packet.optimizer", f"the loaded optimizer's layout ({self.store.optimizer})", raw
            )
