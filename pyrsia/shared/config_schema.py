"""The frozen dataclasses ``pyrsia.shared.config`` loads PERSIA's two YAML files into.

``EmbeddingSchema`` (``embedding_config.yml``) knows its slots, feature groups and
each slot's index prefix; ``GlobalConfig`` (``global_config.yml``) sizes the servers.
Both round-trip through ``to_dict()`` / ``from_dict()`` so they can cross the wire.
Defaults are PERSIA's; see ``pyrsia.shared.config`` for where they come from.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from pyrsia.shared.errors import ConfigError

__all__ = [
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


def _suggest(key: str, known: Any) -> str:
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {json.dumps(close[0])}?)" if close else ""


@dataclass(frozen=True)
class HashStackConfig:
    """Hash stacking: each id becomes ``hash_stack_rounds`` ids in ``[0, rounds * embedding_size)``."""

    hash_stack_rounds: int = 0
    embedding_size: int = 0


@dataclass(frozen=True)
class SlotConfig:
    """One sparse feature: embedding width ``dim`` and how a sample's vectors are pooled."""

    name: str
    dim: int
    embedding_summation: bool = True
    sqrt_scaling: bool = False
    sample_fixed_size: int = 10
    hash_stack_config: HashStackConfig = HashStackConfig()


@dataclass(frozen=True)
class EmbeddingSchema:
    """The parsed ``embedding_config.yml``.

    ``slots_config`` keeps file order; ``feature_groups`` is ``((group, (slot, ...)), ...)``
    in file order. Slots of one group share an index prefix, so their ids share one
    embedding space; every other slot is a group of its own.
    """

    slots_config: tuple[SlotConfig, ...]
    feature_index_prefix_bit: int = 8
    feature_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    _by_name: dict[str, SlotConfig] = field(init=False, repr=False, compare=False)
    _prefixes: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {s.name: s for s in self.slots_config})
        groups = self.group_order()
        limit = (1 << self.feature_index_prefix_bit) - 1
        if len(groups) > limit:
            raise ConfigError(
                f"feature_index_prefix_bit: {self.feature_index_prefix_bit} bits hold at most "
                f"{limit} feature groups, got {len(groups)} (explicit groups plus ungrouped "
                f"slots); raise feature_index_prefix_bit or group slots in feature_groups"
            )
        shift = 64 - self.feature_index_prefix_bit
        prefixes = {name: (g + 1) << shift for g, members in enumerate(groups) for name in members}
        object.__setattr__(self, "_prefixes", prefixes)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """Slot names in file order (the order of the embedding tensors)."""
        return tuple(s.name for s in self.slots_config)

    def slot(self, name: str) -> SlotConfig:
        """The slot called ``name``; a ConfigError naming it when there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(
                f"unknown slot {json.dumps(name)}{_suggest(name, self._by_name)}; "
                f"embedding_config.yml defines {list(self._by_name)}"
            ) from None

    def group_order(self) -> tuple[tuple[str, ...], ...]:
        """PERSIA's group order: explicit groups in file order, then each ungrouped slot alone."""
        grouped = {name for _, members in self.feature_groups for name in members}
        explicit = tuple(members for _, members in self.feature_groups)
        alone = tuple((s.name,) for s in self.slots_config if s.name not in grouped)
        return explicit + alone

    def slot_prefixes(self) -> dict[str, int]:
        """Slot name -> index prefix ``(g + 1) << (64 - feature_index_prefix_bit)``."""
        return dict(self._prefixes)

    def to_dict(self) -> dict[str, Any]:
        """The YAML shape, so the schema can cross the wire and come back with :meth:`from_dict`."""
        return {
            "feature_index_prefix_bit": self.feature_index_prefix_bit,
            "slots_config": {
                s.name: {
                    "dim": s.dim,
                    "embedding_summation": s.embedding_summation,
                    "sqrt_scaling": s.sqrt_scaling,
                    "sample_fixed_size": s.sample_fixed_size,
                    "hash_stack_config": dataclasses.asdict(s.hash_stack_config),
                }
                for s in self.slots_config
            },
            "feature_groups": {g: list(members) for g, members in self.feature_groups},
        }

    @classmethod
    def from_dict(cls, data: object, *, source: str = "<wire>") -> EmbeddingSchema:
        """Validate and rebuild a schema from :meth:`to_dict`'s shape (unknown keys are errors)."""
        from pyrsia.shared.config import parse_embedding_config  # the parser imports this module

        return parse_embedding_config(data, source=source, strict=True)


