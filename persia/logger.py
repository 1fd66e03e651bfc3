"""Loggers for user scripts, as PERSIA's examples use them.

``get_logger(name)`` returns the standard library logger of that name.
``get_default_logger(name=None)`` returns a logger that prints to stderr with time,
level and source line (handler attached once), so ``train.py`` and
``data_loader.py`` log readably without configuring logging themselves. The level
comes from ``LOG_LEVEL`` (default INFO). Library modules use ``logging.getLogger``
and never configure handlers.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["DEFAULT_LOGGER_NAME", "get_default_logger", "get_logger"]

DEFAULT_LOGGER_NAME = "persia"
_FORMAT = "%(asctime)s %(levelname)-8s [%(filename)s:%(lineno)d] %(message)s"
_default_logger: logging.Logger | None = None


def get_logger(name: str) -> logging.Logger:
    """The logger called ``name`` (standard library logging)."""
    return logging.getLogger(name)


def _level() -> int:
    raw = (os.environ.get("LOG_LEVEL") or "INFO").upper()
    level = logging.getLevelName(raw)
    return level if isinstance(level, int) else logging.INFO


def get_default_logger(name: str | None = None, **_kwargs) -> logging.Logger:
    """The script's default logger; the first call picks its name (default ``"persia"``).

    A stderr handler is attached once; records do not propagate to the root logger, so
    an entry point that configures logging does not print them twice.
    """
    global _default_logger
    if _default_logger is None:
        logger = logging.getLogger(name or DEFAULT_LOGGER_NAME)
        if not any(getattr(h, "_persia_default", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(_FORMAT))
            handler._persia_default = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
        logger.setLevel(_level())
        logger.propagate = False
        _default_logger = logger
    return _default_logger
