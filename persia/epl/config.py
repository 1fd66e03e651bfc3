"""``Config(param_dict)``: EPL's configuration table, typed and validated.

Keys are ``category.attribute`` exactly as EPL's configuration page names them, with
EPL's types and defaults::

    pipeline             num_micro_batch (int 1), num_stages (int or None), strategy ("PreferBackward")
    gradient_checkpoint  type (""), end_taskgraph (int -1), check_gradients (False)
    zero                 level ("")
    offload              level ("")
    amp                  level (""), debug_log (False), loss_scale ("dynamic" or a number)
    optimizer            num_apply_group (int 1)
    cluster              device_place_prefer_intra_node (True), run_visible_devices (""),
                         colocate_split_and_replicate (False)
    communication        num_communicators (int 2), sparse_as_dense (False), max_splits (int 5),
                         fp16 (False), fp16_scale (int 128), clip_after_allreduce (False),
                         gradients_reduce_method ("mean")
    io                   slicing (False), unbalanced_io_slicing (False), drop_last_files (False)
    auto                 auto_parallel (False)

Every key can also come from the environment as ``EPL_<CATEGORY>_<ATTRIBUTE>``
(``EPL_PIPELINE_NUM_MICRO_BATCH=4``), read when the Config is built (never at import);
a key in ``param_dict`` wins over the environment, as in EPL. An unknown key is an
error naming the closest known key; a wrong type or value names the key, what was
expected and what came. A Config is immutable: build a new one to change it.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyrsia.shared.errors import ConfigError, InvalidInputError

__all__ = ["Config", "KEYS"]

log = logging.getLogger(__name__)

ENV_PREFIX = "EPL_"


@dataclass(frozen=True)
class _Key:
    """One row of EPL's table: the type name (for messages), default and checker."""

    type_name: str
    default: Any
    check: Callable[[str, Any], Any]  # returns the canonical value or raises
    parse_env: Callable[[str, str], Any]  # turns the env string into a Python value


def _type_error(key: str, expected: str, value: Any) -> InvalidInputError:
    return InvalidInputError(
        key,
        expected,
        value,
        message=f'EPL config "{key}": expected {expected}, got {value!r} ({type(value).__name__})',
    )


def _int(minimum: int) -> Callable[[str, Any], int]:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _type_error(key, f"an integer >= {minimum}", value)
        return value

    return check


def _optional_int(minimum: int) -> Callable[[str, Any], int | None]:
    inner = _int(minimum)

    def check(key: str, value: Any) -> int | None:
        if value is None:
            return None
        try:
            return inner(key, value)
        except InvalidInputError:
            raise _type_error(key, f"None or an integer >= {minimum}", value) from None

    return check


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error(key, "a bool (True or False)", value)
    return value


def _choice(*choices: str) -> Callable[[str, Any], str]:
    """A str among ``choices``, matched case-insensitively (EPL lowercases str values)."""
    by_lower = {c.lower(): c for c in choices}

    def check(key: str, value: Any) -> str:
        shown = " or ".join(f'"{c}"' for c in choices)
        if not isinstance(value, str):
            raise _type_error(key, f"a str, one of {shown}", value)
        if value.lower() not in by_lower:
            raise _type_error(key, f"one of {shown}", value)
        return by_lower[value.lower()]

    return check


def _devices(key: str, value: Any) -> str:
    """A comma-separated list of device indices ("" = leave the devices alone)."""
    if not isinstance(value, str):
        raise _type_error(key, 'a str of comma-separated device indices such as "0,1"', value)
    text = value.replace(" ", "")
    if text and not all(part.isdigit() for part in text.split(",")):
        raise _type_error(key, 'comma-separated device indices such as "0,1" (or "")', value)
    return text


def _loss_scale(key: str, value: Any) -> str | float:
    if isinstance(value, str) and value.lower() == "dynamic":
        return "dynamic"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _type_error(key, '"dynamic" or a number > 0', value) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _type_error(key, '"dynamic" or a number > 0', value)
    return float(value)


