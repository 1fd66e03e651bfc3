"""Optional shared-token authentication between the processes of one job.

When ``PERSIA_AUTH_TOKEN`` is set, every route of every Pyrsia server (the embedding PS,
the embedding worker, the NN-worker ingress; ``/health`` and ``/metrics`` included)
requires the header ``Authorization: Bearer <token>`` and answers 401 otherwise; the
token is compared in constant time (``hmac.compare_digest``). Every client
(:class:`pyrsia.shared.http_client.HttpClient`, used by the services, the NN-worker runtime and
the data loader) sends the header when the variable is set, so one variable set for the
whole job is all it takes.

A server refuses to listen on a non-loopback address without a token unless it is told
``--insecure`` (or ``PERSIA_INSECURE=1``): the embedding PS writes checkpoints wherever a
``/dump`` request says, so an open port on a shared network is a hole.

The Redis registry is not covered: protect it with Redis's own password
(``redis://:password@host:6379/0`` in ``PERSIA_REDIS_URL``).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket

from pyrsia.shared.constants import ENV_AUTH_TOKEN, ENV_INSECURE, MIN_AUTH_TOKEN_CHARS
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings

AUTH_HEADER = "Authorization"
AUTH_SCHEME = "Bearer"


def check_token(token: str, source: str = ENV_AUTH_TOKEN) -> str:
    """``token`` if it is usable in a header and long enough to resist guessing."""
    if len(token) < MIN_AUTH_TOKEN_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigError(
            f"{source}: expected at least {MIN_AUTH_TOKEN_CHARS} visible ASCII characters "
            f"without spaces (e.g. the output of `openssl rand -hex 32`), got {len(token)} "
            "characters"
        )
    return token


def auth_token_from_env(settings: Settings) -> str | None:
    """The job's shared token (``PERSIA_AUTH_TOKEN`` of ``settings``),
    or None when unset or empty."""
    raw = settings.text(ENV_AUTH_TOKEN)
    return check_token(raw) if raw else None


def insecure_from_env(settings: Settings) -> bool:
    """``PERSIA_INSECURE``: 1/true/yes/on or 0/false/no/off (unset = false)."""
    return settings.yes_no(ENV_INSECURE)


def auth_header_value(token: str) -> str:
    """The ``Authorization`` header a client sends."""
    return f"{AUTH_SCHEME} {token}"


def is_authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant-time comparison)."""
    expected = auth_header_value(token).encode()
    given = (header or "").encode("utf-8", "replace")
    return hmac.compare_digest(given, expected)


def is_loopback(host: str) -> bool:
    """True when ``host`` names only loopback addresses ("" and 0.0.0.0 are every interface)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, *, token: str | None, insecure: bool) -> None:
    """Refuse a non-loopback ``host`` without a token unless ``insecure`` (one-line error)."""
    if token is None and not insecure and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host or 'every interface'} without {ENV_AUTH_TOKEN}: set "
            f"the same token for every process of the job, or pass --insecure "
            f"({ENV_INSECURE}=1) on a trusted network"
        )
