"""Gathered slots: lookup answers that carry each unique vector once, and their gradients.

A summed slot whose every sample holds exactly one id (no hash stack: the usual CTR
column) pools to a plain gather: row ``i`` of its ``(batch, dim)`` tensor is the vector of
sample ``i``'s id. For such slots a worker asked for ``"gathered": true`` answers, per dim
group, the group's unique vectors once plus each slot's row per sample, instead of one
``(batch, dim)`` tensor per slot; the NN worker gathers (the copy it makes anyway) and
sends back one gradient per unique vector, summed over the slots and samples that used
it. On Census-Income (33 slots, ~430 distinct ids in a 1,024-sample batch) that is
~160 KB instead of 2.2 MB each way. Pooled slots (several ids per sample, a hash stack,
raw slots) keep their tensors in the same answer::

    answer      "embeddings": [{"name": str, "data": array}        pooled slot
                               | {"name": str, "table": int}]       gathered slot, in slot order
                "tables": [{"dim": int, "data": float32 (rows, dim), "index": int32 (slots, batch)}]
                          index row k belongs to the k-th "embeddings" entry naming this table
    /gradients  "tables": [{"dim": int, "data": float32|float16 (rows, dim)}]  the answer's order
                "skipped_slots": [str]   gathered slots left out of the tables (no gradient, or
                                         non-finite on the NN worker); absent tables: all skipped
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import as_array, as_dict, as_int, as_list, as_str, get
from pyrsia.shared.wire.batch import MAX_FEATURES
from pyrsia.shared.wire.ps import MAX_DIM


@dataclass(frozen=True, eq=False)
class EmbeddingTable:
    """One dim group's unique vectors and, per gathered slot, each sample's row in them."""

    dim: int
    data: np.ndarray  # float32 (rows, dim)
    index: np.ndarray  # int32 (len(slots), batch)
    slots: tuple[str, ...]
    block: np.ndarray | None = field(default=None, repr=False)
    """In process only (embedded mode; never on the wire): the slots' rows already gathered,
    float32 ``(batch, len(slots), dim)``, ``block[:, k]`` being slot k's tensor; the NN
    worker uses it as that memory instead of gathering a copy."""

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    def slot_array(self, k: int) -> np.ndarray:
        """The pooled ``(batch, dim)`` tensor of this table's k-th slot (a new array)."""
        return self.data[self.index[k]]

    def to_wire(self) -> dict[str, Any]:
        return {"dim": self.dim, "data": self.data, "index": self.index}


class SlotEmbeddings(Sequence[tuple[str, np.ndarray]]):
    """A lookup answer's ``(slot, array)`` pairs in slot order; a gathered slot's array is
    made from its table when it is read, so code that wants arrays sees no difference."""

    def __init__(
        self, entries: Sequence[tuple[str, np.ndarray | tuple[int, int]]], tables: tuple
    ) -> None:
        self._entries = tuple(entries)
        self.tables: tuple[EmbeddingTable, ...] = tables

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        name, data = self._entries[i]
        if isinstance(data, tuple):
            table, k = data
            return name, self.tables[table].slot_array(k)
        return name, data

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        return (self[i] for i in range(len(self)))

    @property
    def single_table(self) -> EmbeddingTable | None:
        """The table, when one table holds every slot: its index rows are the slots, in
        order (a table's rows follow the entries that name it); else None."""
        tables = self.tables
        if len(tables) == 1 and len(tables[0].slots) == len(self._entries):
            return tables[0]
        return None

    @property
    def names(self) -> list[str]:
        """The slot names, in slot order."""
        return [name for name, _ in self._entries]

    @property
    def pooled(self) -> list[tuple[int, str, np.ndarray]]:
        """``(position, slot, array)`` of the slots that came pooled (not gathered)."""
        return [(i, n, d) for i, (n, d) in enumerate(self._entries) if not isinstance(d, tuple)]

    def to_wire(self) -> list[dict[str, Any]]:
        return [
            {"name": n, "table": d[0]} if isinstance(d, tuple) else {"name": n, "data": d}
            for n, d in self._entries
        ]


def parse_tables(
    raw: Any, table_of: list[tuple[int, int] | None], names: list[str], batch_size: int | None
) -> tuple[EmbeddingTable, ...]:
    """Check an answer's ``tables`` against the entries that name them.

    ``table_of[i]`` is ``(table, k)`` for the i-th entry when it names a table (k: its row
    of that table's index), else None. Raises ``InvalidInputError`` naming the field.
    """
    items = as_list(raw, "tables", max_len=len(names) or 1)
    slots: list[list[str]] = [[] for _ in items]
    for i, ref in enumerate(table_of):
        if ref is not None:
            if not 0 <= ref[0] < len(items):
                raise InvalidInputError(
                    f"embeddings[{i}].table", f"a table number below {len(items)}", ref[0]
                )
            slots[ref[0]].append(names[i])
    tables = []
    for t, item in enumerate(items):
        where = f"tables[{t}]"
        item, dim, data = _dim_and_data(item, where, "float32")
        index = as_array(
            get(item, "index", f"{where}.index"),
            f"{where}.index",
            dtype="int32",
            shape=(len(slots[t]), batch_size),
        )
        if index.size and (int(index.min()) < 0 or int(index.max()) >= data.shape[0]):
            raise InvalidInputError(
                f"{where}.index",
                f"rows in [0, {data.shape[0]})",
                f"[{int(index.min())}, {int(index.max())}]",
            )
        tables.append(EmbeddingTable(dim, data, index, tuple(slots[t])))
    return tuple(tables)


def parse_gradient_tables(raw: Any) -> tuple[tuple[int, np.ndarray], ...]:
    """``/gradients``' ``tables``: ``(dim, float32|float16 (rows, dim))`` each; the worker checks
    them against the batch it answered."""
    items = as_list(raw, "tables", max_len=MAX_FEATURES)
    return tuple(
        _dim_and_data(item, f"tables[{t}]", ("float32", "float16"))[1:]
        for t, item in enumerate(items)
    )


def _dim_and_data(item: Any, where: str, dtype: str | tuple[str, ...]) -> tuple[dict, int, Any]:
    """A table entry as a dict, its ``dim`` and its ``(rows, dim)`` ``data`` array, checked."""
    item = as_dict(item, where)
    dim = as_int(get(item, "dim", f"{where}.dim"), f"{where}.dim", min_value=1, max_value=MAX_DIM)
    data = as_array(
        get(item, "data", f"{where}.data"), f"{where}.data", dtype=dtype, shape=(None, dim)
    )
    return item, dim, data


def parse_names(raw: Any, field: str, limit: int) -> tuple[str, ...]:
    """A list of distinct strings (slot names)."""
    names = [as_str(s, f"{field}[{i}]") for i, s in enumerate(as_list(raw, field, max_len=limit))]
    if len(set(names)) != len(names):
        raise InvalidInputError(field, "distinct slot names", names)
    return tuple(names)
