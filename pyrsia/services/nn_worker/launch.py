"""``persia-launcher nn-worker train.py``: run the training script on N ranks per node.

The ranks are started by torch's own launcher (``torch.distributed.run``, the code
behind ``torchrun``), which sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` for each
process, watches the processes and reaps them. Without ``--nproc-per-node`` there is
one rank per visible GPU (``CUDA_VISIBLE_DEVICES``, else ``NVIDIA_VISIBLE_DEVICES``;
see :mod:`pyrsia.services.nn_worker.devices`) and one rank on a CPU-only machine. The script path falls back to
``$PERSIA_NN_WORKER_ENTRY``; a missing script is one line on stderr and exit code 2.
The exit code is the script's (the first failing rank's).

Every socket the job listens on follows the bind rule (README Security): torch's rendezvous
store listens on ``--master-addr`` only (:mod:`pyrsia.services.nn_worker.rendezvous`; torch's own
static rendezvous binds every interface), and on one node whose servers bind loopback the
ranks get ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` = the loopback interface and
``PERSIA_ADVERTISE_HOST`` = the bind host, so gloo's sockets and rank 0's DDP store stay on
loopback too (:func:`loopback_rank_env`). A job on several nodes listens on the network, so
it needs ``PERSIA_AUTH_TOKEN`` or ``--insecure``; neither guards torch's own sockets, which
have no authentication.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping

from pyrsia.services.nn_worker.rank_flags import RankOptions, add_rank_flags, torchrun_args
from pyrsia.shared.auth import auth_token_from_env, check_bind, insecure_from_env, is_loopback
from pyrsia.shared.cli import ENV_FLAGS, add_server_security_flags, fail, flag_settings
from pyrsia.shared.constants import (
    ENV_ADVERTISE_HOST,
    ENV_AUTH_TOKEN,
    ENV_INSECURE,
    ENV_MAX_MESSAGE_BYTES,
    ENV_NN_WORKER_ENTRY,
    ENV_RANK_AGENT_PID,
    ENV_RESUME,
    ENV_VERBOSE,
    ROLE_NN_WORKER_NODE,
)
from pyrsia.shared.errors import ConfigError, UsageError
from pyrsia.shared.process_env import export, export_default
from pyrsia.shared.registry_settings import RegistrySettings
from pyrsia.shared.settings import Settings, current
from pyrsia.shared.slot_keeper import take_job_slot

log = logging.getLogger(__name__)

LOOPBACK_INTERFACE = "lo"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher nn-worker",
        usage="persia-launcher nn-worker [train.py] [flags] [-- script arguments]",
        description="Run the training script (train.py) on --nproc-per-node ranks of this node "
        "through torch.distributed.run; each rank hosts a batch ingress for the data loaders.",
    )
    parser.add_argument(
        "script",
        nargs="?",
        default=None,
        help=f"the training script (default: ${ENV_NN_WORKER_ENTRY})",
    )
    add_rank_flags(parser)
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"a known error (bad config, Redis unreachable, a service never "
        f"registered) shows its traceback too, not one line (also "
        f"{ENV_VERBOSE}=1 or LOG_LEVEL=debug)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="start from the newest complete checkpoint in checkpoint_dir "
        "(global_config.yml common_config.checkpointing_config)",
    )
    add_server_security_flags(parser)  # for the ranks' batch ingress
    return parser


def _check_security(
    ranks: RankOptions, insecure_flag: bool | None, cap_flag: int | None, settings: Settings
) -> dict[str, str]:
    """Check the ingress bind rule once here; the variables that hand ``--insecure`` and
    ``--max-request-bytes`` to the ranks (``settings``: the launcher's, with its flags)."""
    try:
        insecure = insecure_from_env(settings) if insecure_flag is None else insecure_flag
        token = auth_token_from_env(settings)
        host = settings.bind_host
        check_bind(host, token=token, insecure=insecure)
        if ranks.node_rank == 0:  # node 0's agent hosts torch's rendezvous store
            check_bind(ranks.master_addr, token=token, insecure=insecure)
        if ranks.nnodes > 1 and ranks.node_rank == 0 and is_loopback(ranks.master_addr):
            raise ConfigError(
                f"--master-addr {ranks.master_addr} resolves to a loopback address on node 0 "
                f"({', '.join(_addresses(ranks.master_addr))}), so the rendezvous store would "
                f"listen where the other {ranks.nnodes - 1} node(s) cannot reach it and they "
                "would wait with no error; pass node 0's network address, or fix the name "
                "in /etc/hosts (Debian writes '127.0.1.1 <hostname>' there)"
            )
        if ranks.nnodes > 1 and token is None and not insecure:
            raise ConfigError(
                f"--nnodes {ranks.nnodes}: the ranks of several nodes reach each other over the "
                f"network (torch's rendezvous store, gloo/NCCL), which the bind rule allows only "
                f"with {ENV_AUTH_TOKEN} set or --insecure ({ENV_INSECURE}=1); torch's own "
                "sockets have no authentication either way, so use a network you trust"
            )
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    handed: dict[str, str] = {}
    if insecure_flag:
        handed[ENV_INSECURE] = "1"
    if cap_flag is not None:
        if cap_flag <= 0:
            raise UsageError(
                f"--max-request-bytes must be a positive number of bytes, got {cap_flag}"
            )
        handed[ENV_MAX_MESSAGE_BYTES] = str(cap_flag)
    return handed


def _addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to here (for messages)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host.strip("[]"), None)})
    except OSError:
        return [host]


