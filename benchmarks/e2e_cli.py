"""The command line of the end-to-end benchmark (``e2e_bench.py``): its flags and their checks.

Kept apart from ``e2e_bench.py`` (the runs' plan and summary) so each file has one job.
:func:`parse_args` returns the parser (for a later ``parser.error``) and the arguments, the
comma-separated flags already split into lists and checked (a bad value exits 2 naming it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e import data as e2e_data
from e2e.peers import PEERS, resolve_peers
from e2e_runs import BATCH
from torchrec_peer import torchrec_missing

from pyrsia.shared.cpu_priority import CPU_PRIORITIES

RANK_BATCHES = ("whole", "split")
MODES = ("services", "embedded")
SETTINGS = ("defaults", "tuned")


def choice_list(
    parser: argparse.ArgumentParser, flag: str, value: str, choices: tuple[str, ...]
) -> list[str]:
    """``value`` split at commas: distinct members of ``choices``, at least one (else exit 2)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not set(items) <= set(choices) or len(set(items)) != len(items):
        parser.error(f"{flag}: expected distinct values among {choices}")
    return items


def parse_args(
    argv: list[str] | None, description: str
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the checked arguments of ``argv`` (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=description)
    _add_run_flags(parser)
    _add_output_flags(parser)
    _add_side_flags(parser)
    args = parser.parse_args(argv)
    _check(parser, args)
    return parser, args


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the run as a whole: size, threads, data sets, the DataLoader's settings."""
    parser.add_argument(
        "--quick", action="store_true", help="tiny smoke run (20 steps, first --threads, < 60 s)"
    )
    parser.add_argument(
        "--threads",
        default="default",
        help="torch thread counts to try on each side, comma-separated; 'default' (the "
        "default): torch's own on each side, as the README's train.py runs (the launcher "
        "gives a one-rank NN worker every core), e.g. default,1",
    )
    parser.add_argument(
        "--criteo-rows",
        type=int,
        default=200_000,
        help="training rows of the Criteo-shaped set (0 skips it; default 200,000)",
    )
    parser.add_argument(
        "--datasets",
        default="census,criteo",
        help="which data sets to run, in this order (default census,criteo; the RESULT line "
        "reports the first)",
    )
    parser.add_argument(
        "--staleness",
        type=int,
        default=8,
        help="embedding_staleness of the tuned rows (--settings tuned; default 8)",
    )
    parser.add_argument(
        "--settings",
        default="defaults",
        help="train.py's DataLoader, one or more of defaults,tuned: defaults (the default) is "
        "the README's DataLoader(StreamingDataset(buffer_size=10)), no options; tuned adds "
        "embedding_staleness=--staleness, reproducible=True and a 16-batch buffer (sides "
        "*_tuned)",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of what a run keeps and compares: logs, profile, mixed precision, fused
    Adam, repeats."""
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep the data, configs and every process's log here (default: a temp dir)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile train.py's training loop into --log-dir/train-<threads>.prof",
    )
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="Pyrsia with mixed_precision=True (bf16 autocast on CPU); the fp32 baseline stays "
        "the yardstick, a bf16-autocast baseline is reported beside it",
    )
    parser.add_argument(
        "--fused-adam",
        action="store_true",
        help="Pyrsia's dense model stepped by Adam(fused=True); the default-Adam baseline stays "
        "the yardstick, a fused-Adam baseline is reported beside it",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run each side this many times (interleaved)"
    )


def _add_side_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that choose the sides: Pyrsia's ranks, priorities, batches, heap, modes,
    the TorchRec peer; and ``--json``."""
    parser.add_argument(
        "--nn-workers",
        default="1",
        help="NN-worker rank counts to run Pyrsia with, each with as many data loaders "
        "(default 1; e.g. 1,2: both in the same run; the first is the RESULT line's)",
    )
    parser.add_argument(
        "--cpu-priority",
        default="normal",
        help="the services' --cpu-priority (PS, embedding worker, data loaders), one or more of "
        "normal,background (default normal, as the Procfiles start them; "
        "normal,background runs both in the same run)",
    )
    parser.add_argument(
        "--rank-batch",
        default="whole",
        help="with several ranks, each rank's batch: whole (1,024 rows per rank, the dense lr "
        "scaled by the ranks; the default) or split (the global batch held at 1,024, each rank "
        "1,024 / ranks rows, the dense lr unscaled); whole,split runs both",
    )
    parser.add_argument(
        "--malloc-tuning",
        default="on",
        help="the NN worker's PERSIA_MALLOC_TUNING, one or more of on,off (default on, "
        "Pyrsia's default: freed heap memory kept for reuse; on,off runs both in the same run, "
        "in each of --modes)",
    )
    parser.add_argument(
        "--modes",
        default="services",
        help="how Pyrsia runs, one or more of services,embedded (default services: the PS, "
        "embedding worker, NN worker and data loader as processes; embedded: persia-launcher "
        "run --embedded, one process; services,embedded runs both, side pyrsia_embedded)",
    )
    parser.add_argument(
        "--peers",
        default="",
        help="single-process peers run in every round beside the baseline, comma-separated "
        f"among {','.join(PEERS)} (torchrec: TorchRec's fused CPU embeddings, "
        "benchmarks/torchrec_peer.py, installed by hand); each Pyrsia side is also reported "
        "against each peer as same-run pairs; a peer that is not installed is skipped with a "
        "line saying why",
    )
    parser.add_argument(
        "--torchrec",
        action="store_true",
        help="--peers torchrec, but exit 2 when TorchRec is not installed",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the JSON here (default bench_results/)"
    )


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Split the comma-separated flags into lists and check every value (else exit 2)."""
    args.threads_raw = [t.strip() for t in args.threads.split(",")]
    try:  # 0 stands for torch's default
        args.threads = [0 if t.strip() == "default" else int(t) for t in args.threads.split(",")]
        if len(set(args.threads)) != len(args.threads) or any(
            t < 1 for t, raw in zip(args.threads, args.threads_raw, strict=True) if raw != "default"
        ):
            raise ValueError
    except ValueError:
        parser.error(
            "--threads: expected distinct positive integers or 'default' separated by commas, "
            f"got {args.threads!r}"
        )
    args.settings = choice_list(parser, "--settings", args.settings, SETTINGS)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not args.datasets or not set(args.datasets) <= set(e2e_data.DATASETS):
        parser.error(f"--datasets: expected a comma-separated subset of {e2e_data.DATASETS}")
    try:
        args.nn_workers = [int(t) for t in args.nn_workers.split(",")]
        if (
            not args.nn_workers
            or min(args.nn_workers) < 1
            or len(set(args.nn_workers)) != len(args.nn_workers)
        ):
            raise ValueError
    except ValueError:
        parser.error(
            f"--nn-workers: expected distinct positive integers separated by commas, got {args.nn_workers!r}"
        )
    args.cpu_priority = choice_list(parser, "--cpu-priority", args.cpu_priority, CPU_PRIORITIES)
    args.rank_batch = choice_list(parser, "--rank-batch", args.rank_batch, RANK_BATCHES)
    args.malloc_tuning = choice_list(parser, "--malloc-tuning", args.malloc_tuning, ("on", "off"))
    args.modes = choice_list(parser, "--modes", args.modes, MODES)
    if "split" in args.rank_batch and (bad := [n for n in args.nn_workers if BATCH % n]):
        parser.error(f"--rank-batch split: the ranks must divide the batch {BATCH}, got {bad}")
    if args.criteo_rows < 0 or args.staleness < 1 or args.repeats < 1:
        parser.error("--criteo-rows: expected >= 0; --staleness, --repeats: expected >= 1")
    _check_peers(parser, args)


def _check_peers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.peers``: the peers that run (a missing one skipped, with a line saying why;
    with ``--torchrec`` a missing TorchRec exits 2); ``args.torchrec``: whether it runs."""
    requested = choice_list(parser, "--peers", args.peers, PEERS) if args.peers.strip() else []
    if args.torchrec:
        if (missing := torchrec_missing()) is not None:
            parser.error(f"--torchrec: {missing}")
        requested = list(dict.fromkeys([*requested, "torchrec"]))
    args.peers, skipped = resolve_peers(requested, {"torchrec": torchrec_missing})
    for line in skipped:
        print(line, flush=True)
    args.torchrec = "torchrec" in args.peers
