"""A checkpoint checked whole before a load touches the store.

A load first proves the checkpoint, then clears the store and fills it: every refusal happens
before the store changes, so a refused load leaves it bit-identical (``checksum.py``). The
checks, for every part of every replica, in this order::

    manifest   format and version, one replica_count, every replica present, dims a mapping of
               {"entries", "width", "ids", "rows"} with plain file names in the directory
    header     each .npy header: ids uint64 (entries,), rows float32 (entries, width), C order
    size       the file is exactly header + data bytes (a truncated or padded file is refused)
    checksum   the file's CRC-32 (``zlib.crc32`` of the whole file, header included) equals the
               one the dump recorded; ``ids_bytes``/``rows_bytes`` equal the file sizes

Checkpoints written before checksums existed have no ``*_crc32`` keys: they still load with
every other check, and the load says so once in the log.

The verified files are memory-mapped and the maps are what the load reads, so a concurrent dump
that deletes the previous files (``dump_store`` removes them after its manifest) cannot pull
them away between the check and the load. The cost: every file is read twice (the CRC pass,
then the load; the second read mostly from the page cache). zlib's CRC-32 runs at about
4 GB/s from memory on the 2-core CI machine (2 GB/s reading a 100 MB file through the page
cache), about 10 times the load's own rate, so the pass adds a few percent to a load.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import zlib
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import positive_int

CRC_CHUNK = 16 << 20
"""Bytes hashed per ``zlib.crc32`` call (each call releases the GIL for its duration)."""

NPY_HEADER_LOCK = threading.Lock()
"""Held while numpy parses a .npy header (``ast.literal_eval``): CPython 3.11's compiler can
fail with "AST constructor recursion depth mismatch" (a SystemError) when two threads parse at
once, and a PS reads headers from a /load and an incremental scan on different threads."""

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.npy$")


@dataclass(frozen=True)
class VerifiedPair:
    """One dim of one part: ids (n,) and rows (n, width), memory-mapped from checked files."""

    dim: int
    ids: np.ndarray
    rows: np.ndarray


def _bad(expected: str, got: object) -> InvalidInputError:
    return InvalidInputError("directory", expected, got)


def _int(value: object, lo: int, hi: int | None = None) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= lo
        and (hi is None or value < hi)
    )


def check_dims(dims: object, where: str) -> dict[int, dict]:
    """A manifest's ``dims`` as {dim: info}, every field checked (the manifest is outside input)."""
    if not isinstance(dims, dict):
        raise _bad(f"{where}: dims, a mapping of dim to its files", type(dims).__name__)
    out = {}
    for key, info in dims.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) > 0):
            raise _bad(f"{where}: dims keys, positive integers", key)
        if not isinstance(info, dict):
            raise _bad(f"{where}: dims.{key}, a mapping", type(info).__name__)
        if not _int(info.get("entries"), 0) or not _int(info.get("width"), int(key)):
            raise _bad(
                f"{where}: dims.{key}.entries >= 0 and dims.{key}.width >= {key}",
                {"entries": info.get("entries"), "width": info.get("width")},
            )
        for kind in ("ids", "rows"):
            name = info.get(kind)
            if not isinstance(name, str) or not _PLAIN_NAME.match(name):
                raise _bad(
                    f"{where}: dims.{key}.{kind}, a plain file name in the checkpoint "
                    "directory ending in .npy",
                    name,
                )
            for suffix, hi in (("bytes", None), ("crc32", 1 << 32)):
                value = info.get(f"{kind}_{suffix}")
                if value is not None and not _int(value, 0, hi):
                    raise _bad(f"{where}: dims.{key}.{kind}_{suffix}, an integer", value)
        out[int(key)] = info
    return out


def _crc32(buf: mmap.mmap) -> int:
    crc = 0
    view = memoryview(buf)
    try:
        for start in range(0, len(view), CRC_CHUNK):
            crc = zlib.crc32(view[start : start + CRC_CHUNK], crc)
    finally:
        view.release()
    return crc