def _script(flag: str | None, settings: Settings) -> str:
    """The training script: the argument, else ``$PERSIA_NN_WORKER_ENTRY``; it must exist."""
    script = flag or settings.text(ENV_NN_WORKER_ENTRY)
    if not script:
        raise UsageError(f"no training script given: pass train.py or set ${ENV_NN_WORKER_ENTRY}")
    if not os.path.isfile(script):
        source = "the script argument" if flag else f"${ENV_NN_WORKER_ENTRY}"
        raise UsageError(f"{script}: no such file (set by {source})")
    return script


def rank_environment(
    flags: Mapping[str, str], handed: Mapping[str, str], *, resume: bool, verbose: bool
) -> dict[str, str]:
    """What the ranks read from their environment, exported before torch's agent starts
    them: the limit flags (``flags``), ``--insecure`` and the cap (``handed``), ``--resume``
    (TrainCtx) and ``--verbose`` (:mod:`pyrsia.services.nn_worker.rank_entry`)."""
    return {
        **flags,
        **handed,
        **({ENV_RESUME: "1"} if resume else {}),
        **({ENV_VERBOSE: "1"} if verbose else {}),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    after = argv.index("--") if "--" in argv else len(argv)
    args, unknown = build_parser().parse_known_args(argv[:after])
    script_args = unknown + argv[after + 1 :]
    settings = flag_settings(args, current())  # an entry point: its flags over the environment
    try:
        script = _script(args.script, settings)
        ranks = RankOptions.from_flags(args, settings)
        handed = _check_security(ranks, args.insecure, args.max_request_bytes, settings)
    except UsageError as exc:
        return fail(str(exc))
    flags = getattr(args, ENV_FLAGS, None) or {}
    export(rank_environment(flags, handed, resume=args.resume, verbose=args.verbose))
    registry = RegistrySettings.from_env(settings)
    try:
        keeper = take_job_slot(ROLE_NN_WORKER_NODE, ranks.node_rank, ranks.nnodes, registry)
    except UsageError as exc:
        return fail(str(exc))
    # each rank runs pyrsia.services.nn_worker.rank_entry: the script as __main__, its registry
    # waits shown, a known error one line (exit 2) unless --verbose
    command = [sys.executable, "-u", "-m", "pyrsia.services.nn_worker.rank_entry", script]
    try:
        return run_ranks(
            torchrun_args(ranks, [*command, *script_args], no_python=True),
            settings,
            before_exit=keeper.stop if keeper else None,
        )
    finally:
        ignore_stop_signals()
        if keeper is not None:
            keeper.stop()


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGINT from here on: the ranks have ended and the launcher is only
    giving back its job slot (bounded by the slot keeper's join timeout) before it exits with
    the ranks' code. torch's agent leaves a handler that raises, so a stop sent now (``run``
    stops every process when one fails) printed a second traceback under the rank's error."""
    if threading.current_thread() is threading.main_thread():  # signal.signal's rule
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def loopback_rank_env(nnodes: int, store_host: str, settings: Settings) -> dict[str, str]:
    """Variables that keep a one-node job's rank sockets on loopback (empty otherwise).

    When the job is on one node and both the servers' bind host and torch's store host are
    loopback addresses: gloo and NCCL bind the loopback interface (else they bind the
    address the machine's host name resolves to), and ``PERSIA_ADVERTISE_HOST`` is the bind
    host, which rank 0 publishes as its DDP store address and so binds that store to.
    Variables the user set (in ``settings``, the launcher's) are kept.
    """
    bind_host = settings.bind_host
    if nnodes != 1 or not is_loopback(bind_host) or not is_loopback(store_host):
        return {}
    env = {ENV_ADVERTISE_HOST: bind_host}
    loopback_if = next(
        (name for _, name in socket.if_nameindex() if name == LOOPBACK_INTERFACE), None
    )
    if loopback_if is not None:
        env.update(GLOO_SOCKET_IFNAME=loopback_if, NCCL_SOCKET_IFNAME=loopback_if)
    return {k: v for k, v in env.items() if not settings.is_set(k)}


class _KnownErrorExit(logging.Filter):
    """Drops torch's "failed (exitcode: 1|2)" record: the rank has said why in one line
    (``pyrsia/shared/failure_report.py``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "(exitcode: 2)" not in message and "(exitcode: 1)" not in message


def _quiet_known_error_exits() -> None:
    logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    if not any(isinstance(f, _KnownErrorExit) for f in logger.filters):
        logger.addFilter(_KnownErrorExit())


def rank_threads(nproc_per_node: str | int) -> int:
    """Torch threads of each rank when ``OMP_NUM_THREADS`` is unset: this process's usable
    cores shared by the node's ranks, at least 1 (1 for a non-numeric ``--nproc-per-node``).

    A one-rank job gets torch's own default, every core, as the README's ``train.py`` run
    by hand would: a fixed 1 per rank left the one rank of a 2-core node a single thread,
    half the dense step's speed (docs/concepts/staleness.md, "Defaults").
    """
    try:
        ranks = int(nproc_per_node)
    except (TypeError, ValueError):
        return 1
    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks))


def run_ranks(
    torchrun_argv: list[str],
    settings: Settings,
    *,
    before_exit: Callable[[], None] | None = None,
) -> int:
    """Run torch.distributed.run with these arguments; the first failing rank's exit code.

    ``settings``: the launcher's (its variables decide :func:`loopback_rank_env`).
    ``before_exit`` runs before a SIGTERM/SIGINT ends the process without unwinding.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    from torch.distributed.run import parse_args, run

    from pyrsia.services.nn_worker.rendezvous import register_rendezvous

    register_rendezvous()
    parsed = parse_args(torchrun_argv)
    # torchrun would set 1 (with a warning) for several ranks and leave one rank alone
    export_default("OMP_NUM_THREADS", str(rank_threads(parsed.nproc_per_node)))
    store_host, _ = parse_rendezvous_endpoint(parsed.rdzv_endpoint or "", -1)
    nnodes = int(str(parsed.nnodes).split(":")[-1])
    export(loopback_rank_env(nnodes, store_host or parsed.master_addr, settings))
    _quiet_known_error_exits()
    export({ENV_RANK_AGENT_PID: str(os.getpid())})  # torch's agent runs in this process
    try:
        run(parsed)
    except SignalException as exc:
        # SIGTERM/SIGINT: torch's agent forwarded it to the ranks (TrainCtx drains their
        # in-flight gradients and exits) and waited for them; a stop asked for is a clean exit
        log.warning("nn-worker stopped by %s; ranks shut down", exc.sigval.name)
        from pyrsia.shared.process_exit import exit_now

        if before_exit is not None:
            before_exit()
        exit_now(0)  # no interpreter finalization: seconds with torch loaded
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        code = failure.exitcode
        if code < 0:  # killed by a signal: the shell's convention
            code = 128 + (-code if -code in signal.valid_signals() else 1)
        return code or 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
