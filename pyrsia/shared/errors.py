"""The one exception tree of Pyrsia (public as ``persia.errors``).

::

    PersiaError                  500  anything Pyrsia raises on purpose
    ├── ConfigError              500  a YAML file, flag or environment variable is wrong
    │   ├── UsageError           500  a CLI flag or file is unusable (printed, exit 2)
    │   └── OptionError          400  a config key or option has a wrong value (also an
    │       │                         InvalidInputError, so a ValueError)
    │       └── UnknownOptionError    no such key or option (also an AttributeError)
    ├── InvalidInputError        400  a value from outside is wrong (also a ValueError)
    │   └── InvalidTypeError     400  ... of the wrong type (also a TypeError)
    ├── MisuseError              500  an API called where it cannot work: outside its context,
    │   │                             before what must come first (also a RuntimeError)
    │   └── DataCtxError         500  DataCtx misused (send outside ``with``, twice)
    ├── ProtocolError            400  bytes on the wire are not what the protocol says
    │   └── PayloadTooLargeError 413  a message is over a size cap (``limit`` bytes)
    ├── NotFoundError            404  this process does not know the reference (or dropped it)
    ├── ConflictError            409  the request contradicts this process's state
    │   └── PSRestartedEmptyError     a PS replica that held job state came back empty
    ├── BackPressureError        429  a bounded queue here is full; back off and retry
    ├── RegistryError            503  Redis cannot be reached, or a role never showed up
    │   └── JobConflictError     503  another live job holds this job id
    ├── ServiceUnavailableError  503  a peer cannot be reached or is not ready
    ├── RuntimeClosedError       500  the in-process runtime was stopped
    ├── GradientSendError        500  embedding gradients could not be delivered
    └── RemoteError              502  a peer answered with an error status
        ├── RemoteBadRequestError 502 the peer refused our input (it answered 400)
        ├── AuthError            401  missing or wrong PERSIA_AUTH_TOKEN (pyrsia.shared.auth)
        ├── RemoteNotFoundError  404  the peer answered 404 (also a NotFoundError)
        ├── RemoteConflictError  409  the peer answered 409 (also a ConflictError)
        └── RemoteBackPressureError 429  the peer answered 429 (also a BackPressureError)

    ConfigWarning (a UserWarning)     an unknown key in a config file

``status`` (a class attribute) is the HTTP status a service answers with when the error
escapes a route handler, and ``kind`` the ``error`` field of the msgpack error body
(``pyrsia.shared.http_server``). Local and remote errors are apart: a process raises
:class:`NotFoundError`, :class:`ConflictError` or :class:`BackPressureError` about its own
state, and never a :class:`RemoteError`; a :class:`RemoteError` is built only from a peer's
answer and keeps that answer's status as ``peer_status`` and its decoded body as ``body``.
The client maps a peer's 404/409/429 to ``Remote*`` classes that are also the local class
(``except NotFoundError`` catches both, ``except RemoteError`` only the peer's), so a 404
forwarded through two services is still a :class:`NotFoundError`; 413 and 503 map to
:class:`PayloadTooLargeError` and :class:`ServiceUnavailableError`.

aiohttp and redis exceptions never leave the layer that talks to them: they are
translated into these classes with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    "PSRestartedEmptyError",
    "PayloadTooLargeError",
    "PersiaError",
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


class PersiaError(Exception):
    """Base class of every error Pyrsia raises on purpose."""

    status: ClassVar[int] = 500
    kind: ClassVar[str] = "internal_error"


class ConfigError(PersiaError):
    """A configuration file, flag or environment variable is wrong."""


class UsageError(ConfigError):
    """A flag, variable or file the user gave is unusable; printed as one line, exit 2."""


class InvalidInputError(PersiaError, ValueError):
    """A value that came from outside is wrong.

    ``field`` names the offending field (``slots_config.age.dim``, ``ids``) and
    ``expected`` says what was expected, so the message can tell the user what to do.
    """

    status = 400
    kind = "invalid_input"

    def __init__(self, field: str, expected: str, got: Any = None, *, message: str | None = None):
        self.field = field
        self.expected = expected
        self.got = got
        if message is None:
            message = f"{field}: expected {expected}"
            if got is not None:
                message += f", got {_short(got)}"
        super().__init__(message)


class OptionError(ConfigError, InvalidInputError):
    """A key of a config file, an EPL key or an ``hb.context.options`` option has a wrong value.

    The one error of the option engine (:mod:`pyrsia.shared.options`): a
    :class:`ConfigError` and an :class:`InvalidInputError` (so a ``ValueError``), with
    ``field`` naming the key and ``expected`` what it takes.
    """


class UnknownOptionError(OptionError, AttributeError):
    """No key or option has this name; the message names the closest one.

    Also an ``AttributeError``: HybridBackend's ``hb.context.options`` raises
    ``AttributeError`` for an unknown name, and attribute access (``config.pipeline.x``)
    must, so that ``getattr(obj, name, default)`` and ``hasattr`` work.
    """


class InvalidTypeError(InvalidInputError, TypeError):
    """A value that came from outside has the wrong type (a str where a PersiaBatch goes).

    Also a ``TypeError``, which Python raises for a wrong argument type and PERSIA users
    catch; ``field``, ``expected`` and ``got`` as for :class:`InvalidInputError`.
    """


class MisuseError(PersiaError, RuntimeError):
    """An API is called where it cannot work: outside its context, before the call that
    must come first, after the end. Also a ``RuntimeError``, which PERSIA raised for these."""


class DataCtxError(MisuseError):
    """Misuse of ``DataCtx`` (sending outside the context, sending a batch twice)."""


class ProtocolError(PersiaError):
    """Bytes on the wire do not follow Pyrsia's protocol."""

    status = 400
    kind = "invalid_input"


