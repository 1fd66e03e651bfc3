"""Where the registry lives, how long its waits last, and how a failed Redis call reads.

:class:`RegistrySettings` is read from ``PERSIA_REDIS_URL`` and ``PERSIA_JOB_ID`` when a
process starts (a PERSIA deployment's NATS variables get a one-line error saying what to set);
:func:`wait_timeout_s` lets ``PERSIA_WAIT_TIMEOUT_S`` replace a wait's default; and
:func:`unreachable_error` is the one wording of "Redis could not be reached" (the URL with its
password as ``***``, and what to do). ``pyrsia.shared.registry`` and
``pyrsia.shared.slot_keeper`` build on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.exceptions import AuthenticationError, ResponseError

from pyrsia.shared.constants import DEFAULT_JOB_ID, DEFAULT_REDIS_URL, ENV_REDIS_URL
from pyrsia.shared.errors import RegistryError
from pyrsia.shared.redaction import redact_url
from pyrsia.shared.settings import Settings

_REDIS_FIX = f"; start a Redis there or point {ENV_REDIS_URL} at one every process can reach"


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry lives and which job's keys to use.

    ``redis_url`` may hold Redis's password; every message and ``repr`` shows
    :attr:`display_url` instead (the password as ``***``, ``pyrsia.shared.redaction``).
    """

    redis_url: str = DEFAULT_REDIS_URL
    job_id: str = DEFAULT_JOB_ID
    environment: Settings = field(default_factory=Settings, compare=False, repr=False)
    """The process settings these came from: whether ``PERSIA_REDIS_URL`` was given, and
    ``PERSIA_WAIT_TIMEOUT_S`` (checked when a wait reads it). Default: no variable set."""

    @property
    def url_given(self) -> bool:
        """Whether ``PERSIA_REDIS_URL`` is set (not the default)."""
        return self.environment.redis_url_given

    def wait_timeout_s(self, default_s: float) -> float:
        """``$PERSIA_WAIT_TIMEOUT_S`` when set (a positive number of seconds), else
        ``default_s``."""
        return self.environment.wait_timeout_s(default_s)

    @property
    def display_url(self) -> str:
        """``redis_url`` with its password replaced by ``***``: the form messages show."""
        return redact_url(self.redis_url)

    def __repr__(self) -> str:
        return f"RegistrySettings(redis_url={self.display_url!r}, job_id={self.job_id!r})"

    @classmethod
    def from_env(cls, settings: Settings) -> RegistrySettings:
        """Settings from ``PERSIA_REDIS_URL`` and ``PERSIA_JOB_ID`` of ``settings`` (the
        process's, passed down from its entry point).

        A PERSIA deployment sets ``PERSIA_NATS_URL`` (or ``PERSIA_NATS_IP``) instead; without
        ``PERSIA_REDIS_URL`` that is a RegistryError saying, in one line, what to set.
        """
        settings.check_no_nats_without_redis()
        return cls(redis_url=settings.redis_url, job_id=settings.job_id, environment=settings)


def wait_timeout_s(default_s: float, settings: Settings) -> float:
    """``$PERSIA_WAIT_TIMEOUT_S`` of ``settings`` when set (a
    positive number of seconds), else ``default_s``."""
    return settings.wait_timeout_s(default_s)


def redis_fix(exc: BaseException) -> str:
    """What to add to a failed Redis call's message: where to start Redis, unless Redis
    answered and refused (a wrong password or command, which waiting will not mend)."""
    return "" if isinstance(exc, (AuthenticationError, ResponseError)) else _REDIS_FIX


def unreachable_error(
    settings: RegistrySettings, exc: BaseException, doing: str = ""
) -> RegistryError:
    """The RegistryError for a failed Redis call (every RedisError is translated): the URL
    (password as ``***``), what was being done (``doing``, e.g. " to find embedding_ps"),
    the cause and the fix."""
    return RegistryError(
        f"cannot reach Redis at {settings.display_url}{doing}: {exc}{redis_fix(exc)}"
    )
