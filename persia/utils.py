"""PERSIA's ``persia.utils``: seeding, YAML files, commands, executables and free ports."""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from pyrsia.shared.errors import InvalidInputError

__all__ = [
    "MAXIMUM_LOCAL_PORT_NUM",
    "dump_yaml",
    "find_free_port",
    "load_yaml",
    "resolve_binary_execute_path",
    "run_command",
    "setup_seed",
]

_logger = logging.getLogger(__name__)


def setup_seed(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators and ask for deterministic kernels.

    ``torch.use_deterministic_algorithms(True, warn_only=True)``: operations without a
    deterministic implementation warn instead of failing.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidInputError("seed", "a non-negative integer", seed)
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


def dump_yaml(content: dict, filepath: str | Path) -> None:
    """Write ``content`` to ``filepath`` as YAML (PERSIA's helper)."""
    import yaml

    with Path(filepath).open("w") as fh:
        yaml.safe_dump(content, fh)


def run_command(cmd: list, env: dict | None = None) -> None:
    """Run ``cmd`` (items turned into strings) and raise ``CalledProcessError`` if it fails;
    the command line is logged first when ``PERSIA_LAUNCHER_VERBOSE=1``."""
    from persia.env import launcher_verbose

    cmd = [str(part) for part in cmd]
    if launcher_verbose():
        _logger.info("execute command: %s", " ".join(cmd))
    subprocess.check_call(cmd, env=env)


def resolve_binary_execute_path(binary_name: str) -> str:
    """Path of an executable: on ``PATH``, else beside this Python (a virtualenv's ``bin``).

    PERSIA's Rust servers lived in its package directory; Pyrsia's executables
    (``persia-launcher``, ``persia-k8s-utils``) are console scripts of the environment.
    """
    found = shutil.which(binary_name)
    return found or os.path.join(os.path.dirname(sys.executable), binary_name)


MAXIMUM_LOCAL_PORT_NUM: int = 65535


def _is_port_available(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def find_free_port(port: int = 10000, interval: int = 1) -> int:
    """``port`` if nothing listens on it, else the next free one stepping by ``interval``;
    ``ValueError`` past 65535."""
    if (
        isinstance(port, bool)
        or not isinstance(port, int)
        or not 0 < port <= MAXIMUM_LOCAL_PORT_NUM
    ):
        raise InvalidInputError("port", f"an integer in 1..{MAXIMUM_LOCAL_PORT_NUM}", port)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise InvalidInputError("interval", "a positive integer", interval)
    while not _is_port_available(port):
        port += interval
        if port > MAXIMUM_LOCAL_PORT_NUM:
            raise InvalidInputError(
                "port", "a port with a free one at or above it", message="free port not found"
            )
    return port
