"""The option engine: typed keys, defaults, environment overrides and one "did you mean".

Three surfaces read their options through it, each keeping its own names:

- PERSIA's YAML files: a :class:`Section` per mapping of the tree
  (``pyrsia.shared.embedding_schema``, ``pyrsia.shared.global_schema``);
- EPL's ``Config``: a :class:`KeyTable` of ``category.attribute`` keys read from
  ``EPL_<CATEGORY>_<ATTRIBUTE>`` (``persia.epl.config``);
- HybridBackend's ``hb.context.options``: a :class:`KeyTable` of names read from
  ``HB_<NAME>`` (``persia.hb._options``).

A :class:`Kind` (defined in ``pyrsia.shared.option_kinds``) says which values a key takes
(:class:`Integer`, :class:`Boolean`, :class:`String`, :class:`Choice`, :class:`Nullable`,
:class:`InstanceOf`, :class:`Custom`), turns a value into its canonical form and parses the
text of an environment variable.
Every refusal is one class, :class:`~pyrsia.shared.errors.OptionError` (a ``ConfigError``
and a ``ValueError``), worded one way::

    <where>: expected <what the kind takes>, got <the value>
    environment variable HB_GRAD_NBUCKETS: expected a positive integer, got 'two'

and an unknown name is :class:`~pyrsia.shared.errors.UnknownOptionError` (also an
``AttributeError``) with the closest known name, found by :func:`did_you_mean` with one
cutoff, :data:`SUGGEST_CUTOFF`::

    EPL config: unknown key "zero.levl" (did you mean "zero.level"?)

An environment variable that is unset or blank leaves the key at its default; a key
given in code wins over the environment.
"""

from __future__ import annotations

import difflib
import json
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyrsia.shared.constants import ENV_ALLOW_UNKNOWN_CONFIG_KEYS
from pyrsia.shared.errors import ConfigWarning, OptionError, UnknownOptionError
from pyrsia.shared.option_kinds import (
    TRUE_WORDS,
    Boolean,
    Choice,
    Custom,
    InstanceOf,
    Integer,
    Kind,
    Nullable,
    String,
    check,
    mismatch,
    parse_env,
)
from pyrsia.shared.settings import Settings
from pyrsia.shared.yaml_file import show_value

__all__ = [
    "SUGGEST_CUTOFF",
    "Boolean",
    "Choice",
    "Custom",
    "InstanceOf",
    "Integer",
    "Key",
    "KeyTable",
    "Kind",
    "mismatch",
    "Nullable",
    "Section",
    "String",
    "check",
    "closest",
    "did_you_mean",
    "parse_env",
    "strict_default",
    "unknown_keys_allowed",
]

log = logging.getLogger("pyrsia.shared.config")
"""The config loader's logger: notes about keys a :class:`Section` ignores."""

SUGGEST_CUTOFF = 0.6
"""Least difflib similarity for a known name to be offered as "did you mean"."""


def closest(name: object, known: Iterable[object]) -> str | None:
    """The known name most like ``name`` (difflib ratio >= :data:`SUGGEST_CUTOFF`), or None."""
    close = difflib.get_close_matches(
        str(name), [str(k) for k in known], n=1, cutoff=SUGGEST_CUTOFF
    )
    return close[0] if close else None


def did_you_mean(name: object, known: Iterable[object]) -> str:
    """``' (did you mean "x"?)'`` for the closest known name, or ``''`` when none is close."""
    match = closest(name, known)
    return f" (did you mean {json.dumps(match)}?)" if match is not None else ""


# --------------------------------------------------------------------------- flat tables


@dataclass(frozen=True)
class Key:
    """One typed key: its kind, default, environment variable (None: none) and meaning."""

    name: str
    kind: Kind
    default: Any
    env: str | None = None
    doc: str = ""

    @property
    def type_name(self) -> str:
        return self.kind.type_name

    @property
    def expected(self) -> str:
        return self.kind.expected

    @property
    def env_name(self) -> str | None:
        return self.env


