"""The environment variables Pyrsia reads, with their meanings.

The ``ENV_*`` constants of ``pyrsia/shared/constants/env_names.py`` are read with ``ast`` (names and
docstrings); :data:`ENV_MEANINGS` says more where a docstring is not enough, and
:data:`OTHER_ENV` lists the variables set by launchers and other tools. ``docs/gen_reference.py``
renders them as ``reference/environment.md``; ``tests/test_docs.py`` checks that every
variable has a meaning.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ENV_MEANINGS", "OTHER_ENV", "env_constants"]

CONSTANTS = (
    Path(__file__).resolve().parent.parent / "pyrsia" / "shared" / "constants" / "env_names.py"
)
"""The module whose ``ENV_*`` constants name every variable."""


# Variables named in pyrsia/shared/constants/env_names.py whose meaning needs more than the constant's own
# docstring (or that have none). Every ENV_* constant needs one or the other.
ENV_MEANINGS: dict[str, str] = {
    "PERSIA_REDIS_URL": "the registry's Redis (default `redis://127.0.0.1:6379/0`); put "
    "Redis's password in it",
    "PERSIA_JOB_ID": "namespaces every registry key (default `default`), so two jobs can "
    "share one Redis",
    "PERSIA_EMBEDDING_CONFIG": "`embedding_config.yml` when `--embedding-config` is not given",
    "PERSIA_GLOBAL_CONFIG": "`global_config.yml` when `--global-config` is not given "
    "(built-in defaults when neither is set)",
    "PERSIA_NN_WORKER_ENTRY": "the `train.py` of `persia-launcher nn-worker` when no script "
    "is given",
    "PERSIA_DATALOADER_ENTRY": "the `data_loader.py` of `persia-launcher data-loader` when no "
    "script is given",
    "PERSIA_ADVERTISE_HOST": "the name or address other processes dial to reach this one "
    "(the Kubernetes manifests set the pod IP)",
    "LOG_LEVEL": "DEBUG, INFO, WARNING or ERROR (default INFO): the services' level and the "
    "default of `get_default_logger` and of the `persia` logger",
    "PERSIA_MALLOC_TUNING": "`1` (default) or `0`: `0` leaves the NN worker's and the "
    "services' malloc at glibc's defaults; why they are changed: `pyrsia/shared/allocator.py`. "
    "A bad value stops a service at start with exit 2",
    "PERSIA_BIND_HOST": "address servers bind when `--host` is not given (default "
    "`127.0.0.1`; the image, `docker-compose.yml` and the Kubernetes manifests set `0.0.0.0`)",
    "PYRSIA_MAX_MESSAGE_BYTES": "largest request body a server accepts (413 beyond) when "
    "`--max-request-bytes` is not given; default 1 GiB",
    "PYRSIA_BODY_TIMEOUT_S": "longest gap in a request body, and the grace before the "
    "minimum body rate applies (default 30 s)",
    "PYRSIA_HEADER_TIMEOUT_S": "longest a connection may take to send a request line and "
    "headers, from its first byte or its accept, before it is closed (default 10 s)",
    "PYRSIA_IDLE_TIMEOUT_S": "longest a keep-alive connection may sit idle between requests "
    "before it is closed (default 75 s)",
    "PYRSIA_MAX_CONNECTIONS": "client connections one service holds at once (default half its "
    "file-descriptor limit, at most 4096); beyond it the longest-idle one is closed, or 503",
}

OTHER_ENV: list[tuple[str, str]] = [
    (
        "EMBEDDING_WORKER_SERVICE",
        "comma-separated `host:port` of embedding workers, used "
        "instead of the registry (PERSIA's variable; `persia.service`, `persia-launcher serve`)",
    ),
    (
        "REPLICA_INDEX, REPLICA_SIZE",
        "set by `persia-launcher data-loader`; read by "
        "`persia.env.get_replica_index()` / `get_replica_size()` (default 0 / 1)",
    ),
    (
        "RANK, LOCAL_RANK, WORLD_SIZE",
        "set by torch's launcher for each NN-worker rank; `RANK` "
        "alone says whether a process is an NN worker ([Coming from PERSIA]"
        "(../guides/persia-migration.md#behaviours-kept))",
    ),
    (
        "EPL_<CATEGORY>_<ATTRIBUTE>",
        "every EPL key ([configuration reference](config.md#epl-keys-persiaeplconfig))",
    ),
    (
        "HB_<NAME>",
        "HybridBackend options ([configuration reference](config.md"
        "#hybridbackend-options-hbcontextoptions))",
    ),
]


def env_constants() -> list[tuple[str, str]]:
    """(variable, docstring) for every ``ENV_*`` constant of ``pyrsia/shared/constants/env_names.py``."""
    import ast

    tree = ast.parse(CONSTANTS.read_text())
    body = tree.body
    found = []
    for i, node in enumerate(body):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or not target.id.startswith("ENV_"):
            continue
        values = ast.literal_eval(node.value)
        doc = ""
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
            doc = " ".join(str(nxt.value.value).split())
        for name in (values,) if isinstance(values, str) else values:
            found.append((name, doc))
    return found
