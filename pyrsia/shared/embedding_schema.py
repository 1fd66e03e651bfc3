"""``embedding_config.yml``: the sparse features (slots), parsed into a frozen :class:`EmbeddingSchema`.

Each slot has its embedding width, pooling and hash stacking; feature groups make slots
share one id space. Key names and defaults are PERSIA's, so a PERSIA user's file loads
unchanged. Values are read with the option engine (:mod:`pyrsia.shared.options`): every
wrong value is an :class:`~pyrsia.shared.errors.OptionError` naming the file and key path::

    embedding_config.yml: slots_config.age.dim: expected a positive integer, got "8x"
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrsia.shared.errors import ConfigError, OptionError
from pyrsia.shared.options import Section, did_you_mean, strict_default
from pyrsia.shared.settings import Settings
from pyrsia.shared.yaml_file import show_value as _show

__all__ = [
    "EMBEDDING_EXTRA_KEYS",
    "EmbeddingSchema",
    "HashStackConfig",
    "SlotConfig",
    "parse_embedding_config",
]

EMBEDDING_EXTRA_KEYS = {
    "slots_config.<slot>.capacity": "ignored: PERSIA's examples set a per-slot capacity that "
    "PERSIA ignored too; a PS replica's capacity is embedding_parameter_server_config.capacity",
}
"""Keys of PERSIA's example ``embedding_config.yml`` files that PERSIA's schema did not know."""


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
                f"unknown slot {json.dumps(name)}{did_you_mean(name, self._by_name)}; "
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
        return parse_embedding_config(data, source=source, strict=True)


# --------------------------------------------------------------------------- parsing


def _parse_slot(name: Any, data: object, source: str, strict: bool) -> SlotConfig:
    if not isinstance(name, str) or not name:
        raise OptionError(
            "slots_config",
            "non-empty slot names",
            name,
            message=f"{source}: slots_config: expected slot names to be non-empty strings, "
            f"got {_show(name)}",
        )
    s = Section(data, source, f"slots_config.{name}", strict)
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
    s.ignored("capacity", EMBEDDING_EXTRA_KEYS["slots_config.<slot>.capacity"])
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


def _check_group(groups: Section, group: Any, members: Any, slot_names: list[str]) -> None:
    if not isinstance(group, str) or not group:
        groups.fail("", "group names to be non-empty strings", group)
    if group in slot_names:
        groups.fail(group, "", message="a feature group must not have the name of a slot")
    if not isinstance(members, list) or not members:
        groups.fail(group, "a non-empty list of slot names", members)


def _parse_groups(top: Section, slot_names: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    groups = top.section("feature_groups")
    owner: dict[str, str] = {}
    result = []
    for group, members in groups.data.items():
        groups.known.append(group)
        _check_group(groups, group, members, slot_names)
        for i, slot in enumerate(members):
            key = f"{group}[{i}]"
            if not isinstance(slot, str) or slot not in slot_names:
                groups.fail(
                    key,
                    "",
                    message=f"unknown slot {_show(slot)}{did_you_mean(slot, slot_names)}; "
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
    data: object,
    *,
    source: str = "<dict>",
    strict: bool | None = None,
    settings: Settings | None = None,
) -> EmbeddingSchema:
    """Validate an already-loaded ``embedding_config.yml`` (a mapping) into an :class:`EmbeddingSchema`.

    ``strict``: unknown keys are errors (True) or warnings (False); None: errors unless
    ``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` is set in ``settings`` (the entry point's)."""
    strict = strict_default(strict, settings)
    top = Section(data, source, "", strict)
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
