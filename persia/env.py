"""Where this process sits in the job, read from the environment.

``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` are set for NN-worker processes by
torch's launcher; ``REPLICA_INDEX`` and ``REPLICA_SIZE`` are set for data loaders
and services by ``persia-launcher``.

Nothing is read at import time: the first getter call reads the environment and
the values are cached until :func:`reload_env` (PERSIA reads once and never again).

What the getters return, as PERSIA's API does:

- ``get_rank``, ``get_local_rank``, ``get_world_size``: ``None`` when ``RANK`` is
  unset. As in PERSIA, ``RANK`` alone decides whether this is an NN-worker process:
  without it ``LOCAL_RANK`` and ``WORLD_SIZE`` are ignored (not even validated), so a
  data loader started in a shell that exports them still works. When ``RANK`` is set,
  ``LOCAL_RANK`` and ``WORLD_SIZE`` must be set too.
- ``get_replica_index``, ``get_replica_size``: ``0`` and ``1`` when both are unset.
  Unlike PERSIA they are read whether or not ``RANK`` is set (PERSIA returns ``None``
  for them inside NN workers).

An empty variable counts as unset. A malformed or inconsistent value is a
:class:`~pyrsia.shared.errors.ConfigError` naming the variable.

``set_env(rank=..., world_size=..., ...)`` sets the values the getters return, unchecked,
as PERSIA's does (until :func:`reload_env`). PERSIA's two switches are read when first
used, not at import: ``PERSIA_LAUNCHER_VERBOSE`` (``persia.utils.run_command`` logs its
command line) and ``PERSIA_SKIP_CHECK_DATA`` (accepted; Pyrsia still checks every batch,
see the migration guide). ``from persia.env import PERSIA_SKIP_CHECK_DATA`` works and
reads the variable at that moment.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from pyrsia.shared.errors import ConfigError

__all__ = [
    "get_local_rank",
    "get_rank",
    "get_replica_index",
    "get_replica_size",
    "get_world_size",
    "launcher_verbose",
    "reload_env",
    "set_env",
    "skip_check_data",
]


@dataclass(frozen=True)
class _Env:
    rank: int | None
    local_rank: int | None
    world_size: int | None
    replica_index: int
    replica_size: int


_lock = threading.Lock()
_cached: _Env | None = None


def _read_int(name: str, minimum: int) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}: expected an integer >= {minimum}, got {raw!r}"
        ) from None
    if value < minimum:
        raise ConfigError(
            f"environment variable {name}: expected an integer >= {minimum}, got {value}"
        )
    return value


def _require_together(values: dict[str, int | None]) -> None:
    given = [name for name, value in values.items() if value is not None]
    missing = [name for name, value in values.items() if value is None]
    if given and missing:
        raise ConfigError(
            f"environment variable {missing[0]} is not set but {', '.join(given)} "
            f"{'is' if len(given) == 1 else 'are'}: set {', '.join(values)} together"
        )


def _check_below(name: str, value: int | None, bound_name: str, bound: int | None) -> None:
    if value is not None and bound is not None and value >= bound:
        raise ConfigError(
            f"environment variable {name}: expected an integer below {bound_name}={bound}, got {value}"
        )


def _read_dist() -> dict[str, int | None]:
    """RANK, LOCAL_RANK, WORLD_SIZE; all None when RANK is unset (not an NN worker)."""
    rank = _read_int("RANK", 0)
    if rank is None:
        return {"RANK": None, "LOCAL_RANK": None, "WORLD_SIZE": None}
    dist = {
        "RANK": rank,
        "LOCAL_RANK": _read_int("LOCAL_RANK", 0),
        "WORLD_SIZE": _read_int("WORLD_SIZE", 1),
    }
    _require_together(dist)
    return dist


def _read_env() -> _Env:
    dist = _read_dist()
    _check_below("RANK", dist["RANK"], "WORLD_SIZE", dist["WORLD_SIZE"])
    _check_below("LOCAL_RANK", dist["LOCAL_RANK"], "WORLD_SIZE", dist["WORLD_SIZE"])
    replica = {
        "REPLICA_INDEX": _read_int("REPLICA_INDEX", 0),
        "REPLICA_SIZE": _read_int("REPLICA_SIZE", 1),
    }
    _require_together(replica)
    _check_below("REPLICA_INDEX", replica["REPLICA_INDEX"], "REPLICA_SIZE", replica["REPLICA_SIZE"])
    return _Env(
        rank=dist["RANK"],
        local_rank=dist["LOCAL_RANK"],
        world_size=dist["WORLD_SIZE"],
        replica_index=replica["REPLICA_INDEX"] if replica["REPLICA_INDEX"] is not None else 0,
        replica_size=replica["REPLICA_SIZE"] if replica["REPLICA_SIZE"] is not None else 1,
    )


def _env() -> _Env:
    global _cached
    with _lock:
        if _cached is None:
            _cached = _read_env()
        return _cached


def reload_env() -> None:
    """Forget the cached values; the next getter reads the environment again."""
    global _cached
    with _lock:
        _cached = None


def set_env(
    replica_size: int | None = None,
    replica_index: int | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
) -> None:
    """Set what the getters return, without any check (PERSIA's ``set_env``); the values
    stay until :func:`reload_env`. Arguments left out read as None, as in PERSIA."""
    global _cached
    with _lock:
        _cached = _Env(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            replica_index=replica_index,
            replica_size=replica_size,  # type: ignore[arg-type]
        )


def _switch(name: str) -> bool:
    raw = os.environ.get(name, "0").strip() or "0"
    try:
        return bool(int(raw))
    except ValueError:
        raise ConfigError(f"environment variable {name}: expected 0 or 1, got {raw!r}") from None


def launcher_verbose() -> bool:
    """``PERSIA_LAUNCHER_VERBOSE=1``: commands run through ``persia.utils.run_command`` are logged."""
    return _switch("PERSIA_LAUNCHER_VERBOSE")


def skip_check_data() -> bool:
    """``PERSIA_SKIP_CHECK_DATA=1``: read for PERSIA compatibility; batches are still checked."""
    return _switch("PERSIA_SKIP_CHECK_DATA")


def __getattr__(name: str):
    # PERSIA's module constants, read from the environment when a script asks for them
    if name == "PERSIA_LAUNCHER_VERBOSE":
        return launcher_verbose()
    if name == "PERSIA_SKIP_CHECK_DATA":
        return skip_check_data()
    raise AttributeError(f"module 'persia.env' has no attribute {name!r}")


def get_rank() -> int | None:
    """Global rank of this NN-worker process (``RANK``), or None outside an NN worker."""
    return _env().rank


def get_local_rank() -> int | None:
    """Rank of this process on its machine (``LOCAL_RANK``), or None outside an NN worker."""
    return _env().local_rank


def get_world_size() -> int | None:
    """Number of NN-worker processes (``WORLD_SIZE``), or None outside an NN worker."""
    return _env().world_size


def get_replica_index() -> int:
    """Index of this replica among the replicas of its service (``REPLICA_INDEX``, default 0)."""
    return _env().replica_index


def get_replica_size() -> int:
    """Number of replicas of this service (``REPLICA_SIZE``, default 1)."""
    return _env().replica_size
