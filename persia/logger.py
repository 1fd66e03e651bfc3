"""Loggers for user scripts, as PERSIA's examples use them.

``get_logger(name)`` returns the standard library logger of that name.
``get_default_logger(name=None, **options)`` returns the script's default logger: it
prints to stderr with time, level and source line, so ``train.py`` and
``data_loader.py`` log readably without configuring logging themselves. Library
modules use ``logging.getLogger`` and never configure handlers.

PERSIA's options are honoured (none is silently dropped; an unknown one is a TypeError):

- ``log_level``: a level number or name (``logging.DEBUG``, ``"INFO"``); default
  ``$LOG_LEVEL``, else INFO. (PERSIA's default was DEBUG; ``LOG_LEVEL`` is what its
  launcher and Kubernetes manifests set, so that is what Pyrsia reads.)
- ``enable_file_logger`` / ``log_filename`` (``"train.log"``): also append every record
  to that file, without colours.
- ``enable_err_redirect`` / ``err_redirect_filepath`` (``"error.log"``) /
  ``err_redirect_level`` (INFO): also append records *above* that level to that file.

The first call creates the default logger and picks its name (``"persia"`` unless given).
A later call returns the same logger; options it passes explicitly are applied to it
(a new level, another file), so ``get_default_logger(log_level="DEBUG")`` after an
import-time ``get_default_logger()`` still takes effect.

Library log lines (``persia.*`` loggers: EPL's plan, the checkpointer, the runtime) show by
default, as PERSIA's do (its modules call ``get_default_logger()`` on import):
``import persia`` calls :func:`install_library_handler`, which gives the ``persia`` logger
one stderr handler at ``$LOG_LEVEL`` (else INFO), unless logging is already configured
(the root logger has a handler, or the ``persia`` logger has a handler or a level). The
handler stands down once the root logger has a handler (a script that configures logging
after ``import persia``): records then reach the script's handlers by propagation only,
never twice. ``get_default_logger()`` on the ``persia`` logger replaces it with its own.
"""

from __future__ import annotations

import logging
import os
import sys

from pyrsia.shared.constants import ENV_LOG_LEVEL
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.settings import current

__all__ = [
    "COLOR_FORMATTER",
    "DEFAULT_LOGGER_NAME",
    "FILE_LOG_FORMAT",
    "FORMATTER",
    "LOG_COLOR",
    "STREAM_LOG_FORMAT",
    "get_default_logger",
    "get_logger",
    "install_library_handler",
    "levelFilter",
    "setLogger",
    "set_default_logger",
]

DEFAULT_LOGGER_NAME = "persia"
_FORMAT = "%(asctime)s %(levelname)-8s [%(filename)s:%(lineno)d] %(message)s"
_MARK = "_persia_default"
_default_logger: logging.Logger | None = None


