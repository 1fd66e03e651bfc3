"""What a Pyrsia service's aiohttp app knows about itself: readiness, drain, work in flight.

``make_app`` (``pyrsia.shared.http_server``) puts a :class:`ServiceState` under the app key
:data:`STATE` and the app's Prometheus registry (served on ``GET /metrics``) under
:data:`METRICS`; the middlewares (``pyrsia.shared.http_middleware``), the routes and
``serve`` read and update them. ``http_server`` imports both keys, so services import them
from there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import prometheus_client as prom
from aiohttp import web

from pyrsia.shared.constants import BODY_TIMEOUT_S, MAX_MESSAGE_BYTES
from pyrsia.shared.http_body import InflightBytes

_REFUSALS = ("too_large", "inflight_bytes")
"""Why a request was refused before its body was read (``ServiceState.refused``'s keys)."""
_ABORTS = ("disconnect", "timeout")
"""Why a body never arrived in full (``ServiceState.aborted``'s keys)."""


@dataclass
class ServiceState:
    """Readiness, drain state and in-flight accounting of one service."""

    name: str
    ready: bool = False
    reason: str = "starting"
    draining: bool = False
    inflight: int = 0
    max_body_bytes: int = MAX_MESSAGE_BYTES
    inflight_bytes: InflightBytes = field(default_factory=lambda: InflightBytes(MAX_MESSAGE_BYTES))
    """Request-body bytes held now, bounded (``PYRSIA_MAX_INFLIGHT_REQUEST_BYTES``)."""
    body_timeout_s: float = BODY_TIMEOUT_S
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_REFUSALS, 0))
    """Requests refused before their body was read, by reason (too_large, inflight_bytes)."""
    aborted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_ABORTS, 0))
    """Bodies that never arrived in full, by reason (disconnect, timeout)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    handlers: set[asyncio.Task] = field(default_factory=set)  # cancelled after the grace period
    scraped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set as each ``GET /metrics`` is answered (an NN worker's final scrape waits on it)."""
    details: dict[str, Any] = field(default_factory=dict)

    def set_ready(self) -> None:
        self.ready, self.reason = True, "ready"

    def set_not_ready(self, reason: str) -> None:
        self.ready, self.reason = False, reason


STATE = web.AppKey("pyrsia_state", ServiceState)
METRICS = web.AppKey("pyrsia_metrics", prom.CollectorRegistry)
