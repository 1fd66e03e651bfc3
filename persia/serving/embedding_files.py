"""The embedding part of a serving artifact: a PS checkpoint, checked and copied from persia.

The format is the one the PS's ``/dump`` writes (``pyrsia/services/embedding_ps/checkpoint.py``
documents it): ``replica_<i>.manifest.json`` commit markers naming ``.npy`` data files.
This side only reads the manifests (JSON) and moves files; the PS loads the data.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pyrsia.shared.constants import EMBEDDING_CHECKPOINT_FORMAT, EMBEDDING_CHECKPOINT_VERSION
from pyrsia.shared.errors import InvalidInputError

__all__ = ["checkpoint_manifests", "copy_checkpoint"]


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link when possible: PS checkpoint files are written once and never modified."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def checkpoint_manifests(src: Path) -> list[dict]:
    """The manifests of a complete PS checkpoint in ``src`` (checked like the PS checks them)."""
    if not src.is_dir():
        raise InvalidInputError("embedding_checkpoint_dir", "an existing directory", str(src))
    manifests: dict[int, dict] = {}
    for path in src.glob("replica_*.manifest.json"):
        try:
            m = json.loads(path.read_text())
            index = int(path.name.split("_", 1)[1].split(".", 1)[0])
        except (OSError, ValueError) as exc:
            raise InvalidInputError(
                "embedding_checkpoint_dir", f"a readable {path.name}", str(exc)
            ) from exc
        if (
            not isinstance(m, dict)
            or m.get("format") != EMBEDDING_CHECKPOINT_FORMAT
            or m.get("format_version") != EMBEDDING_CHECKPOINT_VERSION
        ):
            raise InvalidInputError(
                "embedding_checkpoint_dir",
                f"{EMBEDDING_CHECKPOINT_FORMAT} version {EMBEDDING_CHECKPOINT_VERSION} in {path.name}",
                m.get("format_version") if isinstance(m, dict) else None,
            )
        manifests[index] = m
    counts = {m.get("replica_count") for m in manifests.values()}
    if not manifests or len(counts) != 1:
        raise InvalidInputError(
            "embedding_checkpoint_dir",
            "a PS checkpoint written by one dump (replica_<i>.manifest.json files)",
            str(src),
        )
    count = counts.pop()
    missing = sorted(set(range(count)) - set(manifests))
    if missing:
        raise InvalidInputError(
            "embedding_checkpoint_dir", f"parts of all {count} replicas", f"missing {missing}"
        )
    return [manifests[i] for i in range(count)]


def copy_checkpoint(src: Path, dst: Path) -> list[dict]:
    """Copy (hard-link) a complete checkpoint from ``src`` into the new directory ``dst``."""
    manifests = checkpoint_manifests(src)
    dst.mkdir()
    for m in manifests:  # data files first, manifests (the commit markers) last
        for info in m["dims"].values():
            for key in ("ids", "rows"):
                _link_or_copy(src / info[key], dst / info[key])
    for m in manifests:
        name = f"replica_{m['replica_index']}.manifest.json"
        shutil.copy2(src / name, dst / name)
    return manifests
