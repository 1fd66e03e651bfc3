"""Helpers PERSIA's example scripts use: reproducible seeding and YAML loading."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

__all__ = ["load_yaml", "setup_seed"]


def setup_seed(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators and ask for deterministic kernels.

    ``torch.use_deterministic_algorithms(True, warn_only=True)``: operations without a
    deterministic implementation warn instead of failing.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def load_yaml(filepath: str | Path) -> dict:
    """Load a YAML file; a missing file is a FileNotFoundError naming it (PERSIA inverted the test)."""
    import yaml

    path = Path(filepath)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with path.open() as fh:
        return yaml.safe_load(fh)
