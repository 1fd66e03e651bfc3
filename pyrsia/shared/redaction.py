"""Keeping the job's secrets out of everything Pyrsia prints, logs or serves.

Two secrets reach a Pyrsia process: the Redis password inside ``PERSIA_REDIS_URL``
(``redis://:password@host:6379/0``, as the README advises) and ``PERSIA_AUTH_TOKEN``.
Neither may appear in a ``/health`` or ``/metrics`` body (``/health`` answers without a
token), a log line, an exception message or an exit message. Two layers do it:

- at the source: every place that formats a Redis URL formats :func:`redact_url` of it
  (``pyrsia.shared.registry`` builds every message that names the URL);
- as a net: :func:`redact` replaces, in any text, the password part of every URL with
  credentials and every secret string the environment holds; the log formatter
  (:func:`redacting_formatter`, installed by ``pyrsia.shared.logging_setup``), the ``/health``
  handler and ``pyrsia.shared.cli.fail`` pass what they write through it.

A secret shorter than :data:`MIN_LITERAL_SECRET_CHARS` is only hidden where it sits in a
URL's password position: replacing a two-letter password everywhere would garble every log
line while hiding nothing worth hiding.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pyrsia.shared.constants import ENV_AUTH_TOKEN, ENV_REDIS_URL, MIN_LITERAL_SECRET_CHARS
from pyrsia.shared.settings import read

REDACTED = "***"

_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/@\s]*)@")
_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:password|token)=)(?P<pw>[^&\s#]*)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with the password of its user part (and a ``password=`` query value) as ``***``.

    ``redis://:pw@host:6379/0`` becomes ``redis://:***@host:6379/0``; a URL without a
    user part comes back unchanged.
    """
    url = _URL_USERINFO.sub(_hide_userinfo, url)
    return _QUERY_SECRET.sub(lambda m: f"{m['head']}{REDACTED}", url)


def _hide_userinfo(match: re.Match) -> str:
    """``user:pw@`` keeps the user name; a lone ``name@`` may be a password, so it goes too."""
    user, colon, _ = match["info"].partition(":")
    return f"{match['scheme']}{user}:{REDACTED}@" if colon else f"{match['scheme']}{REDACTED}@"


def _url_secrets(url: str) -> list[str]:
    """The password of ``url`` as written and decoded, and its ``password=`` query value."""
    found: list[str] = []
    try:
        parts = urlsplit(url)
        info = parts.netloc.rpartition("@")[0]
        user, colon, raw_pw = info.partition(":")
        for secret in (raw_pw if colon else user,):
            found += [secret, unquote(secret)]
        found += [v for k, v in parse_qsl(parts.query) if k.lower() in ("password", "token")]
    except ValueError:
        pass
    return found


def env_secrets() -> list[str]:
    """The secret strings this process holds: the Redis password, the auth token.

    Read from the environment on every call (never cached at import), longest first so
    that a secret containing another is replaced whole.
    """
    found = _url_secrets(read(ENV_REDIS_URL))
    found.append(read(ENV_AUTH_TOKEN))
    unique = {s for s in found if len(s) >= MIN_LITERAL_SECRET_CHARS}
    return sorted(unique, key=len, reverse=True)


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """``text`` with URL passwords and every known secret (plus ``extra``) as ``***``."""
    text = redact_url(text)
    for secret in (*extra, *env_secrets()):
        if len(secret) >= MIN_LITERAL_SECRET_CHARS and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_value(value: Any) -> Any:
    """``value`` with every string in it (dict values and keys, list items) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_value(k): redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


class _RedactingFormatter(logging.Formatter):
    """A formatter whose every output line (message, arguments, traceback) is redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def redacting_formatter(fmt: str | None = None) -> logging.Formatter:
    """A ``logging.Formatter`` for ``fmt`` that passes its whole output through :func:`redact`."""
    return _RedactingFormatter(fmt)