class PayloadTooLargeError(ProtocolError):
    """413: a message is over a size cap; ``limit`` is the cap in bytes (None if unknown)."""

    status = 413
    kind = "too_large"

    def __init__(self, message: str, *, limit: int | None = None, body: dict | None = None):
        super().__init__(message)
        self.body = body or {}
        self.limit = limit if limit is not None else self.body.get("limit")
        self.peer_status = self.status


class NotFoundError(PersiaError):
    """404: the reference or route asked for is unknown here (or was dropped)."""

    status = 404
    kind = "not_found"


class ConflictError(PersiaError):
    """409: the request contradicts this process's current state."""

    status = 409
    kind = "conflict"


class PSRestartedEmptyError(ConflictError):
    """409: a PS replica that held job state came back as a new, empty process (an embedding
    worker refuses to train or checkpoint on its re-initialized rows until a resume loads it)."""


class BackPressureError(PersiaError):
    """429: a bounded queue of this process is full; the caller should back off and retry."""

    status = 429
    kind = "back_pressure"


class RegistryError(PersiaError):
    """The Redis registry cannot be reached, or expected replicas never registered."""

    status = 503
    kind = "unavailable"


class JobConflictError(RegistryError):
    """Another live job holds this job id (or this process's slot in it): see pyrsia/shared/job_lease.py."""


class ServiceUnavailableError(PersiaError):
    """A peer service cannot be reached or says it is not ready."""

    status = 503
    kind = "unavailable"


class RuntimeClosedError(PersiaError):
    """The runtime was stopped (the process is exiting); no more work is accepted."""


class GradientSendError(PersiaError):
    """Embedding gradients could not be delivered to an embedding worker."""


class RemoteError(PersiaError):
    """A peer answered with an error status; ``peer_status`` and ``body`` keep what it said."""

    status = 502
    kind = "upstream_error"

    def __init__(self, message: str, *, peer_status: int | None = None, body: dict | None = None):
        super().__init__(message)
        self.peer_status = self.status if peer_status is None else peer_status
        self.body = body or {}


class RemoteBadRequestError(RemoteError):
    """A peer answered 400: it refused our input; ``field`` and ``expected`` say why.

    Escaping a handler it is a 502: the bad input was ours, not our caller's.
    """

    @property
    def field(self) -> str | None:
        return self.body.get("field")

    @property
    def expected(self) -> str | None:
        return self.body.get("expected")


class AuthError(RemoteError):
    """401: the peer requires the job's ``PERSIA_AUTH_TOKEN`` and we sent none or another."""

    status = 401
    kind = "unauthorized"


class RemoteNotFoundError(NotFoundError, RemoteError):
    """A peer answered 404 (escaping a handler, still a 404: the reference is unknown)."""


class RemoteConflictError(ConflictError, RemoteError):
    """A peer answered 409: our request contradicts the peer's state."""


class RemoteBackPressureError(BackPressureError, RemoteError):
    """A peer answered 429: its queue is full; back off and retry."""


class ConfigWarning(UserWarning):
    """An unknown key in a config file (an error with ``strict=True``)."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
