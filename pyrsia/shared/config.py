"""PERSIA's two YAML files, loaded into frozen, typed dataclasses.

``embedding_config.yml`` describes the sparse features (slots): their embedding
width, pooling, hash stacking and feature groups (``pyrsia.shared.embedding_schema``).
``global_config.yml`` sizes the servers and names the job type
(``pyrsia.shared.global_schema``). Key names and defaults are PERSIA's, so a PERSIA
user's files load unchanged; both are read with the option engine
(``pyrsia.shared.options``).

Every wrong value is an :class:`~pyrsia.shared.errors.OptionError` (a ``ConfigError``)
naming the file, the key path and what was expected::

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
``enable_metrics`` false; ``num_hashmap_internal_shards`` unset means one internal shard
per PS thread (PERSIA's 100 made every batch pay for 64 shards).
"""

from __future__ import annotations

from pathlib import Path

from pyrsia.shared.config_schema import (
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
    default_global_config,
)
from pyrsia.shared.embedding_schema import EMBEDDING_EXTRA_KEYS, parse_embedding_config
from pyrsia.shared.errors import ConfigWarning
from pyrsia.shared.global_schema import GLOBAL_EXTRA_KEYS, parse_global_config
from pyrsia.shared.options import unknown_keys_allowed
from pyrsia.shared.settings import Settings
from pyrsia.shared.yaml_file import read_yaml

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
    "unknown_keys_allowed",
]

PERSIA_EXTRA_KEYS = {**EMBEDDING_EXTRA_KEYS, **GLOBAL_EXTRA_KEYS}
"""Keys PERSIA's own example files carry that PERSIA's schema did not know, and what Pyrsia
does with each (so that those files load with unknown keys being errors)."""


def load_embedding_config(
    path: str | Path, *, strict: bool | None = None, settings: Settings | None = None
) -> EmbeddingSchema:
    """Load and validate ``embedding_config.yml``. ``strict`` None: unknown keys are errors
    unless ``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` of ``settings`` (the entry point's) allows
    them."""
    data, source = read_yaml(path)
    return parse_embedding_config(data, source=source, strict=strict, settings=settings)


def load_global_config(
    path: str | Path, *, strict: bool | None = None, settings: Settings | None = None
) -> GlobalConfig:
    """Load and validate ``global_config.yml`` (an empty file gives the defaults); ``strict``
    and ``settings`` as for :func:`load_embedding_config`."""
    data, source = read_yaml(path)
    return parse_global_config(data, source=source, strict=strict, settings=settings)
