"""Writes PERSIA embedding checkpoints byte for byte, for the reader's tests.

Independent of the reader: the bytes follow PERSIA's sources directly (PersiaML/PERSIA:
``rust/persia-model-manager/src/lib.rs`` names the files and ``embedding_dump_done``;
``rust/persia-embedding-holder/src/array_linked_list.rs`` the ``ArrayLinkedList`` and its hand-written
``LinkedListNode`` speedy impls; ``rust/persia-embedding-holder/src/emb_entry.rs`` the
``HashMapEmbeddingEntry``; speedy writes ``usize`` as u64, a ``Vec`` length as u32, little endian).
:func:`emb_file_bytes` builds any list (freed slots, any order, mixed dims) with ``struct``;
:func:`uniform_emb_file` writes a large all-live file of one inner length with a numpy
structured array, as fast as the disk.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


def emb_file_bytes(signs, inners, dims, slots=None, n_slots=None) -> bytes:
    """An ``ArrayLinkedList<HashMapEmbeddingEntry>``: entry k (list order, least recently used
    first) sits in element ``slots[k]``; the other elements of ``n_slots`` are freed slots."""
    n = len(signs)
    slots = list(range(n)) if slots is None else list(slots)
    n_slots = n if n_slots is None else n_slots
    freed = [i for i in range(n_slots) if i not in set(slots)]
    nodes: list[bytes] = [b""] * n_slots
    for k, slot in enumerate(slots):
        prev = slots[k - 1] + 1 if k > 0 else 0
        nxt = slots[k + 1] + 1 if k + 1 < n else 0
        inner = np.asarray(inners[k], dtype="<f4")
        nodes[slot] = (
            struct.pack("<IIB", nxt, prev, 1)
            + struct.pack("<I", inner.shape[0])
            + inner.tobytes()
            + struct.pack("<QQ", int(dims[k]), int(signs[k]))
        )
    for j, slot in enumerate(freed):  # the free chain: next_index is the next free slot
        nxt = freed[j + 1] + 1 if j + 1 < len(freed) else 0
        nodes[slot] = struct.pack("<IIB", nxt, 0, 0)
    header = struct.pack(
        "<QIIIII",
        n,
        slots[0] + 1 if n else 0,
        slots[-1] + 1 if n else 0,
        freed[0] + 1 if freed else 0,
        n_slots,
        n_slots,
    )
    return header + b"".join(nodes)


def uniform_emb_file(path: Path, signs: np.ndarray, inner: np.ndarray, dim: int) -> None:
    """All-live file, element k = list position k, every entry ``inner.shape[1]`` floats."""
    n, length = inner.shape
    node = np.dtype(
        [
            ("next", "<u4"),
            ("prev", "<u4"),
            ("flag", "u1"),
            ("len", "<u4"),
            ("inner", "<f4", (length,)),
            ("dim", "<u8"),
            ("sign", "<u8"),
        ]
    )
    nodes = np.zeros(n, dtype=node)
    position = np.arange(1, n + 1, dtype=np.uint32)
    nodes["next"] = np.where(position < n, position + 1, 0)
    nodes["prev"] = position - 1
    nodes["flag"] = 1
    nodes["len"] = length
    nodes["inner"] = inner
    nodes["dim"] = dim
    nodes["sign"] = signs
    with open(path, "wb") as f:
        f.write(struct.pack("<QIIIII", n, 1 if n else 0, n, 0, n, n))
        nodes.tofile(f)


def done_yaml(num_shards: int, num_internal_shards: int) -> str:
    """What PERSIA's ``mark_embedding_dump_done`` appends (serde_yaml of EmbeddingModelInfo)."""
    return (
        f"---\nnum_shards: {num_shards}\nnum_internal_shards: {num_internal_shards}\n"
        "datetime:\n  secs_since_epoch: 1650000000\n  nanos_since_epoch: 0\n\n"
    )


def write_checkpoint(directory: Path, files: dict[tuple[int, int], bytes]) -> None:
    """``files[(replica, internal shard)]`` as PERSIA lays them out, done markers included."""
    replicas = 1 + max(r for r, _ in files)
    shards = 1 + max(s for _, s in files)
    for (replica, shard), data in files.items():
        shard_dir = directory / f"s{replica}"
        shard_dir.mkdir(parents=True, exist_ok=True)
        (shard_dir / f"replica_{replica}_shard_{shard}.emb").write_bytes(data)
    for replica in range(replicas):
        (directory / f"s{replica}" / "embedding_dump_done").write_text(done_yaml(replicas, shards))
    (directory / "embedding_dump_done").write_text(done_yaml(replicas, shards))
