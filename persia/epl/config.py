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

import logging
from collections.abc import Mapping
from typing import Any

from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.options import (
    Boolean,
    Choice,
    Custom,
    Integer,
    Key,
    KeyTable,
    Nullable,
    mismatch,
)
from pyrsia.shared.settings import current

__all__ = ["Config", "KEYS"]

log = logging.getLogger(__name__)

ENV_PREFIX = "EPL_"


def _devices(value: Any) -> str:
    """A comma-separated list of device indices ("" = leave the devices alone)."""
    if not isinstance(value, str):
        raise mismatch('a str of comma-separated device indices such as "0,1"')
    text = value.replace(" ", "")
    if text and not all(part.isdigit() for part in text.split(",")):
        raise mismatch()
    return text


def _loss_scale(value: Any) -> str | float:
    if isinstance(value, str) and value.lower() == "dynamic":
        return "dynamic"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise mismatch() from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise mismatch()
    return float(value)


def env_name(key: str) -> str:
    """``pipeline.num_micro_batch`` -> ``EPL_PIPELINE_NUM_MICRO_BATCH``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def _key(name: str, kind: Any, default: Any) -> Key:
    return Key(name, kind, default, env=env_name(name))


def _int(name: str, default: int, minimum: int) -> Key:
    return _key(name, Integer(minimum), default)


def _bool(name: str, default: bool) -> Key:
    return _key(name, Boolean(), default)


def _str(name: str, default: str, *choices: str) -> Key:
    return _key(name, Choice(*choices), default)


_DEVICES = Custom("str", 'comma-separated device indices such as "0,1" (or "")', _devices)
_LOSS_SCALE = Custom("integer/str", '"dynamic" or a number > 0', _loss_scale)

KEYS: dict[str, Key] = {
    key.name: key
    for key in (
        _int("pipeline.num_micro_batch", 1, 1),
        _key("pipeline.num_stages", Nullable(Integer(1)), None),
        _str("pipeline.strategy", "PreferBackward", "PreferBackward", "PreferForward"),
        _str("gradient_checkpoint.type", "", "", "collection", "auto"),
        _int("gradient_checkpoint.end_taskgraph", -1, -1),
        _bool("gradient_checkpoint.check_gradients", False),
        _str("zero.level", "", "", "v1"),
        _str("offload.level", "", "", "v0"),
        _str("amp.level", "", "", "O1"),
        _bool("amp.debug_log", False),
        _key("amp.loss_scale", _LOSS_SCALE, "dynamic"),
        _int("optimizer.num_apply_group", 1, 1),
        _bool("cluster.device_place_prefer_intra_node", True),
        _key("cluster.run_visible_devices", _DEVICES, ""),
        _bool("cluster.colocate_split_and_replicate", False),
        _int("communication.num_communicators", 2, 1),
        _bool("communication.sparse_as_dense", False),
        _int("communication.max_splits", 5, 1),
        _bool("communication.fp16", False),
        _int("communication.fp16_scale", 128, 1),
        _bool("communication.clip_after_allreduce", False),
        _str("communication.gradients_reduce_method", "mean", "mean", "sum"),
        _bool("io.slicing", False),
        _bool("io.unbalanced_io_slicing", False),
        _bool("io.drop_last_files", False),
        _bool("auto.auto_parallel", False),
    )
}
"""EPL's keys: ``"category.attribute"`` -> :class:`~pyrsia.shared.options.Key` (kind, default,
environment variable)."""

TABLE = KeyTable(
    KEYS.values(),
    subject="EPL config",
    where=lambda key: f'EPL config "{key}"',
    advice="; keys are category.attribute, see persia.epl.KEYS",
)

CATEGORIES = tuple(dict.fromkeys(key.split(".")[0] for key in KEYS))


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
            raise TABLE.unknown(f"{self._name}.{attribute}") from None

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
        environ: the environment to read (default: this process's settings; tests pass a dict).
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
        environ = current().environ if environ is None else environ
        values, self._from_env = TABLE.resolve(param_dict, environ)
        for name, hint in TABLE.stray_env(environ, ENV_PREFIX):
            log.warning("environment variable %s is not an EPL config key: ignored%s", name, hint)
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
            raise TABLE.unknown(category)
        return sections[category]

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise AttributeError("EPL config is immutable: build a new Config to change it")
        object.__setattr__(self, name, value)

    def get(self, key: str) -> Any:
        """The value of ``"category.attribute"``."""
        return self._values[TABLE.lookup(key).name]

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
