"""``persia-launcher data-loader``: run the user's data_loader.py as one replica.

The script runs in this process (``runpy``), with ``REPLICA_INDEX`` and
``REPLICA_SIZE`` set so that ``persia.env`` and ``DataCtx`` know which replica this
is. Its exit code is the process's; the process ends without interpreter finalization
(its ``atexit`` handlers run) unless the script left threads running. The loader holds its
slot ``data_loader/<replica index>`` of the job lease while it runs (pyrsia/shared/job_lease.py):
a second job's loader with the same ``PERSIA_JOB_ID`` and index refuses to start.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import runpy
import signal
import sys
import threading
from collections.abc import Callable

from pyrsia.shared.cli import fail, fail_known, resolve_file
from pyrsia.shared.constants import (
    ENV_DATALOADER_ENTRY,
    ENV_PROCESS,
    ENV_RESUME,
    ENV_VERBOSE,
    ROLE_DATA_LOADER,
)
from pyrsia.shared.cpu_priority import (
    add_cpu_priority_flag,
    apply_cpu_priority,
    resolve_cpu_priority,
)
from pyrsia.shared.errors import UsageError
from pyrsia.shared.logging_setup import configure_logging
from pyrsia.shared.process_env import export
from pyrsia.shared.process_exit import exit_now
from pyrsia.shared.registry_settings import RegistrySettings
from pyrsia.shared.settings import Settings, current
from pyrsia.shared.slot_keeper import SlotKeeper, take_job_slot


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher data-loader",
        description="Run data_loader.py as one data-loader replica; it sends PersiaBatches with DataCtx.",
    )
    parser.add_argument(
        "script",
        nargs="?",
        default=None,
        help=f"the data loader script (default: ${ENV_DATALOADER_ENTRY})",
    )
    parser.add_argument(
        "--replica-index", type=int, default=0, help="this replica's index, 0-based (default 0)"
    )
    parser.add_argument(
        "--replica-size", type=int, default=1, help="number of data-loader replicas (default 1)"
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="exit as soon as the script finishes; by default the loader stays up until the job's "
        "NN workers have left the registry (or SIGTERM), so that under honcho the NN worker is "
        "the first process to exit",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="skip the batches already trained into the newest complete checkpoint in "
        "checkpoint_dir (global_config.yml common_config.checkpointing_config)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"a known error (bad config, Redis unreachable, a service never registered) shows "
        f"its traceback too, not one line (also {ENV_VERBOSE}=1 or LOG_LEVEL=debug)",
    )
    add_cpu_priority_flag(parser)
    parser.epilog = (
        "Flags this command does not know go to the script, wherever they stand; everything "
        "after `--` goes to the script as is."
    )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The launcher's flags wherever they stand, as PERSIA's click command read them
    (``data-loader data_loader.py --replica-index 1 --replica-size 2``); the flags it
    does not know, and everything after ``--``, are the script's (``script_args``)."""
    after = argv.index("--") if "--" in argv else len(argv)
    args, unknown = build_parser().parse_known_args(argv[:after])
    args.script_args = unknown + argv[after + 1 :]
    return args


