"""Reading a YAML config file: safe loading, duplicate keys refused, errors naming the file.

``pyrsia.shared.config`` parses what this returns into PERSIA's typed config dataclasses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pyrsia.shared.errors import ConfigError


def show_value(value: Any) -> str:
    """A config value as an error message shows it: JSON-like scalars, else type and repr."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, (str, int, float, bool)):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {show_value(key)}", key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> tuple[object, str]:
    """The YAML document in ``path`` and the path as text; errors name the file and line."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc}") from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader), source  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: {where}invalid YAML: {problem}") from exc
