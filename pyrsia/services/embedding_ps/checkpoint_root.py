"""The directories a PS's ``/dump`` and ``/load`` may touch (its checkpoint roots).

A ``/dump`` writes (and replaces ``replica_*`` files) wherever its ``dir`` says, so the PS
confines it, by default too::

    --checkpoint-root DIR         only DIR (must exist); ``--checkpoint-root /`` allows any path
    $PERSIA_CHECKPOINT_ROOT=DIR   the same, when the flag is not given
    neither (or set empty)        the PS's working directory, and the job's
                                  ``common_config.checkpointing_config.checkpoint_dir`` when set
                                  (where periodic checkpoints go)

The default fits the launch files: honcho runs the PS in the repository (an example's relative
checkpoint path lands there), compose in ``/workspace`` (the mounted example), and a job with
periodic checkpoints names their directory in the config every replica reads.

A request's ``dir`` is resolved the way the file system will resolve it (relative to the PS's
working directory, every symlink and ``..`` followed, ``os.path.realpath``) and must be a root
or lie under one; anything else is refused with a 400 naming ``dir``, the path and the roots,
before any file is touched. The resolved path is the one used, so a request cannot name one
directory and write through a link to another.

Not covered: a symlink created inside a root after the check by someone who can already write
there (they own the root's contents anyway).
"""

from __future__ import annotations

import os
from pathlib import Path

from pyrsia.shared.constants import ENV_CHECKPOINT_ROOT
from pyrsia.shared.errors import InvalidInputError, UsageError
from pyrsia.shared.settings import Settings


def checkpoint_roots(
    value: str | None, settings: Settings, checkpoint_dir: str = ""
) -> tuple[Path, ...]:
    """The resolved roots: ``--checkpoint-root`` (``value``), else ``$PERSIA_CHECKPOINT_ROOT``
    of ``settings``,
    else (neither set, or empty) the working directory plus ``checkpoint_dir`` when it is set
    and not already under it. An explicit root must be an existing directory."""
    source = "--checkpoint-root"
    if value is None:
        value, source = settings.text(ENV_CHECKPOINT_ROOT), f"${ENV_CHECKPOINT_ROOT}"
    if value.strip():
        root = Path(os.path.realpath(value))
        if not root.is_dir():
            raise UsageError(f"{source} {value!r}: not an existing directory (create it first)")
        return (root,)
    roots = [Path(os.path.realpath(os.getcwd()))]
    if checkpoint_dir.strip():
        periodic = Path(os.path.realpath(checkpoint_dir))
        if not _inside(periodic, roots[0]):
            roots.append(periodic)
    return tuple(roots)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def confine(directory: str, roots: tuple[Path, ...] | Path | None) -> str:
    """``directory`` resolved and checked to lie in one of ``roots`` (unchanged without roots:
    an app built in-process, e.g. by a test or an embedded PS)."""
    if roots is None:
        return directory
    if isinstance(roots, Path):
        roots = (roots,)
    shown = ", ".join(str(r) for r in roots)
    try:
        resolved = Path(os.path.realpath(directory))
    except (ValueError, OSError) as exc:  # e.g. an embedded null byte
        raise InvalidInputError(
            "dir", f"a usable directory path inside {shown}", directory
        ) from exc
    if not any(_inside(resolved, root) for root in roots):
        raise InvalidInputError(
            "dir",
            f"a directory inside the PS checkpoint root{'s' if len(roots) > 1 else ''} {shown} "
            f"(--checkpoint-root or ${ENV_CHECKPOINT_ROOT}; by default the PS's working "
            f"directory and checkpointing_config.checkpoint_dir); {directory!r} resolves to "
            f"{str(resolved)!r}",
            directory,
        )
    return str(resolved)