class JobType(str, enum.Enum):
    """What the job does: train, evaluate, or serve inference."""

    Train = "Train"
    Eval = "Eval"
    Infer = "Infer"


@dataclass(frozen=True)
class MetricsConfig:
    enable_metrics: bool = False
    job_name: str = "persia_default_jobname"
    push_interval_seconds: int = 10


MAX_CHECKPOINT_WORKERS = 64
"""Most checkpoint threads a PS takes (``checkpointing_config.num_workers``)."""


@dataclass(frozen=True)
class CheckpointingConfig:
    """``common_config.checkpointing_config``: PERSIA's ``num_workers`` plus periodic checkpoints.

    ``num_workers`` (1 to 64) is the number of threads each PS replica writes and reads its
    part of a checkpoint with (``/dump``, ``/load``, ``infer_config.embedding_checkpoint``);
    the files are the same for any value.

    With ``checkpoint_every_n_steps`` or ``checkpoint_every_n_seconds`` above 0 (0 = off),
    ``TrainCtx`` writes a point-in-time checkpoint of the whole job (every PS shard, the
    dense model and optimizer, the data position) into ``checkpoint_dir`` at a step
    boundary, keeping the newest ``keep_checkpoints``; ``persia-launcher ... --resume``
    starts from the newest complete one.
    """

    num_workers: int = 4
    checkpoint_dir: str = ""
    checkpoint_every_n_steps: int = 0
    checkpoint_every_n_seconds: int = 0
    keep_checkpoints: int = 2

    @property
    def periodic(self) -> bool:
        """True when periodic checkpoints are switched on."""
        return self.checkpoint_every_n_steps > 0 or self.checkpoint_every_n_seconds > 0


@dataclass(frozen=True)
class InferConfig:
    servers: tuple[str, ...] = ()
    embedding_checkpoint: str = ""


@dataclass(frozen=True)
class CommonConfig:
    job_type: JobType = JobType.Train
    metrics_config: MetricsConfig = MetricsConfig()
    checkpointing_config: CheckpointingConfig = CheckpointingConfig()
    infer_config: InferConfig = InferConfig()


@dataclass(frozen=True)
class EmbeddingParameterServerConfig:
    capacity: int = 1_000_000_000
    num_hashmap_internal_shards: int = 100
    enable_incremental_update: bool = False
    incremental_buffer_size: int = 1_000_000
    incremental_dir: str = "/workspace/incremental_dir/"
    incremental_channel_capacity: int = 1000
    incremental_scan_interval_seconds: int = 10
    """Infer replicas look for new packets this often (PERSIA's fixed 10 s, made a key)."""


@dataclass(frozen=True)
class EmbeddingWorkerConfig:
    forward_buffer_size: int = 1000
    buffered_data_expired_sec: int = 1000


@dataclass(frozen=True)
class GlobalConfig:
    """The parsed ``global_config.yml``."""

    common_config: CommonConfig = CommonConfig()
    embedding_parameter_server_config: EmbeddingParameterServerConfig = (
        EmbeddingParameterServerConfig()
    )
    embedding_worker_config: EmbeddingWorkerConfig = EmbeddingWorkerConfig()

    def to_dict(self) -> dict[str, Any]:
        """The YAML shape (job type as its name, servers as a list)."""
        d = dataclasses.asdict(self)
        d["common_config"]["job_type"] = self.common_config.job_type.value
        d["common_config"]["infer_config"]["servers"] = list(
            self.common_config.infer_config.servers
        )
        return d

    @classmethod
    def from_dict(cls, data: object, *, source: str = "<wire>") -> GlobalConfig:
        from pyrsia.shared.config import parse_global_config  # the parser imports this module

        return parse_global_config(data, source=source, strict=True)


def default_global_config() -> GlobalConfig:
    """PERSIA's defaults, used when no ``global_config.yml`` is given."""
    return GlobalConfig()
