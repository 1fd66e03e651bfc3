"""Pyrsia's public API, import-compatible with PERSIA's documented Python API.

Submodules, as in PERSIA: ``persia.ctx`` (contexts), ``persia.data`` (datasets and the
data loader), ``persia.embedding`` (embedding config, batch types, optimizers),
``persia.env``, ``persia.errors`` (the exception tree), ``persia.distributed``, ``persia.logger``, ``persia.utils``,
``persia.service``, ``persia.prelude`` (the Python equivalents of PERSIA's Rust-core names) and
``persia.helper`` (a local job for tests). They are imported on first use, so ``import persia`` stays cheap.
It reads one variable, ``LOG_LEVEL``: the level of the stderr handler it gives the ``persia``
logger when the script has not configured logging (``persia.logger.install_library_handler``),
so library lines such as EPL's plan show, as PERSIA's do.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from persia.logger import install_library_handler

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
]


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        return importlib.import_module(f"persia.{name}")
    raise AttributeError(f"module 'persia' has no attribute {name!r}")