class _LibraryHandler(logging.StreamHandler):
    """stderr for ``persia.*`` records while the script has not configured logging."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:  # configured after import: the root's handlers print it
            return
        super().emit(record)


def install_library_handler() -> logging.Handler | None:
    """Give the ``persia`` logger a stderr handler at ``$LOG_LEVEL`` (else INFO), unless logging
    is configured already; returns the handler (None when nothing was installed). Idempotent."""
    logger = logging.getLogger(DEFAULT_LOGGER_NAME)
    for handler in logger.handlers:
        if getattr(handler, _MARK, None) == "library":
            return handler
    if logging.getLogger().handlers or logger.handlers or logger.level != logging.NOTSET:
        return None
    handler = _LibraryHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    setattr(handler, _MARK, "library")
    logger.addHandler(handler)
    logger.setLevel(_env_level())
    return handler


def get_logger(name: str) -> logging.Logger:
    """The logger called ``name`` (standard library logging)."""
    return logging.getLogger(name)


class _AboveLevel(logging.Filter):
    """Passes records strictly above a level (PERSIA's error-redirect rule)."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > self.level


def _parse_level(value: int | str, field: str) -> int:
    if isinstance(value, bool):
        raise InvalidInputError(field, "a logging level (e.g. logging.INFO or 'DEBUG')", value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        level = logging.getLevelName(value.strip().upper())
        if isinstance(level, int):
            return level
    raise InvalidInputError(
        field, "a logging level: DEBUG, INFO, WARNING, ERROR, CRITICAL or a number", value
    )


def _env_level() -> int:
    raw = current().log_level
    try:
        return _parse_level(raw, ENV_LOG_LEVEL)
    except InvalidInputError:
        return logging.INFO


def _file_handler(logger: logging.Logger, path: str, kind: str) -> logging.FileHandler:
    """The logger's handler of ``kind`` writing ``path``; added (append mode) when missing."""
    target = os.path.abspath(path)
    for handler in logger.handlers:
        if getattr(handler, _MARK, None) == kind and handler.baseFilename == target:  # type: ignore[attr-defined]
            return handler  # type: ignore[return-value]
    handler = logging.FileHandler(target, mode="a")
    handler.setFormatter(logging.Formatter(_FORMAT))
    setattr(handler, _MARK, kind)
    logger.addHandler(handler)
    return handler


def _check_path(value: object, field: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise InvalidInputError(field, "a file path", value)
    return os.fspath(value)


def get_default_logger(
    name: str | None = None,
    log_level: int | str | None = None,
    log_filename: str = "train.log",
    enable_file_logger: bool = False,
    err_redirect_filepath: str = "error.log",
    enable_err_redirect: bool = False,
    err_redirect_level: int | str = logging.INFO,
) -> logging.Logger:
    """The script's default logger, configured by PERSIA's options (see the module docstring).

    A stderr handler is attached once; records do not propagate to the root logger, so
    an entry point that configures logging does not print them twice.
    """
    global _default_logger
    level = _parse_level(log_level, "log_level") if log_level is not None else None
    if _default_logger is None:
        logger = logging.getLogger(name or DEFAULT_LOGGER_NAME)
        for handler in [h for h in logger.handlers if getattr(h, _MARK, None) == "library"]:
            logger.removeHandler(handler)  # the default logger's own stream handler replaces it
        if not any(getattr(h, _MARK, None) == "stream" for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(_FORMAT))
            setattr(handler, _MARK, "stream")
            logger.addHandler(handler)
        logger.setLevel(level if level is not None else _env_level())
        logger.propagate = False
        _default_logger = logger
    elif level is not None:
        _default_logger.setLevel(level)
    _add_file_handlers(
        _default_logger,
        enable_file_logger,
        log_filename,
        enable_err_redirect,
        err_redirect_filepath,
        err_redirect_level,
    )
    return _default_logger


def _add_file_handlers(
    logger: logging.Logger,
    enable_file_logger: bool,
    log_filename: str,
    enable_err_redirect: bool,
    err_redirect_filepath: str,
    err_redirect_level: int | str,
) -> None:
    """PERSIA's optional files: every record in ``log_filename``, records above
    ``err_redirect_level`` in ``err_redirect_filepath``."""
    if enable_file_logger:
        _file_handler(logger, _check_path(log_filename, "log_filename"), "file")
    if enable_err_redirect:
        threshold = _parse_level(err_redirect_level, "err_redirect_level")
        handler = _file_handler(
            logger, _check_path(err_redirect_filepath, "err_redirect_filepath"), "error"
        )
        handler.filters = [_AboveLevel(threshold)]


# --- PERSIA's other names ------------------------------------------------------------------
# PERSIA coloured its stderr lines with colorlog; Pyrsia prints the same fields without
# colour codes (log lines are read in files and CI logs as often as in terminals).
FILE_LOG_FORMAT = _FORMAT
STREAM_LOG_FORMAT = _FORMAT
LOG_COLOR = {
    "DEBUG": "cyan",
    "INFO": "green",
    "WARNING": "yellow",
    "ERROR": "red",
    "CRITICAL": "red,bg_white",
}
"""PERSIA's level colours, kept for scripts that read them; Pyrsia's lines are not coloured."""
FORMATTER = logging.Formatter(FILE_LOG_FORMAT)
COLOR_FORMATTER = logging.Formatter(STREAM_LOG_FORMAT)


class levelFilter(_AboveLevel):  # noqa: N801 - PERSIA's name
    """Keeps records strictly above ``level`` (PERSIA's error-file filter)."""


def setLogger(  # noqa: N802 - PERSIA's name
    name: str,
    log_level: int | str = logging.DEBUG,
    log_filename: str = "train.log",
    enable_file_logger: bool = False,
    err_redirect_filepath: str = "error.log",
    enable_err_redirect: bool = False,
    err_redirect_level: int | str = logging.INFO,
) -> logging.Logger:
    """Configure the logger ``name``: a stderr handler, ``log_level`` (PERSIA's default DEBUG),
    optionally a file of every record and a file of records above ``err_redirect_level``.
    Calling it again for the same name adds no second stderr handler."""
    logger = logging.getLogger(name)
    if not any(getattr(h, _MARK, None) == "stream" for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(COLOR_FORMATTER)
        setattr(handler, _MARK, "stream")
        logger.addHandler(handler)
    logger.setLevel(_parse_level(log_level, "log_level"))
    _add_file_handlers(
        logger,
        enable_file_logger,
        log_filename,
        enable_err_redirect,
        err_redirect_filepath,
        err_redirect_level,
    )
    return logger


def set_default_logger(name: str | None = None, **kwargs) -> logging.Logger:
    """Create the default logger if there is none yet (PERSIA's); see :func:`get_default_logger`."""
    return get_default_logger(name, **kwargs)
