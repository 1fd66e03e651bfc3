"""Addresses of the embedding workers, for scripts that talk to them directly (``InferCtx``).

``get_embedding_worker_services()`` returns ``host:port`` strings, in this order:

1. ``EMBEDDING_WORKER_SERVICE`` (comma-separated) when it is set, as in PERSIA;
2. the embedding workers registered for this job in the Redis registry
   (``PERSIA_REDIS_URL``, default ``redis://127.0.0.1:6379/0``), when some are;
3. PERSIA's default, ``embedding_worker:8887`` (the service name its docker compose and
   Kubernetes files give the embedding worker), with a log line saying so.
"""

from __future__ import annotations

import logging

from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER
from pyrsia.shared.errors import PersiaError
from pyrsia.shared.settings import Settings, current

__all__ = ["get_embedding_worker_services"]

ENV_EMBEDDING_WORKER_SERVICE = "EMBEDDING_WORKER_SERVICE"
DEFAULT_EMBEDDING_WORKER_SERVICE = "embedding_worker:8887"
"""PERSIA's default: its containers name the embedding worker ``embedding_worker``; 8887 is its port."""

_logger = logging.getLogger(__name__)


def _registered(settings: Settings) -> list[str]:
    from pyrsia.shared.registry import Registry, RegistrySettings
    from pyrsia.shared.runtime import get_runtime

    async def discover() -> list[str]:
        registry = Registry(RegistrySettings.from_env(settings))
        try:
            found = await registry.discover(ROLE_EMBEDDING_WORKER)
        finally:
            await registry.close()
        return [found[i].address for i in sorted(found)]

    return get_runtime(settings).run(discover())


def get_embedding_worker_services() -> list[str]:
    """``host:port`` of every embedding worker (environment, then the registry, then PERSIA's default)."""
    settings = current()  # PERSIA's API: this process's settings, read when asked
    raw = settings.text(ENV_EMBEDDING_WORKER_SERVICE).strip()
    if raw:
        return [part.strip() for part in raw.split(",") if part.strip()]
    try:
        addresses = _registered(settings)
    except (PersiaError, OSError) as exc:
        _logger.info("registry not readable (%s)", exc)
        addresses = []
    if addresses:
        return addresses
    _logger.info(
        "no %s and no embedding worker registered: using PERSIA's default %s",
        ENV_EMBEDDING_WORKER_SERVICE,
        DEFAULT_EMBEDDING_WORKER_SERVICE,
    )
    return [DEFAULT_EMBEDDING_WORKER_SERVICE]
