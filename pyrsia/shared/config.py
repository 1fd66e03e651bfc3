"""PERSIA's two YAML files, loaded into frozen, typed dataclasses.

``embedding_config.yml`` describes the sparse features (slots): their embedding
width, pooling, hash stacking and feature groups. ``global_config.yml`` sizes the
servers and names the job type. Key names and defaults are PERSIA's, so a PERSIA
user's files load unchanged.

Every wrong value is a :class:`~pyrsia.shared.errors.ConfigError` naming the file, the key
path and what was expected::

    embedding_config.yml: slots_config.age.dim: expected a positive integer, got "8x"

An unknown key is an error naming the closest known key::

    global_config.yml: common_config.checkpointing_config.checkpoint_every_n_step: unknown
    key (did you mean "checkpoint_every_n_steps"?) ...

``strict=False``, ``--allow-unknown-config-keys`` or ``PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS=1``
make it a :class:`ConfigWarning` and the key is ignored (a file written for a newer
version). The keys PERSIA's own example files carry that its schema did not know are known
here (:data:`PERSIA_EXTRA_KEYS`): ``metrics_config.push_interval_sec`` is read as
``push_interval_seconds``; a slot's ``capacity`` and ``common_config.num_embedding_io_workers``
are ignored, as PERSIA ignored them, with a note in the log.

Defaults are those PERSIA's Rust source (``persia-embedding-config``) ran with, e.g.
``enable_metrics`` false and ``num_hashmap_internal_shards`` 100.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyrsia.shared.config_schema import (
    MAX_CHECKPOINT_WORKERS,
    CheckpointingConfig,
    CommonConfig,
    EmbeddingParameterServerConfig,
    EmbeddingSchema,
    EmbeddingWorkerConfig,
    GlobalConfig,
    HashStackConfig,
    InferConfig,
    JobType,
    MetricsConfig,
    SlotConfig,
    _suggest,
    default_global_config,
)
from pyrsia.shared.constants import ENV_ALLOW_UNKNOWN_CONFIG_KEYS
from pyrsia.shared.errors import ConfigError, ConfigWarning
from pyrsia.shared.yaml_file import read_yaml
from pyrsia.shared.yaml_file import show_value as _show

__all__ = [
    "CheckpointingConfig",
    "CommonConfig",
    "ConfigWarning",
    "EmbeddingParameterServerConfig",
    "EmbeddingSchema",
    "EmbeddingWorkerConfig",
    "GlobalConfig",
    "HashStackConfig",
    "InferConfig",
    "JobType",
    "MetricsConfig",
    "SlotConfig",
    "default_global_config",
    "load_embedding_config",
    "load_global_config",
    "parse_embedding_config",
    "parse_global_config",
]


# --------------------------------------------------------------------------- reading


log = logging.getLogger(__name__)

PERSIA_EXTRA_KEYS = {
    "slots_config.<slot>.capacity": "ignored: PERSIA's examples set a per-slot capacity that "
    "PERSIA ignored too; a PS replica's capacity is embedding_parameter_server_config.capacity",
    "common_config.num_embedding_io_workers": "ignored: a key of PERSIA's examples that its "
    "schema did not know; the PS's dump/load threads are checkpointing_config.num_workers",
    "common_config.metrics_config.push_interval_sec": "read as push_interval_seconds (PERSIA's "
    "examples' spelling, which PERSIA's schema did not know)",
}
"""Keys PERSIA's own example files carry that PERSIA's schema did not know, and what Pyrsia
does with each (so that those files load with unknown keys being errors)."""


def unknown_keys_allowed() -> bool:
    """``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` is 1 (true, yes, on)."""
    raw = os.environ.get(ENV_ALLOW_UNKNOWN_CONFIG_KEYS, "").strip().lower()
    return raw in ("1", "true", "yes", "on")


def _strict(strict: bool | None) -> bool:
    """``strict`` as given, or by default: unknown keys are errors unless allowed."""
    return (not unknown_keys_allowed()) if strict is None else strict


class _Section:
    """One mapping of the YAML tree: typed getters that name the key path in their errors.

    Every getter records its key as known; :meth:`done` reports the keys nobody asked for.
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
        return ".".join(p for p in (self.path, key) if p)

    def fail(self, key: str, expected: str, got: Any = ..., *, message: str | None = None) -> None:
        text = message or f"expected {expected}" + ("" if got is ... else f", got {_show(got)}")
        where = self.where(key)
        raise ConfigError(f"{self.source}: {where + ': ' if where else ''}{text}")

    def raw(self, key: str) -> Any:
        self.known.append(key)
        return self.data.get(key, ...)

    def integer(
        self, key: str, default: int, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        value = self.raw(key)
        if value is ...:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or value < minimum or (maximum is not None and value > maximum):
            if maximum is not None:
                expected = f"an integer from {minimum} to {maximum}"
            else:
                expected = {0: "a non-negative integer", 1: "a positive integer"}.get(
                    minimum, f"an integer >= {minimum}"
                )
            self.fail(key, expected, value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is ...:
            return default
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def string(self, key: str, default: str) -> str:
        value = self.raw(key)
        if value is ...:
            return default
        if not isinstance(value, str):
            self.fail(key, "a string", value)
        return value

    def section(self, key: str) -> _Section:
        value = self.raw(key)
        return _Section(None if value is ... else value, self.source, self.where(key), self.strict)

    def done(self) -> None:
        for key in self.data:
            if key in self.known:
                continue
            where = f"{self.source}: {self.where(str(key))}: unknown key"
            suggestion = _suggest(str(key), self.known)
            if self.strict:
                raise ConfigError(
                    f"{where}{suggestion}; correct it, or pass --allow-unknown-config-keys "
                    f"(or set {ENV_ALLOW_UNKNOWN_CONFIG_KEYS}=1) to ignore keys this version "
                    "does not know"
                )
            warnings.warn(f"{where}, ignored{suggestion}", ConfigWarning, stacklevel=4)

    def persia_extra(self, key: str, pattern: str) -> None:
        """``key`` is one of :data:`PERSIA_EXTRA_KEYS` that Pyrsia ignores: noted in the log."""
        if self.raw(key) is not ...:
            log.info("%s: %s: %s", self.source, self.where(key), PERSIA_EXTRA_KEYS[pattern])


# --------------------------------------------------------------------------- embedding_config


def _parse_slot(name: Any, data: object, source: str, strict: bool) -> SlotConfig:
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{source}: slots_config: expected slot names to be non-empty strings, got {_show(name)}"
        )
    s = _Section(data, source, f"slots_config.{name}", strict)
    if s.raw("index_prefix") is not ...:
        s.fail(
            "index_prefix",
            "",
            message="is computed from feature_groups and feature_index_prefix_bit and must not "
            "be set; remove it",
        )
    if s.raw("dim") is ...:
        s.fail("dim", "", message="is required: the embedding width, a positive integer")
    dim = s.integer("dim", 0)
    s.persia_extra("capacity", "slots_config.<slot>.capacity")
    hs = s.section("hash_stack_config")
    hash_stack = HashStackConfig(
        hash_stack_rounds=hs.integer("hash_stack_rounds", 0, minimum=0),
        embedding_size=hs.integer("embedding_size", 0, minimum=0),
    )
    if hash_stack.hash_stack_rounds > 0 and hash_stack.embedding_size == 0:
        hs.fail("embedding_size", "a positive integer when hash_stack_rounds > 0", 0)
    hs.done()
    slot = SlotConfig(
        name=name,
        dim=dim,
        embedding_summation=s.boolean("embedding_summation", True),
        sqrt_scaling=s.boolean("sqrt_scaling", False),
        sample_fixed_size=s.integer("sample_fixed_size", 10),
        hash_stack_config=hash_stack,
    )
    s.done()
    return slot


def _parse_groups(top: _Section, slot_names: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    groups = top.section("feature_groups")
    owner: dict[str, str] = {}
    result = []
    for group, members in groups.data.items():
        groups.known.append(group)
        if not isinstance(group, str) or not group:
            groups.fail("", "group names to be non-empty strings", group)
        if group in slot_names:
            groups.fail(group, "", message="a feature group must not have the name of a slot")
        if not isinstance(members, list) or not members:
            groups.fail(group, "a non-empty list of slot names", members)
        for i, slot in enumerate(members):
            key = f"{group}[{i}]"
            if not isinstance(slot, str) or slot not in slot_names:
                groups.fail(
                    key,
                    "",
                    message=f"unknown slot {_show(slot)}{_suggest(str(slot), slot_names)}; "
                    f"every grouped slot must be defined in slots_config",
                )
            if slot in owner:
                groups.fail(
                    key,
                    "",
                    message=f"slot {json.dumps(slot)} is already in group "
                    f"{json.dumps(owner[slot])}; a slot belongs to at most one group",
                )
            owner[slot] = group
        result.append((group, tuple(members)))
    groups.done()
    return tuple(result)


def parse_embedding_config(
    data: object, *, source: str = "<dict>", strict: bool | None = None
) -> EmbeddingSchema:
    """Validate an already-loaded ``embedding_config.yml`` (a mapping) into an :class:`EmbeddingSchema`.

    ``strict``: unknown keys are errors (True) or warnings (False); None: errors unless
    ``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` is set."""
    strict = _strict(strict)
    top = _Section(data, source, "", strict)
    bits = top.integer("feature_index_prefix_bit", 8, minimum=1, maximum=63)
    raw_slots = top.raw("slots_config")
    if raw_slots is ... or raw_slots is None:
        top.fail("slots_config", "", message="is required: a mapping of slot name to its settings")
    if not isinstance(raw_slots, Mapping) or not raw_slots:
        top.fail("slots_config", "a non-empty mapping of slot name to its settings", raw_slots)
    slots = tuple(_parse_slot(name, cfg, source, strict) for name, cfg in raw_slots.items())
    groups = _parse_groups(top, [s.name for s in slots])
    top.done()
    try:
        return EmbeddingSchema(
            slots_config=slots, feature_index_prefix_bit=bits, feature_groups=groups
        )
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


# --------------------------------------------------------------------------- global_config


def _parse_common(s: _Section) -> CommonConfig:
    raw_job = s.raw("job_type")
    job = JobType.Train
    if raw_job is not ...:
        by_lower = {j.value.lower(): j for j in JobType}
        if not isinstance(raw_job, str) or raw_job.lower() not in by_lower:
            s.fail("job_type", "one of Train, Eval, Infer", raw_job)
        job = by_lower[raw_job.lower()]
    s.persia_extra("num_embedding_io_workers", "common_config.num_embedding_io_workers")
    m = s.section("metrics_config")
    interval = m.integer("push_interval_seconds", MetricsConfig.push_interval_seconds)
    if m.raw("push_interval_sec") is not ...:  # PERSIA's examples' spelling (PERSIA_EXTRA_KEYS)
        if "push_interval_seconds" in m.data:
            m.fail("push_interval_sec", "", message="and push_interval_seconds are the same "
                   "setting; keep push_interval_seconds only")  # fmt: skip
        interval = m.integer("push_interval_sec", MetricsConfig.push_interval_seconds)
    metrics = MetricsConfig(
        enable_metrics=m.boolean("enable_metrics", MetricsConfig.enable_metrics),
        job_name=m.string("job_name", MetricsConfig.job_name),
        push_interval_seconds=interval,
    )
    m.done()
    c = s.section("checkpointing_config")
    checkpointing = CheckpointingConfig(
        num_workers=c.integer("num_workers", 4, maximum=MAX_CHECKPOINT_WORKERS),
        checkpoint_dir=c.string("checkpoint_dir", ""),
        checkpoint_every_n_steps=c.integer("checkpoint_every_n_steps", 0, minimum=0),
        checkpoint_every_n_seconds=c.integer("checkpoint_every_n_seconds", 0, minimum=0),
        keep_checkpoints=c.integer("keep_checkpoints", 2),
    )
    if checkpointing.periodic and not checkpointing.checkpoint_dir:
        c.fail(
            "checkpoint_dir",
            "",
            message="is required when checkpoint_every_n_steps or checkpoint_every_n_seconds "
            "is set: the directory periodic checkpoints are written to",
        )
    c.done()
    i = s.section("infer_config")
    servers = i.raw("servers")
    if servers is ... or servers is None:
        servers = []
    if not isinstance(servers, list) or not all(isinstance(x, str) and x for x in servers):
        i.fail("servers", 'a list of "host:port" strings', servers)
    infer = InferConfig(
        servers=tuple(servers), embedding_checkpoint=i.string("embedding_checkpoint", "")
    )
    i.done()
    s.done()
    return CommonConfig(job, metrics, checkpointing, infer)


def _parse_ps(s: _Section) -> EmbeddingParameterServerConfig:
    d = EmbeddingParameterServerConfig
    cfg = EmbeddingParameterServerConfig(
        capacity=s.integer("capacity", d.capacity),
        num_hashmap_internal_shards=s.integer(
            "num_hashmap_internal_shards", d.num_hashmap_internal_shards
        ),
        enable_incremental_update=s.boolean(
            "enable_incremental_update", d.enable_incremental_update
        ),
        incremental_buffer_size=s.integer("incremental_buffer_size", d.incremental_buffer_size),
        incremental_dir=s.string("incremental_dir", d.incremental_dir),
        incremental_channel_capacity=s.integer(
            "incremental_channel_capacity", d.incremental_channel_capacity
        ),
        incremental_scan_interval_seconds=s.integer(
            "incremental_scan_interval_seconds", d.incremental_scan_interval_seconds
        ),  # fmt: skip
    )
    if cfg.incremental_channel_capacity != d.incremental_channel_capacity:
        # PERSIA queues packets for a writer thread; Pyrsia writes each packet at once.
        s.fail(
            "incremental_channel_capacity",
            "",
            message=f"has no effect in Pyrsia (incremental packets are written as soon as "
            f"incremental_buffer_size ids changed, with no queue to bound); drop the key or "
            f"leave it at PERSIA's default {d.incremental_channel_capacity}",
        )
    s.done()
    return cfg


def _parse_worker(s: _Section) -> EmbeddingWorkerConfig:
    d = EmbeddingWorkerConfig
    cfg = EmbeddingWorkerConfig(
        forward_buffer_size=s.integer("forward_buffer_size", d.forward_buffer_size),
        buffered_data_expired_sec=s.integer(
            "buffered_data_expired_sec", d.buffered_data_expired_sec
        ),
    )
    s.done()
    return cfg


def parse_global_config(
    data: object, *, source: str = "<dict>", strict: bool | None = None
) -> GlobalConfig:
    """Validate an already-loaded ``global_config.yml`` (a mapping, or None for all defaults);
    ``strict`` as for :func:`parse_embedding_config`."""
    top = _Section(data, source, "", _strict(strict))
    cfg = GlobalConfig(
        common_config=_parse_common(top.section("common_config")),
        embedding_parameter_server_config=_parse_ps(
            top.section("embedding_parameter_server_config")
        ),
        embedding_worker_config=_parse_worker(top.section("embedding_worker_config")),
    )
    top.done()
    return cfg


# --------------------------------------------------------------------------- files


def load_embedding_config(path: str | Path, *, strict: bool | None = None) -> EmbeddingSchema:
    """Load and validate ``embedding_config.yml``."""
    data, source = read_yaml(path)
    return parse_embedding_config(data, source=source, strict=strict)


def load_global_config(path: str | Path, *, strict: bool | None = None) -> GlobalConfig:
    """Load and validate ``global_config.yml`` (an empty file gives the defaults)."""
    data, source = read_yaml(path)
    return parse_global_config(data, source=source, strict=strict)