def main(argv: list[str] | None = None, *, env_changed: Callable[[], None] | None = None) -> int:
    """Run one data-loader replica; its exit code.

    ``env_changed`` is called once ``REPLICA_INDEX``/``REPLICA_SIZE`` are set, before the
    script runs (``persia-launcher`` passes ``persia.env.reload_env``: the facade may have
    read the environment already in this process).
    """
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.replica_size < 1 or not 0 <= args.replica_index < args.replica_size:
            raise UsageError(
                f"--replica-index must be in [0, --replica-size) and --replica-size >= 1, "
                f"got {args.replica_index} and {args.replica_size}"
            )
        settings = current()
        script = resolve_file(
            args.script,
            "the script argument",
            ENV_DATALOADER_ENTRY,
            required=True,
            settings=settings,
        )
        cpu_priority = resolve_cpu_priority(args.cpu_priority, settings)
    except UsageError as exc:
        return fail(str(exc))
    # what the script run here (DataCtx, persia.env) and its children read
    handed = {
        "REPLICA_INDEX": str(args.replica_index),
        "REPLICA_SIZE": str(args.replica_size),
        ENV_PROCESS: f"data_loader/{args.replica_index}",
        **({ENV_RESUME: "1"} if args.resume else {}),
        **({ENV_VERBOSE: "1"} if args.verbose else {}),
    }
    export(handed)
    settings = settings.with_values(handed)  # this launcher's own, passed down
    if env_changed is not None:
        env_changed()
    configure_logging("data_loader", args.replica_index, settings.log_level)
    global _KEEPER
    try:
        registry = RegistrySettings.from_env(settings)
        _KEEPER = take_job_slot(ROLE_DATA_LOADER, args.replica_index, args.replica_size, registry)
    except UsageError as exc:
        return fail(str(exc))
    apply_cpu_priority(cpu_priority)
    sys.argv = [str(script), *args.script_args]
    sys.path.insert(0, str(script.parent.resolve()))
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        code = _run_script(script, settings)
        if code == 0 and not args.exit_when_done:
            _wait_for_job_end(registry)
    except SystemExit:
        if _TERMINATED:
            _leave_after_sigterm()
        raise
    _leave_when_done(code)
    _give_back_slot()
    return code  # the script left threads running: plain Python's exit waits for them


_KEEPER: SlotKeeper | None = None
"""This loader's slot in the job lease, held while the script runs (and lingers)."""


def _give_back_slot() -> None:
    global _KEEPER
    if _KEEPER is not None:
        _KEEPER.stop()
        _KEEPER = None


def _leave_when_done(code: int) -> None:
    """End the process with ``code`` once the script is done, skipping interpreter finalization.

    A loader usually finishes while the NN workers still train on the batches it sent, and
    finalizing an interpreter that has loaded torch costs ~0.65 s of CPU (the final garbage
    collection, torch's operator-library teardown), taken from the training on a small
    machine. The script's ``atexit`` handlers still run and the streams are flushed. If the
    script left non-daemon threads running, this returns and the interpreter waits for them
    as usual.
    """
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    # No garbage collection from here on: a collection pass (any allocation may start one)
    # would finalize the script's objects, as the skipped finalization would have.
    gc.disable()
    atexit._run_exitfuncs()  # what finalization would run first (logging's shutdown among them)
    _give_back_slot()
    exit_now(code)


def _run_script(script, settings: Settings) -> int:
    """Run data_loader.py as ``__main__``; its exit code (a SIGTERM propagates)."""
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Exception as exc:  # one line naming this loader (SystemExit passes)
        return fail_known(exc, settings)
    except SystemExit as exc:
        if _TERMINATED:
            raise
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


_TERMINATED = False


def _exit_cleanly(signum: int, frame: object) -> None:
    """SIGTERM: unwind the script (DataCtx stops its sends, leaves the registry), exit 0."""
    global _TERMINATED
    _TERMINATED = True
    raise SystemExit(0)


def _leave_after_sigterm() -> None:
    """Exit 0 now: the script has unwound; skip interpreter finalization (seconds with torch
    loaded), so that the whole SIGTERM to exit stays well inside 5 s."""
    from pyrsia.shared.process_exit import exit_now

    logging.getLogger(__name__).info("SIGTERM: data loader stopped")
    _give_back_slot()
    exit_now(0)


def _wait_for_job_end(settings: RegistrySettings) -> None:
    """Idle until the job's NN workers have deregistered (training is over), then linger
    briefly; ``settings``: the job's registry."""
    import asyncio
    import time

    from pyrsia.shared.constants import (
        DATA_LOADER_LINGER_S,
        DISCOVERY_POLL_INTERVAL_S,
        ROLE_NN_WORKER,
    )
    from pyrsia.shared.errors import RegistryError
    from pyrsia.shared.registry import Registry

    async def wait() -> None:
        registry = Registry(settings)
        try:
            while await registry.discover(ROLE_NN_WORKER):
                await asyncio.sleep(DISCOVERY_POLL_INTERVAL_S * 10)
        except RegistryError:
            pass
        finally:
            await registry.close()

    logging.getLogger(__name__).info("data loader finished; waiting for the NN workers to finish")
    asyncio.run(wait())
    time.sleep(DATA_LOADER_LINGER_S)


if __name__ == "__main__":
    raise SystemExit(main())
