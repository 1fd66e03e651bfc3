"""``persia-launcher embedding-parameter-server``: run one embedding PS replica."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyrsia.services.embedding_ps.capacity import internal_shards
from pyrsia.services.embedding_ps.checkpoint import read_manifests
from pyrsia.services.embedding_ps.checkpoint_root import checkpoint_roots
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.incremental import IncrementalLoader
from pyrsia.services.embedding_ps.packets import IncrementalWriter
from pyrsia.services.embedding_ps.parallel import MAX_THREADS, resolve_threads
from pyrsia.services.embedding_ps.server import create_app
from pyrsia.services.embedding_ps.warm import warm_ps
from pyrsia.shared.cli import (
    ServerOptions,
    add_config_flags,
    add_replica_flags,
    fail,
    global_config_from_flags,
    resolve_file,
)
from pyrsia.shared.config import EmbeddingParameterServerConfig, GlobalConfig, JobType
from pyrsia.shared.constants import (
    DEFAULT_PS_PORT,
    ENV_CHECKPOINT_ROOT,
    ENV_EMBEDDING_CONFIG,
    ENV_PS_THREADS,
    ROLE_EMBEDDING_PS,
)
from pyrsia.shared.cpu_priority import (
    add_cpu_priority_flag,
    resolve_cpu_priority,
)
from pyrsia.shared.errors import (
    ConfigError,
    InvalidInputError,
    PersiaError,
    RegistryError,
    UsageError,
)
from pyrsia.shared.metrics_push import install_metrics_push
from pyrsia.shared.service_runner import run, run_service, start_process
from pyrsia.shared.settings import Settings, current  # current: this is an entry point
from pyrsia.shared.warming import warm_in_background

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher embedding-parameter-server",
        description="Run one embedding parameter server replica: it stores a shard of the "
        "embedding tables and applies the embedding optimizer.",
    )
    add_config_flags(parser)
    add_cpu_priority_flag(parser)
    add_replica_flags(parser, port_default=DEFAULT_PS_PORT)
    parser.add_argument(
        "--checkpoint-root",
        default=None,
        metavar="DIR",
        help=f"refuse /dump and /load paths outside DIR (symlinks and .. resolved; '/' allows "
        f"any path); default ${ENV_CHECKPOINT_ROOT}, else the PS's working directory and "
        "checkpointing_config.checkpoint_dir",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help=f"threads that work a batch's internal shards at once, 1 to {MAX_THREADS} "
        f"(default ${ENV_PS_THREADS}, else the cores this process may run on, at most "
        f"{MAX_THREADS}); the store has at least this many shards",
    )
    return parser


def _check_infer_address(servers: tuple[str, ...], args: ServerOptions) -> str | None:
    """With ``infer_config.servers`` (no registry), replica i must listen where servers[i] says."""
    if len(servers) != args.replica_size:
        return (
            f"infer_config.servers lists {len(servers)} PS address(es) but --replica-size is "
            f"{args.replica_size}: list one host:port per replica"
        )
    _, _, port = servers[args.replica_index].rpartition(":")
    if not port.strip().isdigit() or int(port) != args.port:
        return (
            f"infer_config.servers[{args.replica_index}] is {servers[args.replica_index]!r} but "
            f"--port is {args.port}: replica {args.replica_index} must listen on that port"
        )
    return None


@dataclass(frozen=True)
class PSOptions:
    """The PS's flags and environment, resolved and checked once by :func:`main`."""

    server: ServerOptions
    cpu_priority: str
    config: GlobalConfig
    roots: tuple[Path, ...]
    threads: int

    @classmethod
    def from_flags(cls, args: argparse.Namespace, settings: Settings) -> PSOptions:
        """The options of ``args`` over ``settings``; UsageError or ConfigError says which
        flag, variable or file is wrong."""
        server = ServerOptions.from_replica_flags(args, settings)
        settings = server.settings
        cpu_priority = resolve_cpu_priority(args.cpu_priority, settings)
        threads = ps_threads(args.threads, settings)
        # The embedding config is accepted for PERSIA compatibility; the PS needs none of it.
        resolve_file(
            args.embedding_config,
            "--embedding-config",
            ENV_EMBEDDING_CONFIG,
            required=False,
            settings=settings,
        )
        config = global_config_from_flags(args.global_config, args.strict_config, settings)
        roots = checkpoint_roots(
            args.checkpoint_root, settings, config.common_config.checkpointing_config.checkpoint_dir
        )
        return cls(server, cpu_priority, config, roots, threads)


def ps_threads(flag: int | None, settings: Settings) -> int:
    """The PS's thread count: ``--threads``, else ``$PYRSIA_PS_THREADS`` of ``settings``,
    else ``parallel.default_threads()``; a bad value is a
    UsageError (the flag) or a ConfigError (the variable) naming it."""
    try:
        if flag is not None:
            return resolve_threads(flag, "--threads")
        value = settings.positive(ENV_PS_THREADS, int, " (threads)")
        return resolve_threads(value, ENV_PS_THREADS)
    except InvalidInputError as exc:
        if flag is not None:
            raise UsageError(str(exc)) from None
        raise ConfigError(str(exc)) from None


