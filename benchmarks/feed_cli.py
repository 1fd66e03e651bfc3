"""The command line of the feed-rate benchmark (``feed_rate.py``): its flags and their checks.

Kept apart from ``feed_rate.py`` (the runs) so each file has one job. :func:`parse_args`
returns the checked arguments, the comma-separated flags already split into lists (a bad
value exits 2 naming its flag).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from e2e import data as e2e_data

DENSE_MODES = ("sleep", "cpu", "cuda")


def int_list(parser: argparse.ArgumentParser, flag: str, value: str) -> list[int]:
    """``value`` split at commas: distinct positive integers (else exit 2 naming ``flag``)."""
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1 or len(set(items)) != len(items):
        parser.error(
            f"{flag}: expected distinct positive integers separated by commas, got {value!r}"
        )
    return items


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The checked arguments of ``argv`` (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=description)
    _add_job_flags(parser)
    _add_run_flags(parser)
    args = parser.parse_args(argv)
    _check(parser, args)
    return args


def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the job: dense step, batch sizes, data sets and their size, steps."""
    parser.add_argument(
        "--dense",
        default="sleep,cpu",
        help=f"dense steps to run, among {DENSE_MODES} (default sleep,cpu)",
    )
    parser.add_argument(
        "--dense-ms",
        type=float,
        default=2.0,
        help="the sleep dense step's milliseconds (default 2)",
    )
    parser.add_argument("--batches", default="1024,8192", help="batch sizes (default 1024,8192)")
    parser.add_argument(
        "--datasets",
        default="census,criteo",
        help="data sets, in this order (default census,criteo)",
    )
    parser.add_argument(
        "--criteo-rows",
        type=int,
        default=200_000,
        help="training rows of the Criteo-shaped set (default 200,000)",
    )
    parser.add_argument(
        "--max-train-rows",
        type=int,
        default=0,
        help="cut each training split to this many rows (0: all; smoke runs)",
    )
    parser.add_argument(
        "--min-steps",
        type=int,
        default=150,
        help="batches per run at least (the split is sent again as needed)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="batches per run exactly (0: --min-steps or one pass)",
    )


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the runs: threads, staleness, repeats, the reference tree, outputs."""
    parser.add_argument(
        "--threads", type=int, default=2, help="the NN worker's torch threads (default 2)"
    )
    parser.add_argument(
        "--baseline-threads", type=int, default=2, help="the baseline's torch threads (default 2)"
    )
    parser.add_argument("--staleness", type=int, default=8, help="embedding staleness bound")
    parser.add_argument(
        "--ps-replicas",
        default="1",
        help="PS shards to run, one configuration each (default 1; e.g. 1,2)",
    )
    parser.add_argument(
        "--ew-replicas",
        default="1",
        help="embedding workers to run, one configuration each with every --ps-replicas "
        "(default 1; e.g. 1,2)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each configuration (interleaved; default 1)"
    )
    parser.add_argument(
        "--services-ref",
        default=None,
        help="also run the PS and the embedding worker of this commit "
        "(git archive), interleaved with the working tree's, and compare "
        "their CPU per batch",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep data, configs and logs here (default: a temp dir)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the JSON here (default bench_results/)"
    )
    parser.add_argument(
        "--png", type=Path, default=None, help="write the PNG here (default: beside the JSON, .png)"
    )


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Split the comma-separated flags into lists and check every value (else exit 2)."""
    args.dense = [d.strip() for d in args.dense.split(",") if d.strip()]
    if (
        not args.dense
        or not set(args.dense) <= set(DENSE_MODES)
        or len(set(args.dense)) != len(args.dense)
    ):
        parser.error(f"--dense: expected distinct values among {DENSE_MODES}, got {args.dense}")
    if "cuda" in args.dense and not torch.cuda.is_available():
        parser.error("--dense cuda: this torch sees no CUDA device")
    args.batches = int_list(parser, "--batches", args.batches)
    args.ps_replicas = int_list(parser, "--ps-replicas", args.ps_replicas)
    args.ew_replicas = int_list(parser, "--ew-replicas", args.ew_replicas)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not args.datasets or not set(args.datasets) <= set(e2e_data.DATASETS):
        parser.error(f"--datasets: expected a comma-separated subset of {e2e_data.DATASETS}")
    for flag in ("criteo_rows", "min_steps", "threads", "baseline_threads", "staleness", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: expected a positive integer")
    if args.max_steps < 0 or args.max_train_rows < 0 or not args.dense_ms >= 0:
        parser.error("--max-steps, --max-train-rows, --dense-ms: expected >= 0")
    if args.max_steps and args.max_steps < 4:
        parser.error("--max-steps: expected 0 or >= 4 (the steady window needs a few steps)")
