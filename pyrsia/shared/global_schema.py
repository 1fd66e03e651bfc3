"""``global_config.yml``: server sizes and the job type, parsed into a frozen :class:`GlobalConfig`.

Key names and defaults are those PERSIA's Rust source (``persia-embedding-config``) ran
with, e.g. ``enable_metrics`` false, except ``num_hashmap_internal_shards``: unset, a PS gets
one internal shard per thread (PERSIA's 100 made every batch pay for 64). Values are
read with the option engine (:mod:`pyrsia.shared.options`): a wrong value is an
:class:`~pyrsia.shared.errors.OptionError` naming the file and the key path, an unknown
key names the closest known one.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from pyrsia.shared.constants import MAX_CHECKPOINT_WORKERS
from pyrsia.shared.options import Section, strict_default
from pyrsia.shared.settings import Settings

__all__ = [
    "GLOBAL_EXTRA_KEYS",
    "MAX_CHECKPOINT_WORKERS",
    "CheckpointingConfig",
    "CommonConfig",
    "EmbeddingParameterServerConfig",
    "EmbeddingWorkerConfig",
    "GlobalConfig",
    "InferConfig",
    "JobType",
    "MetricsConfig",
    "default_global_config",
    "parse_global_config",
]

GLOBAL_EXTRA_KEYS = {
    "common_config.num_embedding_io_workers": "ignored: a key of PERSIA's examples that its "
    "schema did not know; the PS's dump/load threads are checkpointing_config.num_workers",
    "common_config.metrics_config.push_interval_sec": "read as push_interval_seconds (PERSIA's "
    "examples' spelling, which PERSIA's schema did not know)",
}
"""Keys of PERSIA's example ``global_config.yml`` files that PERSIA's schema did not know."""


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
    num_hashmap_internal_shards: int | None = None
    """Internal shards of each PS replica's store; None (unset): one per PS thread, where
    PERSIA's 100 cost every batch ~5 us per shard (``embedding_ps.capacity.internal_shards``)."""
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
        """The YAML shape (job type as its name, servers as a list, an unset
        ``num_hashmap_internal_shards`` left out)."""
        d = dataclasses.asdict(self)
        ps = d["embedding_parameter_server_config"]
        if ps["num_hashmap_internal_shards"] is None:
            del ps["num_hashmap_internal_shards"]
        d["common_config"]["job_type"] = self.common_config.job_type.value
        d["common_config"]["infer_config"]["servers"] = list(
            self.common_config.infer_config.servers
        )
        return d

    @classmethod
    def from_dict(cls, data: object, *, source: str = "<wire>") -> GlobalConfig:
        """Validate and rebuild a config from :meth:`to_dict`'s shape (unknown keys are errors)."""
        return parse_global_config(data, source=source, strict=True)


def default_global_config() -> GlobalConfig:
    """PERSIA's defaults, used when no ``global_config.yml`` is given."""
    return GlobalConfig()


# --------------------------------------------------------------------------- parsing


def _parse_metrics(m: Section) -> MetricsConfig:
    interval = m.integer("push_interval_seconds", MetricsConfig.push_interval_seconds)
    if m.raw("push_interval_sec") is not ...:  # PERSIA's examples' spelling (GLOBAL_EXTRA_KEYS)
        if "push_interval_seconds" in m.data:
            m.fail(
                "push_interval_sec",
                "",
                message="and push_interval_seconds are the same "
                "setting; keep push_interval_seconds only",
            )
        interval = m.integer("push_interval_sec", MetricsConfig.push_interval_seconds)
    metrics = MetricsConfig(
        enable_metrics=m.boolean("enable_metrics", MetricsConfig.enable_metrics),
        job_name=m.string("job_name", MetricsConfig.job_name),
        push_interval_seconds=interval,
    )
    m.done()
    return metrics


def _parse_checkpointing(c: Section) -> CheckpointingConfig:
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
    return checkpointing


def _parse_infer(i: Section) -> InferConfig:
    servers = i.raw("servers")
    if servers is ... or servers is None:
        servers = []
    if not isinstance(servers, list) or not all(isinstance(x, str) and x for x in servers):
        i.fail("servers", 'a list of "host:port" strings', servers)
    infer = InferConfig(
        servers=tuple(servers), embedding_checkpoint=i.string("embedding_checkpoint", "")
    )
    i.done()
    return infer


def _parse_common(s: Section) -> CommonConfig:
    raw_job = s.raw("job_type")
    job = JobType.Train
    if raw_job is not ...:
        by_lower = {j.value.lower(): j for j in JobType}
        if not isinstance(raw_job, str) or raw_job.lower() not in by_lower:
            s.fail("job_type", "one of Train, Eval, Infer", raw_job)
        job = by_lower[raw_job.lower()]
    s.ignored(
        "num_embedding_io_workers", GLOBAL_EXTRA_KEYS["common_config.num_embedding_io_workers"]
    )
    metrics = _parse_metrics(s.section("metrics_config"))
    checkpointing = _parse_checkpointing(s.section("checkpointing_config"))
    infer = _parse_infer(s.section("infer_config"))
    s.done()
    return CommonConfig(job, metrics, checkpointing, infer)


def _parse_ps(s: Section) -> EmbeddingParameterServerConfig:
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
        ),
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


def _parse_worker(s: Section) -> EmbeddingWorkerConfig:
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
    data: object,
    *,
    source: str = "<dict>",
    strict: bool | None = None,
    settings: Settings | None = None,
) -> GlobalConfig:
    """Validate an already-loaded ``global_config.yml`` (a mapping, or None for all defaults).

    ``strict``: unknown keys are errors (True) or warnings (False); None: errors unless
    ``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` is set in ``settings`` (the entry point's)."""
    top = Section(data, source, "", strict_default(strict, settings))
    cfg = GlobalConfig(
        common_config=_parse_common(top.section("common_config")),
        embedding_parameter_server_config=_parse_ps(
            top.section("embedding_parameter_server_config")
        ),
        embedding_worker_config=_parse_worker(top.section("embedding_worker_config")),
    )
    top.done()
    return cfg
