"""The environment this process hands on: what a launcher exports before it runs a user
script or torch's agent, and what a child process is started with.

The one library module that writes ``os.environ`` (``pyrsia.shared.settings`` reads it):
a launcher sets ``REPLICA_INDEX``, ``PERSIA_RESUME`` and the like here for the script it
runs in this process or the ranks it starts, which read them through their own settings.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping


def export(values: Mapping[str, str]) -> None:
    """Set every variable of ``values`` in this process's environment (its children inherit)."""
    os.environ.update(values)


def export_default(name: str, value: str) -> None:
    """Set ``name`` to ``value`` unless it is set already."""
    os.environ.setdefault(name, value)


def replace(name: str, value: str) -> str | None:
    """Set ``name`` to ``value``; returns the value it had (None: unset)."""
    previous = os.environ.get(name)
    os.environ[name] = value
    return previous


def prepend_path(name: str, entry: str) -> None:
    """Put ``entry`` first in the ``:``-separated list ``name`` (``LD_LIBRARY_PATH``)."""
    os.environ[name] = f"{entry}:{os.environ.get(name, '')}"


def unset(names: Iterable[str]) -> None:
    """Remove each of ``names`` from this process's environment (absent ones are skipped)."""
    for name in names:
        os.environ.pop(name, None)
