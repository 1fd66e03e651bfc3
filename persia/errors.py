"""Every exception Pyrsia raises on purpose, in one tree (defined in ``pyrsia.shared.errors``).

Catch :class:`PersiaError` for anything Pyrsia raised; :class:`InvalidInputError` (also a
``ValueError``) names the offending ``field`` and what was ``expected``. Each class's
``status`` is the HTTP status a service answers with when it escapes a route.
"""

from __future__ import annotations

from pyrsia.shared.errors import (
    AuthError,
    BackPressureError,
    ConfigError,
    ConfigWarning,
    ConflictError,
    DataCtxError,
    GradientSendError,
    InvalidInputError,
    InvalidTypeError,
    MisuseError,
    NotFoundError,
    OptionError,
    PayloadTooLargeError,
    PersiaError,
    ProtocolError,
    PSRestartedEmptyError,
    RegistryError,
    RemoteBackPressureError,
    RemoteBadRequestError,
    RemoteConflictError,
    RemoteError,
    RemoteNotFoundError,
    RuntimeClosedError,
    ServiceUnavailableError,
    UnknownOptionError,
    UsageError,
)

__all__ = [
    "AuthError",
    "BackPressureError",
    "ConfigError",
    "ConfigWarning",
    "ConflictError",
    "DataCtxError",
    "GradientSendError",
    "InvalidInputError",
    "InvalidTypeError",
    "MisuseError",
    "NotFoundError",
    "OptionError",
    "PayloadTooLargeError",
    "PersiaError",
    "PSRestartedEmptyError",
    "ProtocolError",
    "RegistryError",
    "RemoteBackPressureError",
    "RemoteBadRequestError",
    "RemoteConflictError",
    "RemoteError",
    "RemoteNotFoundError",
    "RuntimeClosedError",
    "ServiceUnavailableError",
    "UnknownOptionError",
    "UsageError",
]
