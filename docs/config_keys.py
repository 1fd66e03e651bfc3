"""Every key of ``embedding_config.yml`` and ``global_config.yml``, with its meaning.

Keys, types and defaults are walked from the frozen dataclasses of
``pyrsia.shared.config_schema``; what each key does comes from :data:`MEANINGS`.
``docs/gen_reference.py`` renders them as ``reference/config.md``; ``tests/test_docs.py``
checks that every schema key has a meaning and every meaning a key.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Iterator

__all__ = ["GROUP", "MEANINGS", "SLOT", "schema_keys"]


SLOT = "slots_config.<slot>"
GROUP = "feature_groups.<group>"

# What each key does in Pyrsia. Keys, types and defaults come from the schema; a key
# missing here (or a meaning for a key the schema lacks) fails tests/test_docs.py.
MEANINGS: dict[str, dict[str, str]] = {
    "embedding_config.yml": {
        "feature_index_prefix_bit": "top bits of an id that hold its feature group, so equal "
        "ids in two slots are different embeddings (1 to 63)",
        f"{SLOT}.dim": "embedding width (required, a positive integer)",
        f"{SLOT}.embedding_summation": "sum a sample's vectors to `(batch, dim)`; false: raw "
        "`(batch, sample_fixed_size, dim + 1)`, the last column 1 for a real id",
        f"{SLOT}.sqrt_scaling": "scale the sum by 1/sqrt(ids in the sample)",
        f"{SLOT}.sample_fixed_size": "ids kept per sample in raw mode",
        f"{SLOT}.hash_stack_config.hash_stack_rounds": "replace each id by R hashed buckets in "
        "[0, R·E) (R = this key; 0 = off)",
        f"{SLOT}.hash_stack_config.embedding_size": "E of the hash stack; must be positive "
        "when `hash_stack_rounds` > 0",
        GROUP: "a list of slots that share one prefix (one embedding space); a slot belongs to "
        "at most one group, and a group must not have the name of a slot",
    },
    "global_config.yml": {
        "common_config.job_type": "`Train`, `Eval` or `Infer` (matched case-insensitively)",
        "common_config.metrics_config.enable_metrics": "push metrics to the Prometheus push "
        "gateway at `PERSIA_METRICS_GATEWAY_ADDR` (every service serves `/metrics` regardless)",
        "common_config.metrics_config.job_name": "the push gateway's job name",
        "common_config.metrics_config.push_interval_seconds": "seconds between pushes",
        "common_config.checkpointing_config.num_workers": "threads each PS replica dumps and "
        "loads its checkpoint with (1 to 64); the files are byte-identical for any value",
        "common_config.checkpointing_config.checkpoint_dir": "where periodic checkpoints go "
        "(seen by every NN worker and PS replica); required when periodic checkpoints are on",
        "common_config.checkpointing_config.checkpoint_every_n_steps": "periodic point-in-time "
        "checkpoint of the whole job every N steps (0 = off)",
        "common_config.checkpointing_config.checkpoint_every_n_seconds": "the same, every N "
        "seconds (0 = off)",
        "common_config.checkpointing_config.keep_checkpoints": "complete checkpoints kept",
        "common_config.infer_config.servers": "inference (`job_type: Infer`): a list of "
        '`"host:port"`; PS replica i listens at `servers[i]`, and embedding workers dial '
        "those addresses, so nothing needs Redis",
        "common_config.infer_config.embedding_checkpoint": "inference: the checkpoint each "
        "Infer PS replica loads at start",
        "embedding_parameter_server_config.capacity": "embedding vectors per PS replica (not "
        "floats); least-recently-used eviction beyond",
        "embedding_parameter_server_config.num_hashmap_internal_shards": "internal shards of "
        "the PS store, each with its own lock and LRU; unset: one per PS thread (`--threads`, "
        "`PYRSIA_PS_THREADS`); set: at least one per PS thread, at most 64",
        "embedding_parameter_server_config.enable_incremental_update": "training PS: write "
        "changed entries as packets; Infer PS: apply the packets found in `incremental_dir`",
        "embedding_parameter_server_config.incremental_buffer_size": "a packet is written "
        "every N distinct updated ids",
        "embedding_parameter_server_config.incremental_dir": "where incremental packets are "
        "written and read",
        "embedding_parameter_server_config.incremental_channel_capacity": "PERSIA's packet "
        "queue; packets are written at once here, so only the default is accepted",
        "embedding_parameter_server_config.incremental_scan_interval_seconds": "how often an "
        "Infer PS looks for new packets (PERSIA's fixed 10 s, made a key; integer >= 1)",
        "embedding_worker_config.forward_buffer_size": "buffered batches per data loader "
        "(429 beyond)",
        "embedding_worker_config.buffered_data_expired_sec": "buffered batches expire after "
        "this many seconds",
    },
}


def _show_default(value: object) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[]" if not value else repr(list(value))
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int):
        return f"{value:,}".replace(",", "_") if value >= 10**6 else str(value)
    return repr(value)


def _type_name(hint: object) -> str:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(m.value for m in hint)
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "list of " + _type_name(typing.get_args(hint)[0])
    return {int: "integer", bool: "boolean", str: "string", float: "number"}.get(hint, str(hint))


def _walk(cls: type, prefix: str) -> Iterator[tuple[str, str, str]]:
    """(key path, type, default) for every leaf field of a frozen config dataclass."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        hint = hints[f.name]
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hint):
            yield from _walk(hint, path)
            continue
        if f.default is dataclasses.MISSING:
            yield path, _type_name(hint), "(required)"
        else:
            yield path, _type_name(hint), _show_default(f.default)


def schema_keys() -> dict[str, list[tuple[str, str, str]]]:
    """Every key of the two YAML files, walked from ``pyrsia.shared.config_schema``."""
    from pyrsia.shared import config_schema as cs

    embedding: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cs.EmbeddingSchema):
        if not f.init:
            continue
        if f.name == "slots_config":
            for path, type_, default in _walk(cs.SlotConfig, SLOT):
                if path != f"{SLOT}.name":  # the slot's name is its key in the mapping
                    embedding.append((path, type_, default))
        elif f.name == "feature_groups":
            embedding.append((GROUP, "list of slot names", "(none)"))
        else:
            embedding.append((f.name, "integer", _show_default(f.default)))
    return {
        "embedding_config.yml": embedding,
        "global_config.yml": list(_walk(cs.GlobalConfig, "")),
    }
