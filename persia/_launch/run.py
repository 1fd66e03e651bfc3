"""``persia-launcher run``: a whole job on this machine from one command.

::

    persia-launcher run --nn-worker train.py --data-loader data_loader.py \\
        --embedding-config embedding_config.yml --global-config global_config.yml

starts, as children of this process::

    redis                       python -m pyrsia.shared.redis_local on a free port, restarted if it
                                crashes (only when PERSIA_REDIS_URL is unset)
    embedding_parameter_server  persia-launcher embedding-parameter-server --port 0
    embedding_worker            persia-launcher embedding-worker --port 0
    nn_worker                   persia-launcher nn-worker train.py (torch's rendezvous on a
                                free port)
    data_loader                 persia-launcher data-loader data_loader.py

Every server listens on a port the system picks and registers it, under a fresh job id
(``run-<8 hex digits>``) unless ``PERSIA_JOB_ID`` is set, so a second job on the same machine
runs beside the first. Each child's lines come out prefixed with its name; when standard output
is a terminal, one live line at the bottom shows the job's training steps, samples/s and loss
(read from the NN-worker ranks' ``/metrics``).

The job ends when the NN worker exits: the others get SIGTERM (loader and NN worker first, then
the servers, Redis last), drain and exit, and ``run`` exits with the NN worker's code. A child
that exits early (a bad config, a crash) stops the job, and its code is ``run``'s. A process
that ends on an error says why in one line and writes its traceback to ``<process>.log`` in
the job's log folder (``persia-<job id>-*`` in the system's temporary folder, given to the
children as ``PERSIA_LOG_DIR``); ``run``'s last line then names the process that failed
first, what was wrong and the log file (``pyrsia/shared/failure_report.py``), not the last
process to die. Ctrl-C or
SIGTERM stop every child the same way, and ``run`` exits 128 + the signal's number (130, 143).
The children die with ``run`` even when it is killed (``PR_SET_PDEATHSIG``).

With ``--embedded`` (or ``PERSIA_EMBEDDED=1``) the job is one process: ``train.py`` runs with
the embedding PS and worker engines inside it and ``data_loader.py`` in one of its threads
(pyrsia/services/embedded/job.py); no Redis, no servers, one NN-worker rank.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from persia._launch.children import Child, Job, StopSignals, free_port, start_redis, watch
from persia._launch.console import NAMES, Output, Progress
from pyrsia.services.embedded.mode import embedded_requested
from pyrsia.shared.cli import add_config_flags, fail, resolve_file
from pyrsia.shared.constants import CHILD_STOP_TIMEOUT_S as STOP_TIMEOUT_S
from pyrsia.shared.constants import (
    ENV_DATALOADER_ENTRY,
    ENV_EMBEDDED,
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
    ENV_JOB_ID,
    ENV_LOG_DIR,
    ENV_NN_WORKER_ENTRY,
    ENV_REDIS_URL,
    ENV_VERBOSE,
    FAILURE_LINES_JOIN_S,
)
from pyrsia.shared.errors import ConfigError, UsageError
from pyrsia.shared.failure_report import FailureRecord, first_failure
from pyrsia.shared.settings import Settings, current


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="persia-launcher run",
        description="Run a whole job on this machine: a local Redis (unless $PERSIA_REDIS_URL is "
        "set), one embedding PS, one embedding worker, the NN worker and the data loader, on "
        "free ports; stops them all when the NN worker exits and exits with its code.",
    )
    p.add_argument(
        "--nn-worker",
        default=None,
        metavar="TRAIN_PY",
        help=f"the training script (default: ${ENV_NN_WORKER_ENTRY})",
    )
    p.add_argument(
        "--data-loader",
        default=None,
        metavar="DATA_LOADER_PY",
        help=f"the data loader script (default: ${ENV_DATALOADER_ENTRY})",
    )
    add_config_flags(p)
    p.add_argument(
        "--embedded",
        action="store_true",
        default=None,
        help=f"one process: the embedding PS and worker engines and the data loader run inside the NN worker's process (no Redis, no servers; one rank); also ${ENV_EMBEDDED}=1",
    )
    p.add_argument("--nproc-per-node", type=int, default=1, help="NN-worker ranks (default 1)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the live progress line (default: on when standard output is a terminal)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="a known error (bad config, Redis unreachable, a service never registered) shows its traceback too, not one line",
    )
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=STOP_TIMEOUT_S,
        help=f"seconds a process gets to exit after SIGTERM before it is killed (default {STOP_TIMEOUT_S:.0f})",
    )
    return p


# --- the job --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """``run``'s flags resolved against its settings and checked once, in :func:`main`."""

    train: Path
    loader: Path
    emb: Path
    glob: Path | None
    strict: bool | None
    embedded: bool
    nproc_per_node: int
    verbose: bool
    stop_timeout: float
    progress: bool | None

    @classmethod
    def from_flags(cls, args: argparse.Namespace, settings: Settings) -> RunOptions:
        """The options of ``args`` over ``settings``; the config files are loaded once here,
        so a bad one is one line before anything starts."""
        train = resolve_file(
            args.nn_worker, "--nn-worker", ENV_NN_WORKER_ENTRY, required=True, settings=settings
        )
        loader = resolve_file(
            args.data_loader,
            "--data-loader",
            ENV_DATALOADER_ENTRY,
            required=True,
            settings=settings,
        )
        emb = resolve_file(
            args.embedding_config,
            "--embedding-config",
            ENV_EMBEDDING_CONFIG,
            required=True,
            settings=settings,
        )
        glob = resolve_file(
            args.global_config,
            "--global-config",
            ENV_GLOBAL_CONFIG,
            required=False,
            settings=settings,
        )
        if args.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
        embedded = bool(args.embedded) or embedded_requested(settings.environ)
        if embedded and args.nproc_per_node != 1:
            raise UsageError(
                f"--embedded runs one NN-worker rank in one process, not --nproc-per-node "
                f"{args.nproc_per_node}: drop --embedded (or unset ${ENV_EMBEDDED}) for several "
                "ranks"
            )
        if not args.stop_timeout > 0:
            raise UsageError(f"--stop-timeout must be > 0, got {args.stop_timeout}")
        from pyrsia.shared.config import load_embedding_config, load_global_config

        load_embedding_config(emb, strict=args.strict_config, settings=settings)
        if glob is not None:
            load_global_config(glob, strict=args.strict_config, settings=settings)
        return cls(
            train,  # type: ignore[arg-type]  # required=True: never None
            loader,  # type: ignore[arg-type]
            emb,  # type: ignore[arg-type]
            glob,
            args.strict_config,
            embedded,
            args.nproc_per_node,
            args.verbose,
            args.stop_timeout,
            args.progress,
        )


