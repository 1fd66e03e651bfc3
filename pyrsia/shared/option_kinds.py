"""The kinds of value an option takes, and the one wording of a refused value.

A :class:`Kind` turns a value into its canonical form (or raises :func:`mismatch`) and
parses an environment variable's text; :func:`check` and :func:`parse_env` turn a
mismatch into the option engine's one error, :class:`~pyrsia.shared.errors.OptionError`::

    <where>: expected <what the kind takes>, got <the value>
    environment variable HB_GRAD_NBUCKETS: expected a positive integer, got 'two'

Used through :mod:`pyrsia.shared.options`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyrsia.shared.errors import OptionError

__all__ = [
    "Boolean",
    "Choice",
    "Custom",
    "InstanceOf",
    "Integer",
    "Kind",
    "Nullable",
    "String",
    "check",
    "mismatch",
    "parse_env",
    "short_repr",
]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


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
