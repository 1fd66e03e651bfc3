"""PERSIA's embedding checkpoint (``s<r>/replica_<r>_shard_<i>.emb``) read into numpy arrays.

The format, as PERSIA writes it (sources in PersiaML/PERSIA):

- ``rust/persia-model-manager/src/lib.rs`` (``EmbeddingModelManager::dump_embedding``): PS
  replica ``r`` writes ``<dir>/s<r>/replica_<r>_shard_<i>.emb``, one file per internal shard
  (``emb_path.write_all_speedy(&shard.linkedlist)``), then ``<dir>/s<r>/embedding_dump_done``;
  replica 0, once every ``s<r>`` has one, writes ``<dir>/embedding_dump_done`` too. That file
  is YAML: ``num_shards`` (PS replicas), ``num_internal_shards``, ``datetime``.
- ``rust/persia-storage`` (``PersiaPath::write_all_speedy``): the speedy bytes, little endian,
  no header, no compression.
- ``rust/persia-embedding-holder/src/array_linked_list.rs``: ``ArrayLinkedList<T>`` (derived
  speedy) is ``count: usize, first_index, last_index, free_index, end_index: u32,
  elements: Vec<LinkedListNode<T>>``; a ``LinkedListNode`` (written by hand there) is
  ``next_index: u32, prev_index: u32``, a ``u8`` flag, then the ``T`` when the flag is 1
  (a freed slot has flag 0 and nothing after it). Indices are 1-based, 0 ends the list;
  the list runs from ``first_index`` (least recently used) to ``last_index``.
- ``rust/persia-embedding-holder/src/emb_entry.rs``: ``HashMapEmbeddingEntry`` (derived
  speedy) is ``inner: Vec<f32>, embedding_dim: usize, sign: u64``; ``inner`` is the embedding
  (``embedding_dim`` values) followed by the optimizer state.
- speedy's encodings (``koute/speedy``, which ``persia-speedy`` 0.9 forks): ``usize`` is a
  ``u64``, a ``Vec``'s length a ``u32``, an ``Option`` a ``u8`` flag.
- the optimizer state (``rust/persia-common/src/optim.rs``, ``require_space``): SGD none,
  Adagrad ``a`` (dim; 1 with ``vectorwise_shared``), Adam ``m`` (dim) | ``v`` (dim). Adam's
  bias-correction powers are per feature group in memory and are not in the file.

So one file is, byte by byte::

    u64 count | u32 first | u32 last | u32 free | u32 end | u32 n
    n nodes:  u32 next | u32 prev | u8 1 | u32 L | f32 inner[L] | u64 dim | u64 sign
          or  u32 next | u32 prev | u8 0

Reading: one compiled pass (:func:`_scan`, GIL released) finds where each node starts and
checks every length against the file; the live nodes are then taken in list order, grouped by
``L``, their ``inner | dim | sign`` bytes gathered into one packed block per group and viewed
through a numpy structured dtype. No Python loop per entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np
import yaml

from pyrsia.shared.errors import InvalidInputError

HEADER_BYTES = 8 + 4 * 4 + 4
"""count (u64), first/last/free/end (u32 each), then the elements Vec's length (u32)."""
DONE_FILE = "embedding_dump_done"
_EMB_FILE = re.compile(r"^replica_(\d+)_shard_(\d+)\.emb$")
_ERRORS = {
    1: "a node past the end of the file",
    2: "a node flag other than 0 or 1",
    3: "an entry past the end of the file",
    4: "bytes after the last node",
    5: "a linked list that does not visit its live nodes once each",
}


@nb.njit(nogil=True, cache=True)
def _u32(buf, at):
    return (
        np.uint32(buf[at])
        | (np.uint32(buf[at + 1]) << 8)
        | (np.uint32(buf[at + 2]) << 16)
        | (np.uint32(buf[at + 3]) << 24)
    )


@nb.njit(nogil=True, cache=True)
def _scan(buf, n, first, starts, lengths, order):
    """Offsets of each node's entry (``starts``, -1 for a freed slot) and its ``L``; the live
    nodes' indices in list order into ``order``. Returns (error code, live count, where)."""
    size = buf.shape[0]
    at = HEADER_BYTES
    nexts = np.zeros(n, dtype=np.int64)
    live = 0
    for i in range(n):
        if at + 9 > size:
            return 1, live, at
        nexts[i] = _u32(buf, at)
        flag = buf[at + 8]
        at += 9
        if flag == 0:
            starts[i] = -1
            continue
        if flag != 1:
            return 2, live, at - 1
        if at + 4 > size:
            return 3, live, at
        length = np.int64(_u32(buf, at))
        at += 4
        if at + 4 * length + 16 > size:
            return 3, live, at
        starts[i] = at
        lengths[i] = length
        at += 4 * length + 16
        live += 1
    if at != size:
        return 4, live, at
    node = np.int64(first)
    for k in range(live):
        if node < 1 or node > n or starts[node - 1] < 0:
            return 5, live, k
        order[k] = node - 1
        node = nexts[node - 1]
    if node != 0:
        return 5, live, live
    return 0, live, 0


@nb.njit(nogil=True, cache=True)
def _gather(buf, starts, nbytes, out):
    """Copy ``nbytes`` from each of ``starts`` into consecutive rows of ``out`` (uint8)."""
    for k in range(starts.shape[0]):
        s = starts[k]
        base = k * nbytes
        for j in range(nbytes):
            out[base + j] = buf[s + j]