def _job_env(args: RunOptions, settings: Settings) -> dict[str, str]:
    """The children's environment: this process's (``settings``), plus the job id (a fresh ``run-<8 hex>``
    unless set), a free port for torch's rendezvous, ``--verbose`` and the configs' absolute
    paths (the children may run in another directory)."""
    env = dict(settings.environ)
    env.setdefault(ENV_JOB_ID, f"run-{uuid.uuid4().hex[:8]}")
    env.update(PYTHONUNBUFFERED="1", MASTER_PORT=str(free_port()))
    if args.verbose:
        env[ENV_VERBOSE] = "1"
    if not env.get(ENV_LOG_DIR):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in env[ENV_JOB_ID])
        env[ENV_LOG_DIR] = tempfile.mkdtemp(prefix=f"persia-{safe}-")
    env[ENV_EMBEDDING_CONFIG] = str(args.emb.resolve())
    if args.glob is not None:
        env[ENV_GLOBAL_CONFIG] = str(args.glob.resolve())
    return env


def _start_children(job: Job, args: RunOptions) -> Child:
    """Start the embedding PS, the embedding worker, the NN worker and the data loader, in
    that order, as ``persia-launcher`` subcommands; the NN worker's child, whose exit ends
    the job."""
    launcher = [sys.executable, "-m", "persia.launcher"]
    strict = {None: [], True: ["--strict-config"], False: ["--allow-unknown-config-keys"]}[
        args.strict
    ]
    for name, sub in (
        ("embedding_parameter_server", "embedding-parameter-server"),
        ("embedding_worker", "embedding-worker"),
    ):
        job.start(name, [*launcher, sub, "--port", "0", *strict])
    nn = job.start(
        "nn_worker",
        [*launcher, "nn-worker", str(args.train), "--nproc-per-node", str(args.nproc_per_node)],
    )
    job.start("data_loader", [*launcher, "data-loader", str(args.loader)])
    return nn


