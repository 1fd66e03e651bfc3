"""Dense-model and optimizer state files of a checkpoint (the embeddings are the PS's part).

Files are written under a temporary name and renamed when complete, so a crash never
leaves a truncated ``dense.pt`` that looks valid. State dicts are loaded with
``torch.load(weights_only=True)``: a checkpoint file cannot run code.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from pyrsia.shared.errors import InvalidTypeError


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside a DistributedDataParallel (or Bagua) wrapper."""
    return getattr(module, "module", module)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_state(
    instance: torch.nn.Module | torch.optim.Optimizer, path: str | Path, *, is_jit: bool = False
) -> Path:
    """Write ``instance.state_dict()`` (or a TorchScript of a module) to ``path``."""
    path = Path(path)
    buffer = io.BytesIO()
    if is_jit:
        if not isinstance(instance, torch.nn.Module):
            raise InvalidTypeError(
                "instance",
                "a torch.nn.Module with is_jit=True",
                message=f"is_jit=True needs a torch.nn.Module, got {type(instance).__name__}",
            )
        torch.jit.save(torch.jit.script(unwrap(instance)), buffer)
    else:
        target = unwrap(instance) if isinstance(instance, torch.nn.Module) else instance
        torch.save(target.state_dict(), buffer)
    _atomic_write(path, buffer.getvalue())
    return path


def load_state(
    instance: torch.nn.Module | torch.optim.Optimizer,
    path: str | Path,
    map_location: str | torch.device | None = None,
) -> None:
    """Load a state dict written by :func:`save_state` into ``instance`` (weights only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    state = torch.load(path, map_location=map_location, weights_only=True)
    target = unwrap(instance) if isinstance(instance, torch.nn.Module) else instance
    target.load_state_dict(state)
