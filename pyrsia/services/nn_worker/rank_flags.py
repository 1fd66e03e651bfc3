"""The torch.distributed.run flags both launchers take (``persia-launcher nn-worker`` and
``python -m persia.hb.run``): the parser's part, the frozen :class:`RankOptions` each builds
from them at its entry point, and the ``torch.distributed.run`` command line they make."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pyrsia.services.nn_worker.devices import visible_gpu_count
from pyrsia.shared.constants import DEFAULT_MASTER_PORT
from pyrsia.shared.errors import ConfigError, UsageError
from pyrsia.shared.settings import Settings

RDZV_BACKEND = "pyrsia-static"
"""pyrsia.services.nn_worker.rendezvous.BACKEND, spelled here so building the command imports no torch."""


def add_rank_flags(parser: argparse.ArgumentParser) -> None:
    """The torch.distributed.run flags both launchers take (nn-worker and persia.hb.run)."""
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int,
        default=None,
        help="ranks on this node (default: one per visible GPU, 1 without GPUs)",
    )
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        default=0,
        help="index of this node, 0-based (default 0)",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        default="127.0.0.1",
        help="address of node 0 for torch's rendezvous (default 127.0.0.1)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        default=None,
        help="port of torch's rendezvous on node 0 (default $MASTER_PORT, else 29500)",
    )


@dataclass(frozen=True)
class RankOptions:
    """The torch.distributed.run flags both launchers take (nn-worker and persia.hb.run),
    resolved and checked at their entry point."""

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_flags(cls, args: argparse.Namespace, settings: Settings) -> RankOptions:
        """The rank flags of ``args``: an absent ``--nproc-per-node`` is the visible GPU count
        and an absent ``--master-port`` ``$MASTER_PORT`` (of ``settings``); UsageError names
        a bad one."""
        nproc = args.nproc_per_node
        if nproc is None:
            try:
                nproc = max(1, visible_gpu_count(settings.environ))
            except ConfigError as exc:
                raise UsageError(str(exc)) from None
        if nproc < 1:
            raise UsageError(f"--nproc-per-node must be >= 1, got {nproc}")
        if args.nnodes < 1:
            raise UsageError(f"--nnodes must be >= 1, got {args.nnodes}")
        if not 0 <= args.node_rank < args.nnodes:
            raise UsageError(f"--node-rank must be in [0, {args.nnodes - 1}], got {args.node_rank}")
        port = args.master_port
        if port is None:
            raw = settings.text("MASTER_PORT") or str(DEFAULT_MASTER_PORT)
            try:
                port = int(raw)
            except ValueError:
                raise UsageError(f"MASTER_PORT: expected a port number, got {raw!r}") from None
        if not 0 < port < 65536:
            raise UsageError(f"--master-port must be in [1, 65535], got {port}")
        return cls(nproc, args.nnodes, args.node_rank, args.master_addr, port)


def torchrun_args(ranks: RankOptions, command: list[str], *, no_python: bool = False) -> list[str]:
    """The ``torch.distributed.run`` command line for these flags, running ``command``
    (the script or program, then its arguments).

    The rendezvous is torch's static one (node ``--node-rank`` of ``--nnodes``, the store at
    ``--master-addr:--master-port``), through :data:`pyrsia.services.nn_worker.rendezvous.BACKEND` so
    that the store listens on ``--master-addr`` only. ``no_python``: ``command`` is a command
    to execute (``python train.py``), not a Python file for torch's launcher to run with its
    own interpreter.
    """
    host = ranks.master_addr
    endpoint = f"[{host}]:{ranks.master_port}" if ":" in host else f"{host}:{ranks.master_port}"
    return [
        *(["--no-python"] if no_python else []),
        f"--nproc-per-node={ranks.nproc_per_node}",
        f"--nnodes={ranks.nnodes}",
        f"--rdzv-backend={RDZV_BACKEND}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-conf=rank={ranks.node_rank}",
        "--max-restarts=0",
        *command,
    ]