def main(argv: list[str] | None = None) -> int:
    settings = current()  # an entry point: `persia-launcher run`
    try:
        args = RunOptions.from_flags(build_parser().parse_args(argv), settings)
    except (UsageError, ConfigError) as exc:
        return fail(str(exc))
    tty = sys.stdout.isatty()
    out = Output(sys.stdout, live=tty if args.progress is None else args.progress, color=tty)
    env = _job_env(args, settings)
    job = Job(out, env)
    signals = StopSignals()
    started = time.monotonic()
    progress: Progress | None = None
    if args.embedded:
        return _run_embedded(args, job, env, signals, started, settings)
    try:
        if not env.get(ENV_REDIS_URL):
            env[ENV_REDIS_URL] = start_redis(job)
        out.line("run", f"job {env[ENV_JOB_ID]} on {_display(env[ENV_REDIS_URL])}")
        nn = _start_children(job, args)
        progress = Progress(out, started, Settings.from_env(env))
        progress.start()
        failed = watch(job, nn, signals.received)
    except UsageError as exc:
        job.stop(NAMES, args.stop_timeout)
        signals.restore()
        return fail(str(exc))
    if progress is not None:
        progress.stop()
    out.end_status()
    # the loader and the NN worker first, the servers next (they deregister), Redis last
    job.stop(("data_loader", "nn_worker"), args.stop_timeout)
    job.stop(("embedding_worker", "embedding_parameter_server"), args.stop_timeout)
    job.stop(("redis",), args.stop_timeout)
    signals.restore()  # a second Ctrl-C during the stop above changed nothing
    _tidy_log_dir(env, settings)
    took = time.monotonic() - started
    if signals.signum is not None:
        out.line("run", f"stopped by {signal.Signals(signals.signum).name} after {took:.0f}s")
        return 128 + signals.signum
    first = first_failure(Path(env[ENV_LOG_DIR]))
    if failed is not None:
        code = failed.proc.returncode
        out.line(
            "run",
            f"{failed.name} exited with code {code} before the NN worker finished: job stopped after {took:.0f}s",
        )
        return _blame(job, first, code if code and code > 0 else 1)
    code = nn.proc.returncode
    out.line("run", f"nn_worker exited with code {code} after {took:.0f}s; every process stopped")
    return _blame(job, first, code if code >= 0 else 128 - code) if code else 0


def _tidy_log_dir(env: dict[str, str], settings: Settings) -> None:
    """The log folder ``run`` made, removed when no process wrote to it (nothing failed);
    one the user set (in ``settings``) is left."""
    if settings.is_set(ENV_LOG_DIR):
        return  # the user's folder
    try:
        Path(env[ENV_LOG_DIR]).rmdir()
    except OSError:
        pass  # not empty: a process left its traceback there


def _blame(job: Job, first: FailureRecord | None, code: int) -> int:
    """The job failed: the last line names the process that failed first (its record in the
    log folder) and ``run`` exits with its code; without a record, ``code``."""
    if first is None:
        return code
    for child in job.children:  # every child's last lines out before this one
        child.reader.join(timeout=FAILURE_LINES_JOIN_S)
    sys.stdout.flush()
    print(first.line(), file=sys.stderr, flush=True)
    return first.code


def _run_embedded(
    args: RunOptions,
    job: Job,
    env: dict[str, str],
    signals: StopSignals,
    started: float,
    settings: Settings,
) -> int:
    """The whole job in one child: train.py as a rank (pyrsia.services.nn_worker.rank_entry),
    the engines and data_loader.py inside it; its exit code is ``run``'s."""
    env.update({ENV_EMBEDDED: "1", ENV_DATALOADER_ENTRY: str(args.loader.resolve())})
    job.out.line("run", f"job {env[ENV_JOB_ID]} embedded: one process, no Redis")
    nn = job.start(
        "nn_worker",
        [sys.executable, "-u", "-m", "pyrsia.services.nn_worker.rank_entry", str(args.train)],
    )
    watch(job, nn, signals.received)
    job.out.end_status()
    job.stop(("nn_worker",), args.stop_timeout)
    signals.restore()
    _tidy_log_dir(env, settings)
    took = time.monotonic() - started
    if signals.signum is not None:
        job.out.line("run", f"stopped by {signal.Signals(signals.signum).name} after {took:.0f}s")
        return 128 + signals.signum
    code = nn.proc.returncode
    job.out.line("run", f"nn_worker exited with code {code} after {took:.0f}s")
    return code if code >= 0 else 128 - code


def _display(url: str) -> str:
    from pyrsia.shared.redaction import redact_url

    return redact_url(url)


if __name__ == "__main__":
    raise SystemExit(main())