class KeyTable:
    """A flat table of :class:`Key`\\ s: lookup with "did you mean", checks, environment.

    ``subject`` names the table in messages (``EPL config``), ``where(name)`` names one
    key (``EPL config "zero.level"``), ``noun`` is what a key is called (key, option);
    ``advice`` ends the unknown-name message; ``list_known`` lists every name when none
    is close.
    """

    def __init__(
        self,
        keys: Iterable[Key],
        *,
        subject: str,
        where: Callable[[str], str],
        noun: str = "key",
        advice: str = "",
        list_known: bool = False,
    ):
        self.keys: dict[str, Key] = {k.name: k for k in keys}
        self.subject, self.where, self.noun = subject, where, noun
        self.advice, self.list_known = advice, list_known

    def __contains__(self, name: object) -> bool:
        return name in self.keys

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def unknown(self, name: object) -> UnknownOptionError:
        """The error for a name no key has, naming the closest one."""
        hint = did_you_mean(name, self.keys)
        if not hint and self.list_known:
            hint = f"; known {self.noun}s: {', '.join(self.keys)}"
        return UnknownOptionError(
            str(name),
            f"one of the {self.noun}s of {self.subject}",
            message=f'{self.subject}: unknown {self.noun} "{name}"{hint}{self.advice}',
        )

    def lookup(self, name: str) -> Key:
        """The key called ``name``, or :class:`UnknownOptionError`."""
        try:
            return self.keys[name]
        except (KeyError, TypeError):
            raise self.unknown(name) from None

    def check(self, name: str, value: Any) -> Any:
        """``value`` checked for key ``name`` (unknown name or wrong value: the one error)."""
        return check(self.lookup(name).kind, value, self.where(name))

    def env_value(self, key: Key, environ: Mapping[str, str]) -> Any:
        """The value ``key``'s environment variable sets, or ``...`` when unset or blank."""
        text = environ.get(key.env, "") if key.env else ""
        return parse_env(key.kind, key.env, text) if text.strip() else ...  # type: ignore[arg-type]

    def resolve(
        self, given: Mapping[str, Any], environ: Mapping[str, str]
    ) -> tuple[dict[str, Any], list[str]]:
        """Every key's value (given in code, else from ``environ``, the caller's settings,
        else the default) and the names whose value came from the environment."""
        for name in given:
            self.lookup(name)
        values: dict[str, Any] = {}
        from_env: list[str] = []
        for name, key in self.keys.items():
            if name in given:
                values[name] = self.check(name, given[name])
                continue
            value = self.env_value(key, environ)
            if value is ...:
                values[name] = key.default
            else:
                values[name] = value
                from_env.append(name)
        return values, from_env

    def stray_env(self, environ: Mapping[str, str], prefix: str) -> list[tuple[str, str]]:
        """``(variable, hint)`` for each ``prefix*`` variable no key reads."""
        names = {k.env for k in self.keys.values() if k.env}
        return [
            (var, did_you_mean(var, names))
            for var in environ
            if var.startswith(prefix) and var not in names
        ]


# --------------------------------------------------------------------------- YAML sections


def unknown_keys_allowed(settings: Settings) -> bool:
    """``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` of ``settings`` is 1 (true, yes, on)."""
    return settings.text(ENV_ALLOW_UNKNOWN_CONFIG_KEYS).strip().lower() in TRUE_WORDS


def strict_default(strict: bool | None, settings: Settings | None = None) -> bool:
    """``strict`` as given, or by default: unknown keys are errors unless ``settings`` (the
    caller's entry point's) allow them; without settings, errors."""
    if strict is not None:
        return strict
    return settings is None or not unknown_keys_allowed(settings)


class Section:
    """One mapping of a YAML tree: typed getters that name the file and key path.

    Every getter records its key as known; :meth:`done` refuses (``strict``) or warns
    about the keys nobody asked for, with the closest known one. Values show as YAML
    writes them (``"8x"``, ``true``).
    """

    def __init__(self, data: object, source: str, path: str, strict: bool):
        if data is None:
            data = {}
        self.source, self.path, self.strict = source, path, strict
        if not isinstance(data, Mapping):
            self.fail("", "a mapping of keys to values", data)
        self.data: Mapping[Any, Any] = data
        self.known: list[str] = []

    def where(self, key: str) -> str:
        """``path.key`` (no file name)."""
        return ".".join(p for p in (self.path, key) if p)

    def located(self, key: str) -> str:
        """``file: path.key`` as messages start."""
        where = self.where(key)
        return f"{self.source}: {where}" if where else self.source

    def fail(self, key: str, expected: str, got: Any = ..., *, message: str | None = None) -> None:
        """Raise the :class:`OptionError` for ``key``: ``expected``/``got``, or ``message``."""
        shown = "" if got is ... else f", got {show_value(got)}"
        text = message or f"expected {expected}{shown}"
        raise OptionError(
            self.where(key),
            expected,
            None if got is ... else got,
            message=f"{self.located(key)}: {text}",
        )

    def raw(self, key: str) -> Any:
        """The value as written, ``...`` when absent; marks ``key`` known."""
        self.known.append(key)
        return self.data.get(key, ...)

    def value(self, key: str, kind: Kind, default: Any) -> Any:
        """``key`` checked against ``kind``, or ``default`` when absent."""
        value = self.raw(key)
        if value is ...:
            return default
        return check(kind, value, self.located(key), show_value)

    def integer(
        self, key: str, default: int, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        return self.value(key, Integer(minimum, maximum, integral_floats=True), default)

    def boolean(self, key: str, default: bool) -> bool:
        return self.value(key, Boolean(), default)

    def string(self, key: str, default: str) -> str:
        return self.value(key, String(), default)

    def section(self, key: str) -> Section:
        value = self.raw(key)
        return Section(None if value is ... else value, self.source, self.where(key), self.strict)

    def ignored(self, key: str, note: str) -> None:
        """``key`` is known and ignored: when present, ``note`` says why in the log."""
        if self.raw(key) is not ...:
            log.info("%s: %s", self.located(key), note)

    def done(self) -> None:
        """Refuse (strict) or warn about every key no getter asked for."""
        for key in self.data:
            if key in self.known:
                continue
            where = f"{self.located(str(key))}: unknown key"
            suggestion = did_you_mean(key, self.known)
            if self.strict:
                raise UnknownOptionError(
                    self.where(str(key)),
                    "a known key",
                    message=f"{where}{suggestion}; correct it, or pass "
                    f"--allow-unknown-config-keys (or set {ENV_ALLOW_UNKNOWN_CONFIG_KEYS}=1) "
                    "to ignore keys this version does not know",
                )
            warnings.warn(f"{where}, ignored{suggestion}", ConfigWarning, stacklevel=4)
