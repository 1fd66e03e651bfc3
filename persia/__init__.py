"""Pyrsia's public API, import-compatible with PERSIA's documented Python API.

Submodules, as in PERSIA: ``persia.ctx`` (contexts), ``persia.data`` (datasets and the
data loader), ``persia.embedding`` (embedding config, batch types, optimizers),
``persia.env``, ``persia.errors`` (the exception tree), ``persia.distributed``, ``persia.logger``, ``persia.utils``,
``persia.service``, ``persia.prelude`` (the Python equivalents of PERSIA's Rust-core names) and
``persia.helper`` (a local job for tests), ``persia.version`` (``__version__``). ``persia.get_rank()`` and the other
``persia.env`` getters are there too, as PERSIA's ``from .env import *`` put them. They are imported on first use, so ``import persia`` stays cheap.
It reads one variable, ``LOG_LEVEL``: the level of the stderr handler it gives the ``persia``
logger when the script has not configured logging (``persia.logger.install_library_handler``),
so library lines such as EPL's plan show, as PERSIA's do.
"""

from __future__ import annotations

import importlib
from typing import Any

from persia.logger import install_library_handler
from persia.version import __version__

install_library_handler()

__all__ = [
    "__version__",
    "ctx",
    "data",
    "distributed",
    "embedding",
    "env",
    "errors",
    "helper",
    "logger",
    "prelude",
    "service",
    "utils",
    "version",
]


_ENV_NAMES = (
    "get_local_rank",
    "get_rank",
    "get_replica_index",
    "get_replica_size",
    "get_world_size",
    "reload_env",
    "set_env",
)
"""PERSIA's ``persia/__init__.py`` does ``from .env import *``: these are ``persia.env``'s."""
__all__ += list(_ENV_NAMES)


def __getattr__(name: str) -> Any:
    if name in _ENV_NAMES or name in ("PERSIA_LAUNCHER_VERBOSE", "PERSIA_SKIP_CHECK_DATA"):
        return getattr(importlib.import_module("persia.env"), name)
    if name in __all__ and name != "__version__":
        return importlib.import_module(f"persia.{name}")
    raise AttributeError(f"module 'persia' has no attribute {name!r}")
