"""The one exception tree of Pyrsia.

::

    PersiaError
    ├── ConfigError              a YAML file, flag or environment variable is wrong
    ├── InvalidInputError        a value from outside is wrong (also a ValueError); HTTP 400
    ├── ProtocolError            bytes on the wire are not what the protocol says
    ├── RegistryError            Redis cannot be reached, or a role never showed up
    ├── ServiceUnavailableError  a peer cannot be reached or is not ready (503)
    └── RemoteError              a peer answered with an error status
        ├── NotFoundError        404: unknown or dropped reference
        ├── ConflictError        409: the request contradicts the peer's state
        ├── BackPressureError    429: the peer's queue is full; back off and retry
        └── PayloadTooLargeError 413

aiohttp and redis exceptions never leave the layer that talks to them: they are
translated here with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any


class PersiaError(Exception):
    """Base class of every error Pyrsia raises on purpose."""


class ConfigError(PersiaError):
    """A configuration file, flag or environment variable is wrong."""


class InvalidInputError(PersiaError, ValueError):
    """A value that came from outside is wrong.

    ``field`` names the offending field (``slots_config.age.dim``, ``ids``) and
    ``expected`` says what was expected, so the message can tell the user what to do.
    """

    def __init__(self, field: str, expected: str, got: Any = None, *, message: str | None = None):
        self.field = field
        self.expected = expected
        self.got = got
        if message is None:
            message = f"{field}: expected {expected}"
            if got is not None:
                message += f", got {_short(got)}"
        super().__init__(message)


class ProtocolError(PersiaError):
    """Bytes on the wire do not follow Pyrsia's protocol."""


class RegistryError(PersiaError):
    """The Redis registry cannot be reached, or expected replicas never registered."""


class ServiceUnavailableError(PersiaError):
    """A peer service cannot be reached or says it is not ready."""


class RemoteError(PersiaError):
    """A peer answered with an error status; ``status`` and ``body`` keep what it said."""

    def __init__(self, message: str, *, status: int = 500, body: dict | None = None):
        super().__init__(message)
        self.status = status
        self.body = body or {}


class NotFoundError(RemoteError):
    """404: the peer does not know the reference or route asked for."""


class ConflictError(RemoteError):
    """409: the request contradicts the peer's current state."""


class BackPressureError(RemoteError):
    """429: the peer's bounded queue is full; the caller should back off and retry."""


class PayloadTooLargeError(RemoteError):
    """413: the request body is over the peer's size cap."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
