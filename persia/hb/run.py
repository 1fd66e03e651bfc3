"""``python -m persia.hb.run [flags] python train.py [args]``: HybridBackend's launcher.

Starts one rank per visible GPU (``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``),
one rank on a CPU-only machine, or ``--nproc-per-node`` ranks when given, each running
the command with ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
``MASTER_PORT`` set. The ranks are started, watched and reaped by torch's own launcher
(``torch.distributed.run --no-python``), through the same code path as
``persia-launcher nn-worker``; the exit code is the first failing rank's.

Flags (before the command): ``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port`` (as for ``persia-launcher nn-worker``).
"""

from __future__ import annotations

import argparse
import shutil
import sys

from pyrsia.services.nn_worker.launch import run_ranks
from pyrsia.services.nn_worker.rank_flags import RankOptions, add_rank_flags, torchrun_args
from pyrsia.shared.cli import fail
from pyrsia.shared.errors import UsageError
from pyrsia.shared.settings import current


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m persia.hb.run",
        usage="python -m persia.hb.run [flags] command [args ...]   (e.g. python train.py)",
        description="Run a command on one rank per visible GPU (one on CPU-only machines) "
        "through torch.distributed.run.",
    )
    add_rank_flags(parser)
    parser.add_argument("command", help="the program every rank runs, e.g. python")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, e.g. train.py")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    settings = current()  # an entry point: `python -m persia.hb.run`
    try:
        ranks = RankOptions.from_flags(args, settings)
        if shutil.which(args.command) is None:
            raise UsageError(f"{args.command}: command not found")
    except UsageError as exc:
        return fail(str(exc))
    return run_ranks(torchrun_args(ranks, [args.command, *args.args], no_python=True), settings)


if __name__ == "__main__":
    raise SystemExit(main())
