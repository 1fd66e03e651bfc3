"""A checkpoint's data files written and read by ``num_workers`` threads at once.

``common_config.checkpointing_config.num_workers`` (PERSIA's key, default 4) is the number of
threads a PS uses to dump and load its part of a checkpoint. The work is cut into pieces whose
order and bytes do not depend on the number of threads, so 1 and 8 workers write byte-identical
``.npy`` files (the ones ``np.save`` would write)::

    dump  export   one task per (dim, internal shard): the shard's live ids and rows, under its
                   lock (each shard is a point in time, exactly as a one-thread export)
          write    every file is created at its final size with its .npy header, then filled by
                   tasks of at most CHUNK_BYTES, each an ``os.pwrite`` at its offset (no GIL)
          sync     one ``fsync`` task per file; the caller commits the manifest after all of them
    load  read     one task per run of rows (at most CHUNK_BYTES): the rows routed to this replica
                   (``replica_of``, a nogil kernel) gathered from the memory-mapped file
          import   in file order, each piece's internal shards filled in parallel (every shard
                   gets its ids in file order, so its contents and LRU order are the same for any
                   number of workers)

numpy's file and copy loops and the numba kernels release the GIL, so the threads overlap.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pyrsia.shared.farmhash import replica_of

if TYPE_CHECKING:
    from pyrsia.services.embedding_ps.bulk import BulkStore

CHUNK_BYTES = 16 << 20
"""Largest piece of a file one task writes or reads: small enough to spread a big table over
every worker, big enough that a task costs far more than its scheduling."""


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes before an array of this dtype and shape (format 1.0)."""
    buf = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _pieces(arrays: list[np.ndarray], header_len: int) -> Iterator[tuple[int, np.ndarray]]:
    """(file offset, contiguous piece of at most CHUNK_BYTES) of ``arrays`` written back to back."""
    offset = header_len
    for array in arrays:
        flat = np.ascontiguousarray(array).reshape(-1)
        step = max(1, CHUNK_BYTES // max(1, flat.itemsize))
        for start in range(0, flat.shape[0], step):
            piece = flat[start : start + step]
            yield offset + start * flat.itemsize, piece
        offset += flat.nbytes


def _crc32(header: bytes, arrays: list[np.ndarray]) -> int:
    """CRC-32 (``zlib.crc32``) of the file ``header`` + ``arrays`` make, from memory; each call
    over at most CHUNK_BYTES releases the GIL."""
    crc = zlib.crc32(header)
    for _, piece in _pieces(arrays, 0):
        crc = zlib.crc32(memoryview(piece).cast("B"), crc)
    return crc


def write_npy_files(
    pool: ThreadPoolExecutor, files: list[tuple[Path, list[np.ndarray]]]
) -> list[tuple[int, int]]:
    """Write each ``(path, arrays)`` as one .npy file holding the arrays concatenated (along
    axis 0), with the pieces spread over ``pool``; every file is fsynced before this returns.
    Returns each file's (size in bytes, CRC-32), which the manifest records so a load can
    prove the files are the ones written (``checkpoint_verify.py``)."""
    opened: list[int] = []
    tasks: list[Future] = []
    sizes: list[int] = []
    crcs: list[Future] = []
    try:
        for path, arrays in files:
            rows = sum(a.shape[0] for a in arrays)
            header = npy_header(arrays[0].dtype, (rows, *arrays[0].shape[1:]))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            opened.append(fd)
            sizes.append(len(header) + sum(a.nbytes for a in arrays))
            os.ftruncate(fd, sizes[-1])
            _pwrite_all(fd, memoryview(header), 0)
            crcs.append(pool.submit(_crc32, header, arrays))
            for offset, piece in _pieces(arrays, len(header)):
                tasks.append(pool.submit(_pwrite_all, fd, memoryview(piece).cast("B"), offset))
        _wait(tasks + crcs)
        tasks = [pool.submit(os.fsync, fd) for fd in opened]
        _wait(tasks)
        return [(size, crc.result()) for size, crc in zip(sizes, crcs, strict=True)]
    finally:
        _drain(tasks + crcs)  # no task still holds a descriptor when it is closed
        for fd in opened:
            os.close(fd)


def _wait(tasks: list[Future]) -> None:
    """Wait until every task is done or one failed; on a failure cancel or wait out the rest
    (none is left running) and raise it."""
    wait(tasks, return_when=FIRST_EXCEPTION)
    failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
    if failed is not None:
        _drain(tasks)
        raise failed.exception()


def _drain(tasks: list[Future]) -> None:
    """Cancel what has not started and wait for the rest, raising nothing (cleanup path)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        if not task.cancelled():
            task.exception()


def export_parallel(
    store: BulkStore, pool: ThreadPoolExecutor
) -> dict[int, tuple[list[np.ndarray], list[np.ndarray]]]:
    """{dim: (ids pieces, rows pieces)} of every stored entry, one task per (dim, shard), pieces in
    shard order (the order ``store.export_entries()`` concatenates them in)."""
    tasks = {
        dim: [pool.submit(store.export_shard, dim, k) for k in range(store.num_shards)]
        for dim in store.stored_dims()
    }
    _wait([t for per_dim in tasks.values() for t in per_dim])
    out: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for dim, per_dim in tasks.items():
        parts = [t.result() for t in per_dim]
        parts = [p for p in parts if p is not None and p[0].shape[0]]
        if parts:
            out[dim] = ([ids for ids, _ in parts], [rows for _, rows in parts])
    return out


def read_routed(
    pool: ThreadPoolExecutor,
    workers: int,
    ids: np.ndarray,
    rows: np.ndarray,
    replica_index: int,
    replica_count: int,
    on_piece: Callable[[np.ndarray, np.ndarray], None],
) -> int:
    """Call ``on_piece(ids, rows)`` (on this thread, in file order) with the entries of ``ids``/
    ``rows`` (rows may be a memory map) routed to ``replica_index`` of ``replica_count``; the
    routing and gathering of each run of rows is a task on ``pool``. Returns the entry count."""
    n = ids.shape[0]
    step = max(1, CHUNK_BYTES // max(1, rows.shape[1] * rows.itemsize))

    def routed(start: int) -> tuple[np.ndarray, np.ndarray]:
        part = ids[start : start + step]
        mask = replica_of(part, replica_count) == replica_index
        return part[mask], np.asarray(rows[start : start + step][mask])

    window = 2 * workers  # bounded read-ahead: memory stays O(window pieces)
    pending: deque[Future] = deque()
    loaded = 0

    def take_one() -> None:
        nonlocal loaded
        got_ids, got_rows = pending.popleft().result()
        if got_ids.shape[0]:
            on_piece(got_ids, got_rows)
            loaded += int(got_ids.shape[0])

    try:
        for start in range(0, n, step):
            pending.append(pool.submit(routed, start))
            if len(pending) >= window:
                take_one()
        while pending:
            take_one()
    finally:
        _drain(list(pending))
    return loaded


def save_npy(path: Path, array: np.ndarray) -> tuple[int, int]:
    """Write one .npy file completely (flushed to disk) without pickle, byte-identical to
    ``np.save``; returns its (size in bytes, CRC-32)."""
    array = np.ascontiguousarray(array)
    header = npy_header(array.dtype, array.shape)
    with open(path, "wb") as f:
        f.write(header)
        for _, piece in _pieces([array], 0):
            f.write(memoryview(piece).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    return len(header) + array.nbytes, _crc32(header, [array])


def write_entries(
    directory: Path, prefix: str, entries: dict[int, tuple[np.ndarray, np.ndarray]]
) -> dict:
    """Write ``{dim: (ids, rows)}`` one file after another (incremental packets: small);
    returns the manifest's ``dims`` part, with each file's size and CRC-32 as a dump's."""
    dims = {}
    for dim, (ids, rows) in entries.items():
        ids_name, rows_name = f"{prefix}dim{dim}.ids.npy", f"{prefix}dim{dim}.rows.npy"
        ids_bytes, ids_crc = save_npy(directory / ids_name, ids)
        rows_bytes, rows_crc = save_npy(directory / rows_name, rows)
        dims[str(dim)] = {
            "entries": int(ids.shape[0]),
            "width": int(rows.shape[1]),
            "ids": ids_name,
            "rows": rows_name,
            "ids_bytes": ids_bytes,
            "ids_crc32": ids_crc,
            "rows_bytes": rows_bytes,
            "rows_crc32": rows_crc,
        }
    return dims


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: dict) -> None:
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
        unlink_quietly(tmp)
        raise


def unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:  # already gone, or the disk refuses: nothing more to do here
        pass
