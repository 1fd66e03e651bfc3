"""``persia-launcher data-loader``: :mod:`pyrsia.services.data_loader.launch`, with ``persia.env``
read again once the replica's place in the job is set (this process imported ``persia``)."""

from __future__ import annotations

from persia.env import reload_env
from pyrsia.services.data_loader.launch import build_parser
from pyrsia.services.data_loader.launch import main as _main

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run data_loader.py as one replica (the flags of ``python -m pyrsia.services.data_loader``)."""
    return _main(argv, env_changed=reload_env)
