"""``persia-launcher embedding-worker``: run one embedding worker replica."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from pyrsia.services.embedding_worker.ps_client import PSClient
from pyrsia.services.embedding_worker.server import create_app
from pyrsia.services.embedding_worker.warm import warm_worker
from pyrsia.shared.cli import (
    ServerOptions,
    add_config_flags,
    add_replica_flags,
    fail,
    global_config_from_flags,
    resolve_file,
)
from pyrsia.shared.config import EmbeddingSchema, GlobalConfig, JobType, load_embedding_config
from pyrsia.shared.constants import (
    DEFAULT_EMBEDDING_WORKER_PORT,
    DEFAULT_WAIT_TIMEOUT_S,
    ENV_EMBEDDING_CONFIG,
    ROLE_EMBEDDING_WORKER,
)
from pyrsia.shared.cpu_priority import (
    add_cpu_priority_flag,
    resolve_cpu_priority,
)
from pyrsia.shared.errors import ConfigError, RegistryError, UsageError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.metrics_push import install_metrics_push
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.service_runner import run, run_service, start_process
from pyrsia.shared.settings import Settings, current  # current: this is an entry point
from pyrsia.shared.warming import warm_in_background

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher embedding-worker",
        description="Run one embedding worker replica: it buffers the id features data loaders "
        "send, looks their embeddings up on the PS replicas, pools them per slot, and turns "
        "the NN workers' gradients into per-id updates.",
    )
    add_config_flags(parser)
    add_cpu_priority_flag(parser)
    add_replica_flags(parser, port_default=DEFAULT_EMBEDDING_WORKER_PORT)
    parser.add_argument(
        "--ps-wait-timeout",
        type=float,
        default=DEFAULT_WAIT_TIMEOUT_S,
        help=f"seconds to wait for every PS replica to register (default {DEFAULT_WAIT_TIMEOUT_S:g})",
    )
    return parser


@dataclass(frozen=True)
class WorkerOptions:
    """The embedding worker's flags and environment, resolved and checked once by
    :func:`main`."""

    server: ServerOptions
    cpu_priority: str
    schema: EmbeddingSchema
    config: GlobalConfig
    ps_wait_timeout_s: float

    @classmethod
    def from_flags(cls, args: argparse.Namespace, settings: Settings) -> WorkerOptions:
        """The options of ``args`` over ``settings``; UsageError or ConfigError says which
        flag, variable or file is wrong."""
        server = ServerOptions.from_replica_flags(args, settings)
        settings = server.settings
        emb_path = resolve_file(
            args.embedding_config,
            "--embedding-config",
            ENV_EMBEDDING_CONFIG,
            required=True,
            settings=settings,
        )
        return cls(
            server,
            resolve_cpu_priority(args.cpu_priority, settings),
            load_embedding_config(emb_path, strict=args.strict_config, settings=settings),  # type: ignore[arg-type]
            global_config_from_flags(args.global_config, args.strict_config, settings),
            args.ps_wait_timeout,
        )


def main(argv: list[str] | None = None) -> int:
    try:
        options = WorkerOptions.from_flags(build_parser().parse_args(argv), current())
    except (UsageError, ConfigError) as exc:
        return fail(str(exc))
    args, settings, config = options.server, options.server.settings, options.config
    schema = options.schema
    try:
        metrics_push = start_process(
            ROLE_EMBEDDING_WORKER,
            args.replica_index,
            options.cpu_priority,
            config.common_config.metrics_config,
            settings,
        )
    except ConfigError as exc:
        return fail(str(exc))

    common = config.common_config
    fixed = common.infer_config.servers if common.job_type == JobType.Infer else ()

    async def serve() -> None:
        # Inference with infer_config.servers: PS replicas at fixed addresses, no Redis at all.
        registry = None if fixed else Registry(RegistrySettings.from_env(settings))
        app = create_app(
            index=args.replica_index,
            schema=schema,
            config=config.embedding_worker_config,
            ps=PSClient(registry, HttpClient(auth_token=args.auth_token), addresses=fixed),
            ps_wait_timeout_s=options.ps_wait_timeout_s,
            max_request_bytes=args.max_request_bytes,
            settings=settings,
        )
        install_metrics_push(
            app, metrics_push, role=ROLE_EMBEDDING_WORKER, replica_index=args.replica_index
        )
        await run_service(
            app,
            settings=settings,
            role=ROLE_EMBEDDING_WORKER,
            replica_index=args.replica_index,
            replica_size=args.replica_size,
            host=args.host,
            port=args.port,
            registry=registry,
            use_registry=registry is not None,
        )

    warm_in_background(warm_worker, "embedding worker")  # before the first batch needs them
    try:
        run(serve, settings)
    except RegistryError as exc:
        return fail(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
