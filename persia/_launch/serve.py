"""``persia-launcher serve``: answer predictions of an exported model over HTTP.

::

    persia-launcher serve --model <export dir> [--embedding-config F] [--global-config F]
        [--port 8080] [--embedding-worker host:port ...]

Embeddings come from embedding workers: those named by ``--embedding-worker`` (or
``EMBEDDING_WORKER_SERVICE``), else one this command starts for itself with the given
embedding and global config (default: the copies in the export directory). The workers read
PS replicas started with ``job_type: Infer``: at ``infer_config.servers`` (no Redis needed),
else found in the registry. README "Serving" has the whole recipe.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from persia.service import ENV_EMBEDDING_WORKER_SERVICE
from persia.serving.artifact import ServingModel, load_model
from persia.serving.private_worker import PrivateWorker
from persia.serving.server import create_app
from pyrsia.shared.cli import (
    ENV_FLAGS,
    ServerOptions,
    add_server_security_flags,
    add_unknown_keys_flags,
    fail,
    resolve_file,
)
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.constants import (
    DEFAULT_WAIT_TIMEOUT_S,
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
    MAX_BATCH_SIZE,
    SERVE_MAX_INFLIGHT,
    SERVE_THREADS,
)
from pyrsia.shared.errors import ConfigError, InvalidInputError, UsageError
from pyrsia.shared.http_server import serve
from pyrsia.shared.logging_setup import configure_logging
from pyrsia.shared.process_env import export
from pyrsia.shared.service_runner import run
from pyrsia.shared.settings import Settings, current

log = logging.getLogger(__name__)

DEFAULT_SERVE_PORT = 8080
"""TorchServe's inference port, which PERSIA's serving example used."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="persia-launcher serve",
        description="Serve an exported model (persia.serving.export_model): batch predictions over HTTP, msgpack or JSON.",
    )
    _add_model_flags(p)
    _add_server_flags(p)
    add_server_security_flags(p)  # --insecure, --max-request-bytes: the services' bind rule and cap
    return p


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """What is served: the export, its configs and the embedding workers it reads from."""
    p.add_argument(
        "--model",
        required=True,
        help="the export directory (signature.json, dense.pt2|dense.ts, embedding/)",
    )
    p.add_argument(
        "--embedding-config",
        default=None,
        help=f"embedding_config.yml; must match the model's (default: ${ENV_EMBEDDING_CONFIG}, else the model's copy)",
    )
    p.add_argument(
        "--global-config",
        default=None,
        help=f"global_config.yml for the private embedding worker, usually job_type: Infer with infer_config.servers (default: ${ENV_GLOBAL_CONFIG}, else the model's copy)",
    )
    add_unknown_keys_flags(p)  # --allow-unknown-config-keys, --strict-config (the default)
    p.add_argument(
        "--embedding-worker",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help=f"an embedding worker to use (repeatable; default ${ENV_EMBEDDING_WORKER_SERVICE}, else start one)",
    )


def _add_server_flags(p: argparse.ArgumentParser) -> None:
    """Where and how much it serves: the address, batch and concurrency bounds."""
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_SERVE_PORT,
        help=f"port to listen on, 0 picks a free one (default {DEFAULT_SERVE_PORT})",
    )
    p.add_argument(
        "--host",
        default=None,
        help="address to bind (default $PERSIA_BIND_HOST or 127.0.0.1)",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=MAX_BATCH_SIZE,
        help=f"largest batch a request may carry (default {MAX_BATCH_SIZE})",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=SERVE_MAX_INFLIGHT,
        help=f"predictions running at once; more get 429 (default {SERVE_MAX_INFLIGHT})",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=SERVE_THREADS,
        help=f"threads running the dense model (default {SERVE_THREADS})",
    )
    p.add_argument(
        "--wait-timeout",
        type=float,
        default=DEFAULT_WAIT_TIMEOUT_S,
        help=f"seconds to wait for the embedding workers (default {DEFAULT_WAIT_TIMEOUT_S:g})",
    )


def _check_numbers(port: int, counts: dict[str, int], wait_timeout: float) -> None:
    """``--port``, the ``counts`` (flag: value, each at least 1) and ``--wait-timeout``."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {port}")
    for flag, value in counts.items():
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not wait_timeout > 0:
        raise UsageError(f"--wait-timeout must be > 0, got {wait_timeout}")


def _config_files(
    emb_flag: str | None,
    glob_flag: str | None,
    strict: bool | None,
    model: ServingModel,
    settings: Settings,
) -> tuple[Path, Path]:
    """The embedding and global config files (the flags, their variables, else the model's
    own), loaded and checked: the embedding config must be the one the model was exported
    with."""
    emb_path = (
        resolve_file(
            emb_flag, "--embedding-config", ENV_EMBEDDING_CONFIG, required=False, settings=settings
        )
        or model.embedding_config_path
    )
    if load_embedding_config(emb_path, strict=strict, settings=settings) != model.schema:
        raise UsageError(
            f"{emb_path}: not the embedding config the model at {model.path} was exported with (slots, dims or pooling differ)"
        )
    glob_path = (
        resolve_file(
            glob_flag, "--global-config", ENV_GLOBAL_CONFIG, required=False, settings=settings
        )
        or model.global_config_path
    )
    load_global_config(glob_path, strict=strict, settings=settings)
    return Path(emb_path), Path(glob_path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        counts = {"--max-batch-size": args.max_batch_size, "--max-inflight": args.max_inflight}
        _check_numbers(args.port, {**counts, "--threads": args.threads}, args.wait_timeout)
        # a non-loopback --host needs PERSIA_AUTH_TOKEN (then every route answers 401 without
        # it) or --insecure, as for the PS and the embedding worker
        server = ServerOptions.from_flags(args, current())  # an entry point
        settings = server.settings
        model = load_model(args.model)
        emb_path, glob_path = _config_files(
            args.embedding_config, args.global_config, args.strict_config, model, settings
        )
        workers = args.embedding_worker or [
            a.strip() for a in settings.text(ENV_EMBEDDING_WORKER_SERVICE).split(",") if a.strip()
        ]
    except (UsageError, ConfigError, InvalidInputError) as exc:
        return fail(str(exc))
    configure_logging("serve", 0, settings.log_level)
    if not workers:  # the private embedding worker started below inherits the limit flags
        export(getattr(args, ENV_FLAGS, None) or {})
    private = None if workers else PrivateWorker(emb_path, glob_path)
    try:
        app = create_app(
            model,
            workers or [private.address],
            max_batch=args.max_batch_size,
            max_inflight=args.max_inflight,
            threads=args.threads,
            wait_timeout_s=args.wait_timeout,
            max_request_bytes=server.max_request_bytes,
            settings=settings,
        )
    except InvalidInputError as exc:
        return fail(str(exc))
    if private is not None:
        private.install(app)
    run(lambda: serve(app, server.host, args.port), settings)  # exits the process after the drain
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