def _env_int(name: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(
            f"environment variable {name}: expected an integer, got {text!r}"
        ) from None


def _env_optional_int(name: str, text: str) -> int | None:
    return None if text.strip().lower() in ("", "none") else _env_int(name, text)


def _env_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigError(f"environment variable {name}: expected true or false, got {text!r}")


def _env_str(name: str, text: str) -> str:
    return text.strip()


def _int_key(default: int, minimum: int) -> _Key:
    return _Key("integer", default, _int(minimum), _env_int)


def _bool_key(default: bool) -> _Key:
    return _Key("bool", default, _bool, _env_bool)


def _str_key(default: str, *choices: str) -> _Key:
    return _Key("str", default, _choice(*choices), _env_str)


KEYS: dict[str, _Key] = {
    "pipeline.num_micro_batch": _int_key(1, 1),
    "pipeline.num_stages": _Key("integer", None, _optional_int(1), _env_optional_int),
    "pipeline.strategy": _str_key("PreferBackward", "PreferBackward", "PreferForward"),
    "gradient_checkpoint.type": _str_key("", "", "collection", "auto"),
    "gradient_checkpoint.end_taskgraph": _int_key(-1, -1),
    "gradient_checkpoint.check_gradients": _bool_key(False),
    "zero.level": _str_key("", "", "v1"),
    "offload.level": _str_key("", "", "v0"),
    "amp.level": _str_key("", "", "O1"),
    "amp.debug_log": _bool_key(False),
    "amp.loss_scale": _Key("integer/str", "dynamic", _loss_scale, _env_str),
    "optimizer.num_apply_group": _int_key(1, 1),
    "cluster.device_place_prefer_intra_node": _bool_key(True),
    "cluster.run_visible_devices": _Key("str", "", _devices, _env_str),
    "cluster.colocate_split_and_replicate": _bool_key(False),
    "communication.num_communicators": _int_key(2, 1),
    "communication.sparse_as_dense": _bool_key(False),
    "communication.max_splits": _int_key(5, 1),
    "communication.fp16": _bool_key(False),
    "communication.fp16_scale": _int_key(128, 1),
    "communication.clip_after_allreduce": _bool_key(False),
    "communication.gradients_reduce_method": _str_key("mean", "mean", "sum"),
    "io.slicing": _bool_key(False),
    "io.unbalanced_io_slicing": _bool_key(False),
    "io.drop_last_files": _bool_key(False),
    "auto.auto_parallel": _bool_key(False),
}

CATEGORIES = tuple(dict.fromkeys(key.split(".")[0] for key in KEYS))


def env_name(key: str) -> str:
    """``pipeline.num_micro_batch`` -> ``EPL_PIPELINE_NUM_MICRO_BATCH``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


_ENV_TO_KEY = {env_name(key): key for key in KEYS}


def _unknown_key(key: Any) -> ConfigError:
    close = difflib.get_close_matches(str(key), list(KEYS), n=1, cutoff=0.4)
    hint = f' did you mean "{close[0]}"?' if close else ""
    return ConfigError(
        f'EPL config: unknown key "{key}";{hint} (keys are category.attribute, see persia.epl.KEYS)'
    )


class _Section:
    """One category's attributes, read-only (``config.pipeline.num_micro_batch``)."""

    __slots__ = ("_name", "_values")

    def __init__(self, name: str, values: dict[str, Any]):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, attribute: str) -> Any:
        try:
            return self._values[attribute]
        except KeyError:
            raise _unknown_key(f"{self._name}.{attribute}") from None

    def __setattr__(self, attribute: str, value: Any) -> None:
        raise AttributeError(
            f"EPL config is immutable: build a new Config to change {self._name}.{attribute}"
        )

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


class Config:
    """EPL's configuration: ``Config({"pipeline.num_micro_batch": 4, "zero.level": "v1"})``.

    Arguments:
        param_dict: ``{"category.attribute": value}``; keys left out come from the
            ``EPL_<CATEGORY>_<ATTRIBUTE>`` environment variables, else EPL's defaults.
        environ: the environment to read (default ``os.environ``; tests pass a dict).
    """

    def __init__(
        self,
        param_dict: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ):
        if param_dict is None:
            param_dict = {}
        if not isinstance(param_dict, Mapping):
            raise InvalidInputError(
                "param_dict", 'a dict such as {"pipeline.num_micro_batch": 4}', param_dict
            )
        for key in param_dict:
            if key not in KEYS:
                raise _unknown_key(key)
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        self._from_env: list[str] = []
        for key, spec in KEYS.items():
            if key in param_dict:
                values[key] = spec.check(key, param_dict[key])
            elif env_name(key) in environ:
                name = env_name(key)
                values[key] = spec.check(
                    f"{key} (from {name})", spec.parse_env(name, environ[name])
                )
                self._from_env.append(key)
            else:
                values[key] = spec.default
        for name in environ:
            if name.startswith(ENV_PREFIX) and name not in _ENV_TO_KEY:
                close = difflib.get_close_matches(name, list(_ENV_TO_KEY), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                log.warning(
                    "environment variable %s is not an EPL config key: ignored%s", name, hint
                )
        self._values = values
        sections: dict[str, dict[str, Any]] = {c: {} for c in CATEGORIES}
        for key, value in values.items():
            category, attribute = key.split(".")
            sections[category][attribute] = value
        self._sections = {c: _Section(c, v) for c, v in sections.items()}
        self._frozen = True

    def __getattr__(self, category: str) -> _Section:
        sections = self.__dict__.get("_sections")
        if sections is None or category not in sections:
            raise _unknown_key(category)
        return sections[category]

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise AttributeError("EPL config is immutable: build a new Config to change it")
        object.__setattr__(self, name, value)

    def get(self, key: str) -> Any:
        """The value of ``"category.attribute"``."""
        if key not in KEYS:
            raise _unknown_key(key)
        return self._values[key]

    def to_dict(self) -> dict[str, Any]:
        """Every key with its value (a copy)."""
        return dict(self._values)

    def non_default(self) -> dict[str, Any]:
        """The keys whose value differs from EPL's default."""
        return {k: v for k, v in self._values.items() if v != KEYS[k].default}

    @property
    def from_env(self) -> tuple[str, ...]:
        """The keys whose value came from an ``EPL_*`` environment variable."""
        return tuple(self._from_env)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other._values == self._values

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))

    def __repr__(self) -> str:
        return f"Config({self.non_default()!r})"
