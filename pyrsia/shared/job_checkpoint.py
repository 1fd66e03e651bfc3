"""Point-in-time checkpoints of a whole training job, and finding the one to resume from.

A job checkpoint is one directory per step under ``checkpoint_dir``::

    step_0000000150/
        embedding/              every PS replica's shard (the PS /dump format)
        dense.pt  opt.pt        dense model and dense optimizer state (NN-worker rank 0)
        data/rank_<r>.npy       uint64 ids of the batches rank r had trained (cumulative)
        MANIFEST.json           written last, atomically: the commit marker

Only a directory whose ``MANIFEST.json`` exists is complete; a crash at any earlier point
leaves an incomplete directory that resuming ignores (and the next prune removes).
The data files are ``.npy`` written with ``allow_pickle=False`` and JSON: no pickle.

Consistency: :class:`~persia._train_ctx.TrainCtx` writes a checkpoint at a step boundary
after every rank has drained its in-flight embedding gradients (the staleness window) and
passed a barrier, and no rank sends a gradient again until rank 0 has dumped every PS shard
and the dense state. So every shard holds exactly the updates of the batches listed under
``data/``, no more and no fewer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np

from pyrsia.shared.config import CheckpointingConfig, load_global_config
from pyrsia.shared.constants import ENV_GLOBAL_CONFIG, ENV_RESUME
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)

FORMAT = "pyrsia-job-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"
EMBEDDING_SUBDIR = "embedding"
DENSE_FILE = "dense.pt"
OPTIMIZER_FILE = "opt.pt"
DATA_SUBDIR = "data"
_STEP_DIR = re.compile(r"^step_(\d{10})$")


def resume_requested(settings: Settings) -> bool:
    """True when the launcher was given ``--resume`` (it sets ``PERSIA_RESUME=1`` in the
    environment of the script it runs, read into ``settings``)."""
    raw = settings.text(ENV_RESUME)
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{ENV_RESUME}: expected 0 or 1, got {raw!r}")
    return raw == "1"


def checkpointing_config(settings: Settings) -> CheckpointingConfig:
    """``common_config.checkpointing_config`` of ``$PERSIA_GLOBAL_CONFIG`` (defaults without it)."""
    path = settings.text(ENV_GLOBAL_CONFIG)
    if not path:
        return CheckpointingConfig()
    return load_global_config(path, settings=settings).common_config.checkpointing_config


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:010d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_data_position(directory: Path, rank: int, batch_ids: list[int]) -> None:
    """Rank ``rank``'s trained batch ids (complete file or none: temp name, then rename)."""
    data = directory / DATA_SUBDIR
    data.mkdir(parents=True, exist_ok=True)
    path = data / f"rank_{rank}.npy"
    tmp = data / f".rank_{rank}.npy.tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, np.asarray(batch_ids, dtype=np.uint64), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def commit(directory: Path, manifest: dict) -> None:
    """Write ``MANIFEST.json`` last and atomically: from now on the checkpoint is complete."""
    body = {"format": FORMAT, "version": FORMAT_VERSION, "time": time.time(), **manifest}
    tmp = directory / f".{MANIFEST}.tmp"
    with open(tmp, "w") as fh:
        json.dump(body, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / MANIFEST)
    _fsync_dir(directory)


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a complete checkpoint, or None (missing, unreadable or foreign)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    if manifest.get("version") != FORMAT_VERSION or not isinstance(manifest.get("step"), int):
        return None
    return manifest


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and read_manifest(child) is not None:
            found.append((int(match[1]), child))
    return sorted(found)


def latest_complete(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (None when there is none)."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def trained_batch_ids(directory: Path) -> np.ndarray:
    """Sorted ids of every batch trained into the checkpoint in ``directory`` (all ranks)."""
    parts = [
        np.load(path, allow_pickle=False)
        for path in sorted((directory / DATA_SUBDIR).glob("*.npy"))
    ]
    if not parts:
        return np.empty(0, dtype=np.uint64)
    return np.unique(np.concatenate(parts).astype(np.uint64, copy=False))


def resumed_batch_ids(replica_index: int, replica_size: int, settings: Settings) -> frozenset[int]:
    """What a data loader replica skips on ``--resume``: the ids of its batches (``id %
    replica_size == replica_index``) trained into the newest complete checkpoint under
    ``checkpointing_config.checkpoint_dir``; none when there is no such checkpoint (logged)."""
    config = checkpointing_config(settings)
    directory = latest_complete(config.checkpoint_dir) if config.checkpoint_dir else None
    if directory is None:
        log.warning("--resume: no complete checkpoint found; sending every batch")
        return frozenset()
    ids = trained_batch_ids(directory)
    mine = ids[ids % replica_size == replica_index]
    log.info(
        "--resume from %s: skipping %d batches of this replica already trained",
        directory,
        len(mine),
    )
    return frozenset(int(i) for i in mine)


def prune(root: str | Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; drop older ones and stale incomplete ones."""
    complete = complete_checkpoints(root)
    if not complete:
        return
    newest = complete[-1][0]
    for _, directory in complete[:-keep]:
        shutil.rmtree(directory, ignore_errors=True)
    for child in Path(root).iterdir():
        match = _STEP_DIR.match(child.name)
        if match and int(match[1]) < newest and read_manifest(child) is None:
            shutil.rmtree(child, ignore_errors=True)  # a dump that crashed before its commit
