"""Log configuration for entry points (services, launcher). Libraries only get loggers."""

from __future__ import annotations

import logging

from pyrsia.shared.constants import ENV_LOG_LEVEL
from pyrsia.shared.progress_lines import progress_lines_when_piped
from pyrsia.shared.redaction import redacting_formatter

_FORMAT = "%(asctime)s %(levelname)s [{tag}] %(name)s: %(message)s"


def configure_logging(service: str, replica_index: int | None, level: str) -> None:
    """Log to stderr with the service name and replica index on every line.

    ``level`` is ``LOG_LEVEL`` as the entry point's settings read it (``Settings.log_level``,
    default INFO); an unknown level is reported and INFO is used. Every line (arguments and tracebacks included) goes through
    ``pyrsia.shared.redaction``: the Redis password and ``PERSIA_AUTH_TOKEN`` come out as ``***``.
    On a pipe or a file, a progress bar the process draws comes out as a line per update
    (``pyrsia.shared.progress_lines``), so honcho and ``persia-launcher run`` show it as it goes.
    """
    progress_lines_when_piped()
    tag = service if replica_index is None else f"{service}/{replica_index}"
    raw = level.upper()
    level = logging.getLevelName(raw)
    bad_level = not isinstance(level, int)
    logging.basicConfig(
        level=logging.INFO if bad_level else level,
        format=_FORMAT.format(tag=tag),
        force=True,
    )
    formatter = redacting_formatter(_FORMAT.format(tag=tag))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    if bad_level:
        logging.getLogger(__name__).warning(
            "%s=%r is not a log level (DEBUG, INFO, WARNING, ERROR); using INFO", ENV_LOG_LEVEL, raw
        )
