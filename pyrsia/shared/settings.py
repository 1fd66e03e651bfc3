"""This process's settings from its environment: the one library module that reads it.

A process's entry point (a service's ``main``, a launcher, a context entered in a user
script, a public function that keeps PERSIA's signature) calls :func:`current` once, lays its
flags over the result (:meth:`Settings.with_values`) and passes the :class:`Settings`, or the
values it needs, down to the code it calls; the rest of the library reads no environment
variable and builds no settings (``tests/test_settings_reads.py`` and
``tests/test_settings_entry_points.py``, which lists the entry points, hold it to that;
``persia.env`` keeps PERSIA's getters and ``pyrsia.shared.process_env`` writes the
environment a launched script or child process reads).

A :class:`Settings` is a frozen snapshot taken when it is built, so a value cannot change
under the code that holds it. Its accessors validate a variable when it is read, not when
the snapshot is taken, so a bad value in a variable a process never uses stops nothing;
a bad value is a :class:`~pyrsia.shared.errors.ConfigError` naming the variable, what was
expected and what came.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pyrsia.shared.constants import (
    DEFAULT_BIND_HOST,
    DEFAULT_JOB_ID,
    DEFAULT_REDIS_URL,
    ENV_BIND_HOST,
    ENV_FINAL_SCRAPE_S,
    ENV_JOB_ID,
    ENV_LOG_LEVEL,
    ENV_NATS_URLS,
    ENV_REDIS_URL,
    ENV_VERBOSE,
    ENV_WAIT_TIMEOUT_S,
    MAX_FINAL_SCRAPE_S,
)
from pyrsia.shared.errors import ConfigError, RegistryError
from pyrsia.shared.option_kinds import TRUE_WORDS

_TRUE = frozenset(TRUE_WORDS)
_FALSE = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True)
class Settings:
    """A frozen snapshot of the environment with typed, validated accessors.

    ``Settings.from_env()`` snapshots ``os.environ``; ``Settings.from_env({...})`` (tests,
    or a child's environment being prepared) reads the given mapping instead.
    """

    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``environ`` (default: this process's environment, read now)."""
        source = os.environ if environ is None else environ
        return cls(MappingProxyType(dict(source)))

    def with_values(self, values: Mapping[str, str]) -> Settings:
        """These settings with ``values`` set over them: an entry point's flags, which win
        over the environment, carried in the one object it passes down."""
        return Settings(MappingProxyType({**self.environ, **values}))

    def __hash__(self) -> int:  # a value: cached results may be keyed on it
        return hash(frozenset(self.environ.items()))

    def __repr__(self) -> str:  # the environment holds secrets: never print it whole
        return f"Settings({len(self.environ)} variables)"

    def text(self, name: str, default: str = "") -> str:
        """Variable ``name`` as it is set (``default`` when unset)."""
        return self.environ.get(name, default)

    def is_set(self, name: str) -> bool:
        """Whether ``name`` is set to a non-empty value."""
        return bool(self.environ.get(name))

    def yes_no(self, name: str) -> bool:
        """A switch: 1/true/yes/on or 0/false/no/off (unset or empty: false)."""
        raw = self.environ.get(name, "")
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ConfigError(f"{name}: expected 1/true/yes/on or 0/false/no/off, got {raw!r}")

    def positive(self, name: str, kind: type, int_unit: str = " (bytes)") -> int | float | None:
        """The positive ``kind`` set in ``name``, or None when it is unset or empty; anything
        else is a ConfigError naming the variable (``int_unit`` follows "integer")."""
        expected = f"a positive integer{int_unit}" if kind is int else "a positive number (seconds)"
        return _checked(name, self.environ.get(name), kind, lambda v: v > 0, expected)

    @property
    def redis_url(self) -> str:
        """``PERSIA_REDIS_URL``, else the default Redis on loopback."""
        return self.environ.get(ENV_REDIS_URL) or DEFAULT_REDIS_URL

    @property
    def redis_url_given(self) -> bool:
        """Whether ``PERSIA_REDIS_URL`` is set (not the default)."""
        return self.is_set(ENV_REDIS_URL)

    @property
    def job_id(self) -> str:
        """``PERSIA_JOB_ID``, else ``default``."""
        return self.environ.get(ENV_JOB_ID) or DEFAULT_JOB_ID

    @property
    def bind_host(self) -> str:
        """``PERSIA_BIND_HOST``, else loopback."""
        return self.environ.get(ENV_BIND_HOST) or DEFAULT_BIND_HOST

    @property
    def log_level(self) -> str:
        """``LOG_LEVEL`` as set (else ``INFO``); the logging setup validates it."""
        return self.environ.get(ENV_LOG_LEVEL) or "INFO"

    @property
    def verbose(self) -> bool:
        """``PERSIA_VERBOSE`` is 1 (``--verbose``) or ``LOG_LEVEL`` is debug: show tracebacks."""
        return (
            self.environ.get(ENV_VERBOSE, "").strip().lower() in _TRUE
            or self.environ.get(ENV_LOG_LEVEL, "").strip().lower() == "debug"
        )

    def check_no_nats_without_redis(self) -> None:
        """RegistryError when a PERSIA NATS variable is set and ``PERSIA_REDIS_URL`` is not."""
        if self.redis_url_given:
            return
        for name in ENV_NATS_URLS:
            if self.environ.get(name):
                raise RegistryError(
                    f"{name} is set but Pyrsia finds its services through Redis, not NATS: "
                    f"set {ENV_REDIS_URL}=redis://<host>:6379/0 (a Redis every process can "
                    f"reach; default {DEFAULT_REDIS_URL}) and unset {name}"
                )

    def wait_timeout_s(self, default_s: float) -> float:
        """``PERSIA_WAIT_TIMEOUT_S`` when set (a positive number of seconds), else ``default_s``."""
        raw = self.environ.get(ENV_WAIT_TIMEOUT_S, "").strip()
        value = _checked(
            ENV_WAIT_TIMEOUT_S, raw, float, lambda v: v > 0, "a positive number of seconds"
        )
        return default_s if value is None else value

    @property
    def final_scrape_s(self) -> float:
        """``PYRSIA_FINAL_SCRAPE_S``: seconds from 0 to 3600 (unset or empty: 0, no wait)."""
        raw = self.environ.get(ENV_FINAL_SCRAPE_S, "").strip()
        value = _checked(
            ENV_FINAL_SCRAPE_S,
            raw,
            float,
            lambda v: 0 <= v <= MAX_FINAL_SCRAPE_S,
            f"a number of seconds from 0 to {MAX_FINAL_SCRAPE_S}",
        )
        return value or 0.0


def _checked(
    name: str, raw: str | None, kind: type, accepts: Callable[[Any], bool], expected: str
) -> Any:
    """``raw`` as ``kind`` when ``accepts`` it; None when unset or empty; anything else is a
    ConfigError naming ``name`` and what was ``expected``."""
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not accepts(value):
        raise ConfigError(f"{name}: expected {expected}, got {raw!r}")
    return value


def current() -> Settings:
    """This process's settings, read from its environment now. Only an entry point calls
    this (``tests/test_settings_reads.py`` lists them, with the reason) and passes the result
    down; library code takes a :class:`Settings` (or the values it yields) from its caller."""
    return Settings.from_env()


def read(name: str, default: str = "") -> str:
    """One variable read now, without a snapshot: for the log formatter's secret list, which
    runs on every line."""
    return os.environ.get(name, default)
