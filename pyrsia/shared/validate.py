"""Checks for values that arrive from outside (HTTP bodies, user batches).

Each helper returns the value in the expected form or raises ``InvalidInputError``
naming the field and what was expected, so a handler validates a body in a few
readable lines and a bad request becomes a 400 that tells the sender what to fix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyrsia.shared.errors import InvalidInputError


def describe(value: Any) -> str:
    """A short description of a bad value for an error: an array's dtype and shape, else its type."""
    if isinstance(value, np.ndarray):
        return f"array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__name__


def join(prefix: str, name: str) -> str:
    """``prefix.name`` (or ``name`` without a prefix): the dotted path of a nested field."""
    return f"{prefix}.{name}" if prefix else name


def positive_int(value: Any, field: str) -> int:
    """An integer >= 1 (numpy integers accepted, bools refused): the one such check."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInputError(field, "a positive integer", value)
    return int(value)


def as_dict(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidInputError(field, "a map", type(value).__name__)
    return value


def as_list(value: Any, field: str, *, max_len: int | None = None) -> list:
    if not isinstance(value, list):
        raise InvalidInputError(field, "a list", type(value).__name__)
    if max_len is not None and len(value) > max_len:
        raise InvalidInputError(field, f"at most {max_len} items", f"{len(value)} items")
    return value


def get(body: dict, key: str, field: str | None = None) -> Any:
    """``body[key]``, or an error naming the missing field."""
    if key not in body:
        raise InvalidInputError(field or key, "a value (the field is missing)")
    return body[key]


def as_int(
    value: Any, field: str, *, min_value: int | None = None, max_value: int | None = None
) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(field, "an integer", value)
    value = int(value)
    if min_value is not None and value < min_value:
        raise InvalidInputError(field, f"an integer >= {min_value}", value)
    if max_value is not None and value > max_value:
        raise InvalidInputError(field, f"an integer <= {max_value}", value)
    return value


def as_float(value: Any, field: str, *, finite: bool = True, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidInputError(field, "a number", value)
    value = float(value)
    if finite and not np.isfinite(value):
        raise InvalidInputError(field, "a finite number", value)
    if positive and not value > 0:
        raise InvalidInputError(field, "a number > 0", value)
    return value


def as_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInputError(field, "true or false", value)
    return value


def as_str(value: Any, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise InvalidInputError(field, "a non-empty string", value)
    return value


def as_array(
    value: Any,
    field: str,
    *,
    dtype: str | np.dtype | tuple[str, ...] | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
) -> np.ndarray:
    """A numpy array of the given dtype(s), rank and shape (``None`` in ``shape`` = any)."""
    if not isinstance(value, np.ndarray):
        raise InvalidInputError(field, "a numpy array", describe(value))
    if dtype is not None:
        allowed = tuple(np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,)))
        if value.dtype not in allowed:
            names = " or ".join(str(d) for d in allowed)
            raise InvalidInputError(field, f"dtype {names}", describe(value))
    if ndim is not None and value.ndim != ndim:
        raise InvalidInputError(field, f"a {ndim}-D array", f"shape {value.shape}")
    if shape is not None:
        if value.ndim != len(shape) or any(
            want is not None and want != got for want, got in zip(shape, value.shape, strict=False)
        ):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise InvalidInputError(field, f"shape {want}", f"shape {value.shape}")
    return value
