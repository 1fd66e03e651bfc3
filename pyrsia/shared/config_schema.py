"""The frozen dataclasses ``pyrsia.shared.config`` loads PERSIA's two YAML files into.

``EmbeddingSchema`` (``embedding_config.yml``, defined with its parser in
``pyrsia.shared.embedding_schema``) knows its slots, feature groups and each slot's
index prefix; ``GlobalConfig`` (``global_config.yml``, ``pyrsia.shared.global_schema``)
sizes the servers. Both round-trip through ``to_dict()`` / ``from_dict()`` so they can
cross the wire. Defaults are PERSIA's.
"""

from __future__ import annotations

from pyrsia.shared.embedding_schema import EmbeddingSchema, HashStackConfig, SlotConfig
from pyrsia.shared.global_schema import (
    MAX_CHECKPOINT_WORKERS,
    CheckpointingConfig,
    CommonConfig,
    EmbeddingParameterServerConfig,
    EmbeddingWorkerConfig,
    GlobalConfig,
    InferConfig,
    JobType,
    MetricsConfig,
    default_global_config,
)

__all__ = [
    "MAX_CHECKPOINT_WORKERS",
    "CheckpointingConfig",
    "CommonConfig",
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
]
