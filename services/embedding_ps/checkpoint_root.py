"""``--checkpoint-root``: the one directory a PS's ``/dump`` and ``/load`` may touch.

Without a root a PS writes and reads any path its process may (as PERSIA's PS does). With one
(``--checkpoint-root DIR`` or ``$PERSIA_CHECKPOINT_ROOT``), a request's ``dir`` is resolved the
way the file system will resolve it (relative to the PS's working directory, every symlink and
``..`` followed, ``os.path.realpath``) and must be the root or lie under it; anything else is
refused with a 400 naming ``dir`` and the root, before any file is touched. The resolved path is
the one used, so a request cannot name one directory and write through a link to another.

Not covered: a symlink created inside the root after the check by someone who can already write
there (they own the root's contents anyway).
"""

from __future__ import annotations

import os
from pathlib import Path

from shared.constants import ENV_CHECKPOINT_ROOT
from shared.errors import InvalidInputError, UsageError


def checkpoint_root(value: str | None) -> Path | None:
    """The resolved root from ``--checkpoint-root`` (else ``$PERSIA_CHECKPOINT_ROOT``; empty:
    none). It must be an existing directory."""
    source = "--checkpoint-root"
    if value is None:
        value, source = os.environ.get(ENV_CHECKPOINT_ROOT, ""), f"${ENV_CHECKPOINT_ROOT}"
    if not value.strip():
        return None
    root = Path(os.path.realpath(value))
    if not root.is_dir():
        raise UsageError(f"{source} {value!r}: not an existing directory (create it first)")
    return root


def confine(directory: str, root: Path | None) -> str:
    """``directory`` resolved and checked to lie in ``root`` (unchanged when there is no root)."""
    if root is None:
        return directory
    try:
        resolved = Path(os.path.realpath(directory))
    except (ValueError, OSError) as exc:  # e.g. an embedded null byte
        raise InvalidInputError("dir", f"a usable directory path inside {root}", directory) from exc
    if resolved != root and root not in resolved.parents:
        raise InvalidInputError(
            "dir",
            f"a directory inside the PS checkpoint root {root} (--checkpoint-root); "
            f"{directory!r} resolves to {str(resolved)!r}",
            directory,
        )
    return str(resolved)
