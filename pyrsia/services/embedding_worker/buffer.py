"""The embedding worker's two bounded, expiring stores of prepared batches.

``ForwardBuffer`` holds batches that data loaders sent and NN workers have not yet
asked for, at most ``capacity`` per data-loader replica (a full loader gets 429 and
retries). ``GradientBuffer`` holds batches whose embeddings were handed out and
whose gradients are awaited; it is bounded too, dropping the oldest, so an NN
worker that dies cannot make the worker grow without end (PERSIA's did).
Entries older than ``ttl_s`` are dropped from both. A lookup of a dropped or
unknown reference raises ``NotFoundError`` naming it and saying which.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pyrsia.shared.errors import BackPressureError, ConflictError, NotFoundError

T = TypeVar("T")

_FORGET_AFTER = 100_000
"""How many dropped references are remembered to tell "dropped" from "unknown"."""


@dataclass
class _Entry(Generic[T]):
    value: T
    owner: int
    created: float = field(default_factory=time.monotonic)


class _Store(Generic[T]):
    def __init__(self, what: str, ttl_s: float):
        self.what = what
        self.ttl_s = ttl_s
        self._entries: OrderedDict[int, _Entry[T]] = OrderedDict()
        self._dropped: OrderedDict[int, str] = OrderedDict()
        self.expired = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def _forget(self, key: int, why: str) -> None:
        self._dropped[key] = why
        if len(self._dropped) > _FORGET_AFTER:
            self._dropped.popitem(last=False)

    def _drop_oldest(self, why: str) -> _Entry[T]:
        key, entry = self._entries.popitem(last=False)
        self._forget(key, why)
        return entry

    def expire(self, now: float | None = None) -> int:
        """Drop entries older than the TTL; return how many were dropped."""
        now = time.monotonic() if now is None else now
        dropped = 0
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.created < self.ttl_s:
                break
            self._drop_oldest(f"expired after {self.ttl_s:g}s")
            self._on_removed(entry)
            dropped += 1
        self.expired += dropped
        return dropped

    def _on_removed(self, entry: _Entry[T]) -> None:
        pass

    def peek(self, key: int) -> T:
        """The value under ``key`` without removing it (404 like :meth:`pop`)."""
        self.expire()
        entry = self._entries.get(key)
        if entry is None:
            why = self._dropped.get(key)
            if why is not None:
                raise NotFoundError(f"{self.what} {key} was dropped ({why})")
            raise NotFoundError(f"{self.what} {key} is unknown to this worker")
        return entry.value

    def pop(self, key: int) -> T:
        self.peek(key)
        entry = self._entries.pop(key)
        self._on_removed(entry)
        return entry.value


class ForwardBuffer(_Store[T]):
    """Batches waiting for their embedding lookup, bounded per data-loader replica."""

    def __init__(self, capacity_per_loader: int, ttl_s: float):
        super().__init__("batch", ttl_s)
        self.capacity = capacity_per_loader
        self._per_loader: defaultdict[int, int] = defaultdict(int)

    def _on_removed(self, entry: _Entry[T]) -> None:
        self._per_loader[entry.owner] -= 1

    def put(self, key: int, loader: int, value: T) -> None:
        """Buffer ``value``; 429 when ``loader`` already has ``capacity`` waiting, 409 on a repeat."""
        self.expire()
        if key in self._entries:
            raise ConflictError(f"batch {key} was already sent to this worker")
        if self._per_loader[loader] >= self.capacity:
            raise BackPressureError(
                f"forward buffer of data loader {loader} is full ({self.capacity} batches)",
            )
        self._entries[key] = _Entry(value, loader)
        self._per_loader[loader] += 1

    def pending_by_loader(self) -> dict[int, int]:
        return {k: v for k, v in self._per_loader.items() if v}


class GradientBuffer(_Store[T]):
    """Batches whose embeddings are out and whose gradients are awaited (oldest dropped when full)."""

    def __init__(self, capacity: int, ttl_s: float):
        super().__init__("gradient reference", ttl_s)
        self.capacity = capacity

    def put(self, key: int, value: T) -> None:
        self.expire()
        if key in self._entries:
            raise ConflictError(f"gradients for batch {key} are already awaited")
        while len(self._entries) >= self.capacity:
            self._drop_oldest(f"over the bound of {self.capacity} batches awaiting gradients")
            self.evicted += 1
        self._entries[key] = _Entry(value, 0)