def _map_checked(
    label: str, path: Path, dtype: np.dtype, shape: tuple[int, ...], size: int | None
) -> tuple[str, mmap.mmap, int]:
    """``path`` memory-mapped, after its header and size are checked: (name for errors, map,
    data offset). Headers are parsed under ``NPY_HEADER_LOCK``."""
    name = f"{label} file {path.name}"
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the map outlives it
    except OSError as exc:
        raise _bad(f"a readable data file {name}", exc.strerror or str(exc)) from exc
    with f:
        try:
            with NPY_HEADER_LOCK:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    got_shape, fortran, got_dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    got_shape, fortran, got_dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    got_shape = None  # a version numpy reads but this file format never has
        except (OSError, ValueError) as exc:
            raise _bad(f"a .npy header in {name}", str(exc)) from exc
        if got_shape is None:
            raise _bad(f"a .npy header in {name}", f"npy format version {version}")
        if got_dtype != dtype or tuple(got_shape) != shape or fortran:
            raise _bad(
                f"{name}: {np.dtype(dtype).name} {shape} in C order",
                f"{got_dtype}{tuple(got_shape)}{' fortran' if fortran else ''}",
            )
        offset = f.tell()
        want = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        actual = os.fstat(f.fileno()).st_size
        if actual != want or (size is not None and size != actual):
            raise _bad(
                f"{name}: {want} bytes (header and data"
                + (f"; the dump recorded {size}" if size is not None else "")
                + ")",
                f"{actual} bytes (truncated or damaged)",
            )
        return name, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), offset


def _checked_array(
    name: str, buf: mmap.mmap, offset: int, dtype: np.dtype, shape: tuple[int, ...], crc: int | None
) -> np.ndarray:
    """The array in ``buf`` after ``offset``, once the whole file's CRC-32 matches ``crc``
    (None: a checkpoint from before checksums). One task per file on the pool."""
    if crc is not None:
        got = _crc32(buf)
        if got != crc:
            raise _bad(
                f"{name}: CRC-32 {crc:08x} as recorded by the dump", f"{got:08x} (contents damaged)"
            )
    if len(buf) == offset:  # no entries: nothing to view
        return np.zeros(shape, dtype=dtype)
    return np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset)


def read_checked(
    label: str, directory: Path, info: dict, kind: str, shape: tuple[int, ...]
) -> np.ndarray:
    """One file of a ``check_dims``-checked ``info`` (``kind`` "ids" or "rows"), memory-mapped
    after its header, size and CRC-32 (when recorded) are checked, on this thread: incremental
    packets, which are small."""
    dtype = np.dtype(np.uint64 if kind == "ids" else np.float32)
    name, buf, offset = _map_checked(
        label, directory / info[kind], dtype, shape, info.get(f"{kind}_bytes")
    )
    return _checked_array(name, buf, offset, dtype, shape, info.get(f"{kind}_crc32"))


def verify_parts(
    directory: Path, manifests: list[dict], pool: Executor
) -> tuple[list[list[VerifiedPair]], bool]:
    """Every data file of ``manifests`` (checked by ``check_dims`` already) checked against its
    manifest, one task per file on ``pool``, as memory-mapped pairs per part. Returns the pairs
    and whether every file had a recorded checksum. Raises InvalidInputError naming the file."""
    all_checksummed = True
    parts: list[list[tuple[int, list[Future]]]] = []  # per part: (dim, [ids task, rows task])
    for m in manifests:
        files = []
        for dim_s, info in m["dims"].items():
            dim, n, width = int(dim_s), info["entries"], info["width"]
            pair = []
            for kind, dtype, shape in (
                ("ids", np.dtype(np.uint64), (n,)),
                ("rows", np.dtype(np.float32), (n, width)),
            ):
                crc = info.get(f"{kind}_crc32")
                all_checksummed &= crc is not None
                # headers and sizes on this thread, the CRCs on the pool
                name, buf, offset = _map_checked(
                    f"dim {dim} {kind}",
                    directory / info[kind],
                    dtype,
                    shape,
                    info.get(f"{kind}_bytes"),
                )
                pair.append(pool.submit(_checked_array, name, buf, offset, dtype, shape, crc))
            files.append((dim, pair))
        parts.append(files)
    tasks = [task for files in parts for _, pair in files for task in pair]
    for task in tasks:  # every task finished before the first failure is raised
        task.exception()
    return [
        [VerifiedPair(dim, ids.result(), rows.result()) for dim, (ids, rows) in files]
        for files in parts
    ], all_checksummed


def check_replica(replica_index: object, replica_count: object) -> tuple[int, int]:
    """``(replica_index, replica_count)`` as ints, ``0 <= index < count``, or InvalidInputError."""
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


def read_pair(directory: Path, info: dict, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A packet's (ids, rows) for ``dim`` (``info`` checked by ``check_dims``), each file's
    header, size and CRC-32 (when recorded) checked first."""
    n, width = info["entries"], info["width"]
    ids = read_checked(f"dim {dim} ids", directory, info, "ids", (n,))
    rows = read_checked(f"dim {dim} rows", directory, info, "rows", (n, width))
    return ids, rows
