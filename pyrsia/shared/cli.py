"""Command-line flags the services share, with their environment fallbacks.

A missing file or unreachable Redis must end a service with one clear line naming
the path or URL and the flag or variable that set it, and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from pyrsia.shared.auth import auth_token_from_env, check_bind, insecure_from_env
from pyrsia.shared.config import GlobalConfig, default_global_config, load_global_config
from pyrsia.shared.constants import (
    DEFAULT_BIND_HOST,
    ENV_ALLOW_UNKNOWN_CONFIG_KEYS,
    ENV_AUTH_TOKEN,
    ENV_BIND_HOST,
    ENV_BODY_TIMEOUT_S,
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
    ENV_HEADER_TIMEOUT_S,
    ENV_IDLE_TIMEOUT_S,
    ENV_INSECURE,
    ENV_MAX_CONNECTIONS,
    ENV_MAX_INFLIGHT_REQUEST_BYTES,
    ENV_MAX_MESSAGE_BYTES,
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS_CAP,
)
from pyrsia.shared.errors import ConfigError, UsageError
from pyrsia.shared.failure_report import report
from pyrsia.shared.http_body import body_timeout_s, max_inflight_request_bytes
from pyrsia.shared.http_connections import ConnectionLimits
from pyrsia.shared.http_server import max_message_bytes
from pyrsia.shared.redaction import redact
from pyrsia.shared.settings import Settings

EXIT_USAGE = 2


def add_config_flags(parser: argparse.ArgumentParser, *, embedding: bool = True) -> None:
    if embedding:
        parser.add_argument(
            "--embedding-config",
            default=None,
            help=f"embedding_config.yml: slots, dims, pooling (default: ${ENV_EMBEDDING_CONFIG})",
        )
    parser.add_argument(
        "--global-config",
        default=None,
        help=f"global_config.yml: capacities, buffers, job type (default: ${ENV_GLOBAL_CONFIG}; "
        "built-in defaults when neither is set)",
    )
    add_unknown_keys_flags(parser)


def add_unknown_keys_flags(parser: argparse.ArgumentParser) -> None:
    """``--allow-unknown-config-keys`` / ``--strict-config``: ``args.strict_config`` is False,
    True, or None (then ``$PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS`` decides; unset: errors)."""
    parser.add_argument(
        "--allow-unknown-config-keys",
        dest="strict_config",
        action="store_false",
        default=None,
        help="a key of the config files this version does not know is a warning and ignored "
        f"(a file written for a newer version); default ${ENV_ALLOW_UNKNOWN_CONFIG_KEYS}, else "
        "an error naming the closest known key",
    )
    parser.add_argument(
        "--strict-config",
        dest="strict_config",
        action="store_true",
        default=None,
        help="unknown keys in the config files are errors (the default; overrides "
        f"${ENV_ALLOW_UNKNOWN_CONFIG_KEYS})",
    )


def add_replica_flags(parser: argparse.ArgumentParser, *, port_default: int = 0) -> None:
    parser.add_argument(
        "--replica-index", type=int, default=0, help="this replica's index, 0-based (default 0)"
    )
    parser.add_argument(
        "--replica-size", type=int, default=1, help="number of replicas of this service (default 1)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=port_default,
        help=f"port to listen on; 0 picks a free one (default {port_default})",
    )
    parser.add_argument(
        "--host",
        default=None,
        help="address to bind (default $PERSIA_BIND_HOST or 127.0.0.1; 0.0.0.0 in containers)",
    )
    add_server_security_flags(parser)


ENV_FLAGS = "environment_flags"
"""The namespace attribute where :class:`_ToEnvironment` collects ``{variable: value}``."""


class _ToEnvironment(argparse.Action):
    """Store a positive number and note it under ``env`` in ``args.environment_flags``: the
    entry point lays those over its settings (:func:`flag_settings`), so the flag wins over
    the variable wherever the settings go (``make_app``), and a launcher exports them to the
    child processes it starts (NN-worker ranks)."""

    def __init__(self, *args, env: str, **kwargs):
        self.env = env
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if not values > 0:  # type: ignore[operator]
            parser.error(f"{option_string} must be positive, got {values}")
        setattr(namespace, self.dest, values)
        flags = dict(getattr(namespace, ENV_FLAGS, None) or {})
        flags[self.env] = str(values)
        setattr(namespace, ENV_FLAGS, flags)


def flag_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """``settings`` with the values of the flags that stand for variables set over them."""
    return settings.with_values(getattr(args, ENV_FLAGS, None) or {})


def add_server_security_flags(parser: argparse.ArgumentParser) -> None:
    """``--insecure``, ``--max-request-bytes``, ``--max-inflight-request-bytes`` and
    ``--body-timeout-s``: the flags every server takes."""
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help=f"allow listening on a non-loopback address without ${ENV_AUTH_TOKEN} "
        f"(default ${ENV_INSECURE}, else off)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=None,
        help=f"largest request body accepted, larger ones get 413 "
        f"(default ${ENV_MAX_MESSAGE_BYTES}, else 1 GiB)",
    )
    parser.add_argument(
        "--max-inflight-request-bytes",
        type=int,
        default=None,
        action=_ToEnvironment,
        env=ENV_MAX_INFLIGHT_REQUEST_BYTES,
        help=f"request-body bytes held at once; a body that does not fit waits up to 1 s, then "
        f"gets 503 + Retry-After (default ${ENV_MAX_INFLIGHT_REQUEST_BYTES}, else twice "
        "--max-request-bytes, at most 1/8 of memory, never under --max-request-bytes)",
    )
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=None,
        action=_ToEnvironment,
        env=ENV_BODY_TIMEOUT_S,
        help=f"a request body with a gap this long, or under 1 MiB/s after this long, is "
        f"dropped and its client disconnected (default ${ENV_BODY_TIMEOUT_S}, else 30)",
    )
    _add_connection_flags(parser)


def _add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """``--header-timeout-s``, ``--idle-timeout-s``, ``--max-connections``
    (``pyrsia.shared.http_connections``)."""
    parser.add_argument(
        "--header-timeout-s",
        type=float,
        default=None,
        action=_ToEnvironment,
        env=ENV_HEADER_TIMEOUT_S,
        help=f"a connection that has not sent a whole request line and headers this long after "
        f"its first byte (or its accept) is closed (default ${ENV_HEADER_TIMEOUT_S}, else "
        f"{HEADER_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=None,
        action=_ToEnvironment,
        env=ENV_IDLE_TIMEOUT_S,
        help=f"a keep-alive connection idle this long between requests is closed "
        f"(default ${ENV_IDLE_TIMEOUT_S}, else {IDLE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        action=_ToEnvironment,
        env=ENV_MAX_CONNECTIONS,
        help=f"client connections held at once; beyond it the longest-idle one is closed, or "
        f"the new one gets 503 when all are busy (default ${ENV_MAX_CONNECTIONS}, else half "
        f"the file-descriptor limit, at most {MAX_CONNECTIONS_CAP})",
    )


@dataclass(frozen=True)
class ServerOptions:
    """A server's flags resolved against its settings, checked once at its entry point.

    ``settings`` is the process's, with the flags that stand for variables laid over them
    (:func:`flag_settings`): what the code below the entry point reads its limits from.
    """

    settings: Settings
    host: str
    auth_token: str | None
    insecure: bool
    max_request_bytes: int
    replica_index: int = 0
    replica_size: int = 1
    port: int = 0

    @classmethod
    def from_flags(cls, args: argparse.Namespace, settings: Settings) -> ServerOptions:
        """``--host``, ``--insecure`` and ``--max-request-bytes`` (else their variables) and
        the limit flags, checked: a non-loopback ``--host`` without a token is refused."""
        settings = flag_settings(args, settings)
        host = (
            args.host if args.host is not None else settings.text(ENV_BIND_HOST, DEFAULT_BIND_HOST)
        )
        try:
            token = auth_token_from_env(settings)
            insecure = insecure_from_env(settings) if args.insecure is None else args.insecure
            cap = args.max_request_bytes
            if cap is None:
                cap = max_message_bytes(settings)
            check_bind(host, token=token, insecure=insecure)
        except ConfigError as exc:
            raise UsageError(str(exc)) from exc
        if cap <= 0:
            raise UsageError(f"--max-request-bytes must be a positive number of bytes, got {cap}")
        try:  # checked here, so that a bad value is one line and exit 2, not a traceback
            max_inflight_request_bytes(cap, settings)
            body_timeout_s(settings)
            ConnectionLimits.from_env(settings)
        except ConfigError as exc:
            raise UsageError(
                f"{exc} (--max-inflight-request-bytes, --body-timeout-s, --header-timeout-s, "
                "--idle-timeout-s, --max-connections)"
            ) from exc
        return cls(settings, host, token, bool(insecure), cap)

    @classmethod
    def from_replica_flags(cls, args: argparse.Namespace, settings: Settings) -> ServerOptions:
        """:meth:`from_flags` plus ``--replica-index``, ``--replica-size`` and ``--port``."""
        if args.replica_size < 1:
            raise UsageError(f"--replica-size must be >= 1, got {args.replica_size}")
        if not 0 <= args.replica_index < args.replica_size:
            raise UsageError(
                f"--replica-index must be in [0, {args.replica_size - 1}] for --replica-size "
                f"{args.replica_size}, got {args.replica_index}"
            )
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port must be in [0, 65535], got {args.port}")
        server = cls.from_flags(args, settings)
        return replace(
            server, replica_index=args.replica_index, replica_size=args.replica_size, port=args.port
        )


def resolve_file(
    flag_value: str | None, flag: str, env: str, *, required: bool, settings: Settings
) -> Path | None:
    """The file named by ``flag`` or else ``$env`` (of ``settings``);
    a missing file is a UsageError naming both."""
    if flag_value:
        path, source = Path(flag_value), flag
    elif settings.is_set(env):
        path, source = Path(settings.text(env)), f"${env}"
    elif required:
        raise UsageError(f"no file given: pass {flag} or set ${env}")
    else:
        return None
    if not path.is_file():
        raise UsageError(f"{path}: no such file (set by {source})")
    return path


def global_config_from_flags(
    flag_value: str | None, strict: bool | None, settings: Settings
) -> GlobalConfig:
    """``--global-config`` or ``$PERSIA_GLOBAL_CONFIG`` of ``settings`` loaded (``strict``:
    ``--strict-config`` / ``--allow-unknown-config-keys``, None when neither was given), else
    the built-in defaults."""
    path = resolve_file(
        flag_value, "--global-config", ENV_GLOBAL_CONFIG, required=False, settings=settings
    )
    if path is None:
        return default_global_config()
    return load_global_config(path, strict=strict, settings=settings)


def fail(message: str) -> int:
    """Print one line to stderr (secrets as ``***``) and return the usage exit code."""
    print(f"error: {redact(message)}", file=sys.stderr)
    return EXIT_USAGE


def verbose(settings: Settings) -> bool:
    """``$PERSIA_VERBOSE`` is 1 (``--verbose``) or ``LOG_LEVEL`` is debug: show tracebacks."""
    return settings.verbose


def fail_known(exc: BaseException, settings: Settings) -> int:
    """End a process on ``exc``: one line naming this process (``error: nn_worker/0: ...``),
    the traceback in its log file, and on stderr too when it is the user script's own
    exception or when :func:`verbose`; the exit code (2 for a known error, else 1).
    ``settings``: the process's, from its entry point. See ``pyrsia/shared/failure_report.py``."""
    return report(exc, settings, show_traceback=verbose(settings))