def make_store(ps: EmbeddingParameterServerConfig, threads: int) -> EmbeddingStore:
    """An empty store of ``ps.capacity`` worked by ``threads`` threads, with the internal
    shards :func:`internal_shards` chooses from ``num_hashmap_internal_shards``."""
    shards = internal_shards(ps.num_hashmap_internal_shards, threads, ps.capacity)
    key = ps.num_hashmap_internal_shards
    log.info(
        "store: %d internal shards (num_hashmap_internal_shards %s), %d threads",
        shards,
        "unset: one per thread" if key is None else f"= {key}",
        threads,
    )
    return EmbeddingStore(capacity=ps.capacity, num_shards=shards, threads=threads)


def _load_infer_checkpoint(
    store: EmbeddingStore, checkpoint: str, args: ServerOptions, workers: int
) -> int:
    """Load ``infer_config.embedding_checkpoint`` into ``store``; returns the earliest start
    (unix ms) of its parts, the packets the loader applies on top being those newer. A
    checkpoint that cannot be loaded is a ConfigError naming the key."""
    try:
        loaded = store.load(checkpoint, args.replica_index, args.replica_size, workers)
    except PersiaError as exc:
        raise ConfigError(f"infer_config.embedding_checkpoint {checkpoint}: {exc}") from exc
    since_ms = min(
        m.get("started_unix_ms", m["created_unix_ms"]) for m in read_manifests(checkpoint)
    )
    log.info("inference: loaded %d entries from %s", loaded, checkpoint)
    return since_ms


def _incremental(
    store: EmbeddingStore,
    ps: EmbeddingParameterServerConfig,
    args: ServerOptions,
    infer: bool,
    since_ms: int,
) -> IncrementalLoader | None:
    """With ``enable_incremental_update``: an Infer replica's loader of packets (returned), or
    a Train replica's writer of them (set on ``store``). A writer directory that cannot be
    created is a ConfigError naming ``incremental_dir``."""
    if ps.enable_incremental_update and infer:
        loader = IncrementalLoader(
            store, ps.incremental_dir, args.replica_index, args.replica_size, since_unix_ms=since_ms
        )
        log.info(
            "incremental updates: applying packets from %s every %ds",
            ps.incremental_dir,
            ps.incremental_scan_interval_seconds,
        )
        return loader
    if ps.enable_incremental_update:
        replica_dir = Path(ps.incremental_dir) / f"replica_{args.replica_index}"
        try:
            store.incremental = IncrementalWriter(replica_dir, ps.incremental_buffer_size)
        except OSError as exc:
            raise ConfigError(f"incremental_dir {replica_dir}: cannot be created: {exc}") from exc
        log.info(
            "incremental updates: packets of %d ids under %s",
            ps.incremental_buffer_size,
            replica_dir,
        )
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        options = PSOptions.from_flags(build_parser().parse_args(argv), current())
    except (UsageError, ConfigError) as exc:
        return fail(str(exc))
    args, config, settings = options.server, options.config, options.server.settings
    infer = config.common_config.job_type == JobType.Infer
    servers = config.common_config.infer_config.servers
    if infer and servers:
        problem = _check_infer_address(servers, args)
        if problem:
            return fail(problem)
    try:
        metrics_push = start_process(
            ROLE_EMBEDDING_PS,
            args.replica_index,
            options.cpu_priority,
            config.common_config.metrics_config,
            settings,
        )
    except ConfigError as exc:
        return fail(str(exc))
    ps = config.embedding_parameter_server_config
    store = make_store(ps, options.threads)
    workers = config.common_config.checkpointing_config.num_workers  # dump/load threads
    log.info(
        "checkpoint roots %s: /dump and /load paths outside them are refused",
        ", ".join(map(str, options.roots)),
    )
    infer_checkpoint = config.common_config.infer_config.embedding_checkpoint
    try:
        since_ms = 0
        if infer and infer_checkpoint:
            since_ms = _load_infer_checkpoint(store, infer_checkpoint, args, workers)
        loader = _incremental(store, ps, args, infer, since_ms)
    except ConfigError as exc:
        return fail(str(exc))
    app = create_app(
        store,
        replica_index=args.replica_index,
        replica_size=args.replica_size,
        ready_without_configure=infer,
        incremental_loader=loader,
        scan_interval_s=float(ps.incremental_scan_interval_seconds),
        max_request_bytes=args.max_request_bytes,
        checkpoint_workers=workers,
        checkpoint_root=options.roots,
        settings=settings,
    )
    install_metrics_push(
        app, metrics_push, role=ROLE_EMBEDDING_PS, replica_index=args.replica_index
    )
    warm_in_background(warm_ps, "PS")  # kernels loaded before the first update needs them
    return _serve(app, args, use_registry=not (infer and servers))


def _serve(app: web.Application, args: ServerOptions, *, use_registry: bool) -> int:
    """Run ``app`` until it is stopped (registered in Redis unless ``use_registry`` is False);
    0, or the usage exit code when the registry refuses or cannot be reached."""
    try:
        run(
            lambda: run_service(
                app,
                settings=args.settings,
                role=ROLE_EMBEDDING_PS,
                replica_index=args.replica_index,
                replica_size=args.replica_size,
                host=args.host,
                port=args.port,
                use_registry=use_registry,
            ),
            args.settings,
        )
    except RegistryError as exc:
        return fail(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
