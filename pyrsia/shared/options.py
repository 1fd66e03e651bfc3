"""The option engine: typed keys, defaults, environment overrides and one "did you mean".

Three surfaces read their options through it, each keeping its own names:

- PERSIA's YAML files: a :class:`Section` per mapping of the tree
  (``pyrsia.shared.embedding_schema``, ``pyrsia.shared.global_schema``);
- EPL's ``Config``: a :class:`KeyTable` of ``category.attribute`` keys read from
  ``EPL_<CATEGORY>_<ATTRIBUTE>`` (``persia.epl.config``);
- HybridBackend's ``hb.context.options``: a :class:`KeyTable` of names read from
  ``HB_<NAME>`` (``persia.hb._options``).

A :class:`Kind` says which values a key takes (:class:`Integer`, :class:`Boolean`,
:class:`String`, :class:`Choice`, :class:`Nullable`, :class:`InstanceOf`, :class:`Custom`),
turns a value into its canonical form and parses the text of an environment variable.
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
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyrsia.shared.constants import ENV_ALLOW_UNKNOWN_CONFIG_KEYS
from pyrsia.shared.errors import ConfigWarning, OptionError, UnknownOptionError
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

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


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


# --------------------------------------------------------------------------- kinds


def mismatch(expected: str | None = None) -> OptionError:
    """What a :class:`Kind` raises when a value does not fit; :func:`check` adds where and what.

    ``expected`` overrides the kind's own description for this refusal (a choice given
    a non-string says "a string, one of ...")."""
    return OptionError("", expected or "", message=f"expected {expected or 'another value'}")


class Kind:
    """What one key takes: ``type_name`` for tables, ``expected`` for messages."""

    type_name = "value"
    expected = "a value"

    def convert(self, value: Any) -> Any:
        """The canonical form of ``value``; raises :func:`mismatch` when it does not fit."""
        return value

    def parse_env(self, text: str) -> Any:
        """The Python value an environment variable's text stands for (checked afterwards)."""
        return text.strip()


@dataclass(frozen=True)
class Integer(Kind):
    """An int in ``[minimum, maximum]``; ``sentinel`` is one more allowed value (-1: "unset").

    ``integral_floats`` takes ``8.0`` as ``8`` (YAML writes some integers that way); a bool
    is never an integer here."""

    minimum: int | None = None
    maximum: int | None = None
    sentinel: int | None = None
    integral_floats: bool = False
    type_name = "integer"

    @property
    def expected(self) -> str:  # type: ignore[override]
        if self.maximum is not None:
            text = f"an integer from {self.minimum} to {self.maximum}"
        else:
            text = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
                self.minimum, f"an integer >= {self.minimum}"
            )
        return text if self.sentinel is None else f"{self.sentinel} or {text}"

    def convert(self, value: Any) -> int:
        if self.integral_floats and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise mismatch()
        if value == self.sentinel:
            return value
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise mismatch()
        return value

    def parse_env(self, text: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise mismatch() from None


@dataclass(frozen=True)
class Boolean(Kind):
    """True or False (no 0/1 in code; the environment also takes 1/0, yes/no, on/off)."""

    type_name = "bool"
    expected = "true or false"

    def convert(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise mismatch()
        return value

    def parse_env(self, text: str) -> bool:
        lowered = text.strip().lower()
        if lowered in TRUE_WORDS:
            return True
        if lowered in FALSE_WORDS:
            return False
        raise mismatch(f"{self.expected} (1/0, yes/no, on/off)")


@dataclass(frozen=True)
class String(Kind):
    """Any str."""

    type_name = "str"
    expected = "a string"

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise mismatch()
        return value


class Choice(Kind):
    """One of a few strings. ``ignore_case``: matched case-insensitively and returned as
    spelt in ``choices`` (EPL's rule); otherwise exact, except in the environment."""

    type_name = "str"

    def __init__(self, *choices: str, ignore_case: bool = True):
        self.choices = choices
        self.ignore_case = ignore_case
        self._by_lower = {c.lower(): c for c in choices}
        self.expected = "one of " + " or ".join(json.dumps(c) for c in choices)

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise mismatch(f"a string, {self.expected}")
        if value in self.choices:
            return value
        if self.ignore_case and value.lower() in self._by_lower:
            return self._by_lower[value.lower()]
        raise mismatch()

    def parse_env(self, text: str) -> str:
        return self._by_lower.get(text.strip().lower(), text.strip())


class Nullable(Kind):
    """None or what ``inner`` takes; ``none`` in the environment is None."""

    def __init__(self, inner: Kind, *, expected: str | None = None):
        self.inner = inner
        self.type_name = inner.type_name
        self.expected = expected or f"None or {inner.expected}"

    def convert(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.inner.convert(value)
        except OptionError:
            raise mismatch(self.expected) from None

    def parse_env(self, text: str) -> Any:
        return None if text.strip().lower() in ("", "none", "null") else self.inner.parse_env(text)


class InstanceOf(Kind):
    """An instance of ``cls`` (objects, such as an optimizer: never from the environment)."""

    def __init__(self, cls: type, expected: str):
        self.cls = cls
        self.type_name = cls.__name__
        self.expected = expected

    def convert(self, value: Any) -> Any:
        if not isinstance(value, self.cls):
            raise mismatch()
        return value

    def parse_env(self, text: str) -> Any:
        raise mismatch(f"{self.expected} (cannot come from the environment)")


class Custom(Kind):
    """A kind with its own ``convert(value)`` (raising :func:`mismatch`) and env parser."""

    def __init__(
        self,
        type_name: str,
        expected: str,
        convert: Callable[[Any], Any],
        parse_env: Callable[[str], Any] = str.strip,
    ):
        self.type_name, self.expected = type_name, expected
        self._convert, self._parse_env = convert, parse_env

    def convert(self, value: Any) -> Any:
        return self._convert(value)

    def parse_env(self, text: str) -> Any:
        return self._parse_env(text)


def short_repr(value: Any, limit: int = 80) -> str:
    """How a Python value shows in a message: its repr, cut at ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check(kind: Kind, value: Any, where: str, show: Callable[[Any], str] = short_repr) -> Any:
    """``value`` in ``kind``'s canonical form, or an :class:`OptionError` naming ``where``."""
    try:
        return kind.convert(value)
    except OptionError as exc:
        expected = exc.expected or kind.expected
        raise OptionError(
            where, expected, value, message=f"{where}: expected {expected}, got {show(value)}"
        ) from None


def parse_env(kind: Kind, name: str, text: str) -> Any:
    """The value environment variable ``name`` sets (its text ``text``), checked."""
    where = f"environment variable {name}"
    try:
        return kind.convert(kind.parse_env(text))
    except OptionError as exc:
        expected = exc.expected or kind.expected
        raise OptionError(
            name, expected, text, message=f"{where}: expected {expected}, got {text!r}"
        ) from None


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
        self, given: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """Every key's value (given in code, else from the environment, else the default)
        and the names whose value came from the environment."""
        environ = os.environ if environ is None else environ
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


def unknown_keys_allowed() -> bool:
    """``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` is 1 (true, yes, on)."""
    return os.environ.get(ENV_ALLOW_UNKNOWN_CONFIG_KEYS, "").strip().lower() in TRUE_WORDS


def strict_default(strict: bool | None) -> bool:
    """``strict`` as given, or by default: unknown keys are errors unless allowed."""
    return (not unknown_keys_allowed()) if strict is None else strict


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
            self.where(key), expected, None if got is ... else got,
            message=f"{self.located(key)}: {text}",
        )  # fmt: skip

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