@dataclass(frozen=True)
class PersiaTable:
    """The entries of one ``embedding_dim``: ``ids`` (uint64, in PERSIA's LRU order, least
    recently used first) and ``inner`` (float32, ``(n, L)``: embedding | optimizer state)."""

    dim: int
    ids: np.ndarray
    inner: np.ndarray


def _bad(path: Path, expected: str, got: object) -> InvalidInputError:
    return InvalidInputError("checkpoint", f"{path}: {expected}", got)


def read_emb_file(path: str | Path) -> list[PersiaTable]:
    """One ``.emb`` file (one internal shard of one PS replica) as tables by dim."""
    path = Path(path)
    buf = np.fromfile(path, dtype=np.uint8)
    if buf.shape[0] < HEADER_BYTES:
        raise _bad(path, f"a PERSIA .emb file (at least {HEADER_BYTES} bytes)", buf.shape[0])
    count = int(buf[:8].view("<u8")[0])
    first = int(buf[8:12].view("<u4")[0])
    n = int(buf[HEADER_BYTES - 4 : HEADER_BYTES].view("<u4")[0])
    starts = np.empty(n, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    code, live, where = _scan(buf, n, first, starts, lengths, order)
    if code:
        raise _bad(
            path,
            "a PERSIA .emb file (speedy ArrayLinkedList<HashMapEmbeddingEntry>)",
            f"{_ERRORS[code]} (at {where})",
        )
    if live != count:
        raise _bad(path, f"as many live entries as its count ({count})", live)
    order = order[:live]
    starts, lengths = starts[order], lengths[order]
    tables: dict[int, list] = {}
    for length in np.unique(lengths):
        pick = np.flatnonzero(lengths == length)
        length = int(length)
        layout = np.dtype([("inner", "<f4", (length,)), ("dim", "<u8"), ("sign", "<u8")])
        block = np.empty(pick.shape[0] * layout.itemsize, dtype=np.uint8)
        _gather(buf, starts[pick], layout.itemsize, block)
        entries = block.view(layout)
        dims = entries["dim"]
        for dim in np.unique(dims):
            if not 0 < dim <= length:
                raise _bad(
                    path,
                    f"entries with 0 < embedding_dim <= {length} (their inner length)",
                    int(dim),
                )
            mine = dims == dim
            tables.setdefault(int(dim), []).append(
                (pick[mine], entries["sign"][mine], entries["inner"][mine].reshape(-1, length))
            )
    out = []
    for dim, parts in sorted(tables.items()):
        widths = {p[2].shape[1] for p in parts}
        if len(widths) != 1:
            raise _bad(
                path, f"one optimizer-state width for dim {dim}", sorted(w - dim for w in widths)
            )
        position = np.concatenate([p[0] for p in parts])
        keep = np.argsort(position, kind="stable")  # back to list order
        ids = np.concatenate([p[1] for p in parts])[keep].astype(np.uint64, copy=False)
        inner = np.concatenate([p[2] for p in parts])[keep]
        out.append(PersiaTable(dim, ids, np.ascontiguousarray(inner, dtype=np.float32)))
    return out


def _done_info(directory: Path) -> dict:
    done = directory / DONE_FILE
    if not done.is_file():
        raise _bad(
            directory,
            f"a complete PERSIA checkpoint ({DONE_FILE} is written last)",
            "no " + DONE_FILE,
        )
    try:
        info = yaml.safe_load(done.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise _bad(done, "PERSIA's YAML (num_shards, num_internal_shards)", str(exc)) from None
    for key in ("num_shards", "num_internal_shards"):
        value = info.get(key) if isinstance(info, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(done, f"{key}: a positive integer", value)
    return info


def emb_files(directory: str | Path) -> list[Path]:
    """Every ``.emb`` file of the PERSIA checkpoint in ``directory``, checked complete against
    its ``embedding_dump_done`` files (every replica's ``s<r>`` with all its shards)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise _bad(directory, "a PERSIA checkpoint directory", "not a directory")
    info = _done_info(directory)
    files = []
    for replica in range(info["num_shards"]):
        shard_dir = directory / f"s{replica}"
        if not shard_dir.is_dir():
            raise _bad(
                directory,
                f"s0..s{info['num_shards'] - 1} (num_shards {info['num_shards']})",
                f"no s{replica}",
            )
        _done_info(shard_dir)
        found = sorted(
            (int(m.group(2)), p)
            for p in shard_dir.iterdir()
            if (m := _EMB_FILE.match(p.name)) and int(m.group(1)) == replica
        )
        want = list(range(info["num_internal_shards"]))
        if [i for i, _ in found] != want:
            raise _bad(
                shard_dir,
                f"replica_{replica}_shard_<i>.emb for i in 0..{want[-1]}",
                [p.name for _, p in found],
            )
        files += [p for _, p in found]
    return files


def read_checkpoint(directory: str | Path) -> list[PersiaTable]:
    """Every entry of a PERSIA checkpoint, one table per dim (ids unique across files)."""
    by_dim: dict[int, list[PersiaTable]] = {}
    for path in emb_files(directory):
        for table in read_emb_file(path):
            by_dim.setdefault(table.dim, []).append(table)
    out = []
    for dim, parts in sorted(by_dim.items()):
        widths = {p.inner.shape[1] for p in parts}
        if len(widths) != 1:
            raise _bad(
                Path(directory),
                f"one optimizer-state width for dim {dim}",
                sorted(w - dim for w in widths),
            )
        ids = np.concatenate([p.ids for p in parts])
        if np.unique(ids).shape[0] != ids.shape[0]:
            raise _bad(Path(directory), f"each id stored once (dim {dim})", "duplicate ids")
        out.append(PersiaTable(dim, ids, np.concatenate([p.inner for p in parts])))
    return out
