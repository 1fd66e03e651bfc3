"""The HTTP embedding transport: the embedding workers' routes over HTTP + msgpack.

The embedding workers are found either through the Redis registry (training and evaluation
jobs) or from a fixed ``host:port`` list (``InferCtx``, which needs no registry). A call
encodes the request's wire form, posts it through the process's one :class:`HttpClient`
(retried only where the route says a retry is safe) and checks the answer into the route's
reply type; the protocol is PROTOCOL.md. It implements
:class:`~pyrsia.shared.embedding_transport.EmbeddingTransport`.
"""

from __future__ import annotations

import asyncio
import time

from pyrsia.shared.constants import (
    DEFAULT_WAIT_TIMEOUT_S,
    HEALTH_CHECK_TIMEOUT_S,
    HEALTH_POLL_S,
    ROLE_EMBEDDING_WORKER,
)
from pyrsia.shared.embedding_transport import ROUTES, Rep, Req, Route
from pyrsia.shared.errors import InvalidInputError, ServiceUnavailableError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry


def normalize_address(address: str) -> str:
    """``"host:port"`` or ``"http://host:port"`` -> ``"http://host:port"``; spaces are dropped
    (PERSIA's documentation writes ``"localhost: 8888"``)."""
    if not isinstance(address, str) or not address.strip():
        raise InvalidInputError("embedding_worker_address", "a 'host:port' string", address)
    text = address.replace(" ", "").rstrip("/")
    if not text.startswith(("http://", "https://")):
        text = "http://" + text
    host_port = text.split("://", 1)[1]
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInputError("embedding_worker_address", "a 'host:port' string", address)
    return text.rstrip("/")


class HttpEmbeddingTransport:
    """The embedding workers over HTTP, found in the registry or at fixed addresses.

    Use from coroutines running on the NN-worker runtime's loop.
    """

    routes = frozenset(route.path for route in ROUTES)
    carries_gradients = True
    """A training ``/lookup`` carries the gradients kept for its worker: one HTTP request
    and answer fewer per batch (``pyrsia.services.nn_worker.carry``)."""

    def __init__(
        self,
        http: HttpClient,
        *,
        registry: Registry | None = None,
        addresses: list[str] | None = None,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    ):
        if (registry is None) == (addresses is None):
            raise InvalidInputError(
                "registry/addresses",
                "exactly one of them",
                message="EmbeddingWorkerClient needs exactly one of registry or addresses",
            )
        self.http = http
        self.registry = registry
        self.wait_timeout_s = wait_timeout_s
        self._urls: list[str] = [normalize_address(a) for a in addresses] if addresses else []
        if addresses is not None and not self._urls:
            raise InvalidInputError("embedding_worker_address_list", "at least one address", [])

    # --- discovery ----------------------------------------------------------------------
    @property
    def addresses(self) -> list[str]:
        return list(self._urls)

    async def connect(self) -> list[str]:
        """Wait until the embedding workers are known (registry: every registered replica)."""
        if self.registry is not None:
            records = await self.registry.wait_for(
                ROLE_EMBEDDING_WORKER, timeout_s=self.wait_timeout_s
            )
            self._urls = [r.url for r in records]
        return list(self._urls)

    async def refresh(self) -> None:
        """Re-read the addresses from the registry (a worker restarted on another port)."""
        if self.registry is not None:
            found = await self.registry.discover(ROLE_EMBEDDING_WORKER)
            if found:
                self._urls = [found[i].url for i in sorted(found)]

    async def address(self, worker: int) -> str:
        """Address of embedding worker ``worker`` (re-resolved once when unknown)."""
        if not self._urls:
            await self.connect()
        if not 0 <= worker < len(self._urls):
            await self.refresh()
        if not 0 <= worker < len(self._urls):
            raise InvalidInputError(
                "worker", f"an embedding worker index in [0, {len(self._urls)})", worker
            )
        return self._urls[worker]

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll every worker's ``/health`` until all say ready (they wait for their PS)."""
        deadline = time.monotonic() + (self.wait_timeout_s if timeout_s is None else timeout_s)
        pending = await self.connect() if not self._urls else self.addresses
        last = ""
        while pending:
            still = []
            for url in pending:
                try:
                    await self.http.call(
                        f"{url}/health", method="GET", timeout_s=HEALTH_CHECK_TIMEOUT_S
                    )
                except ServiceUnavailableError as exc:
                    still.append(url)
                    last = str(exc)
            pending = still
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise ServiceUnavailableError(
                    f"embedding workers {pending} not ready after waiting: {last}"
                )
            await asyncio.sleep(HEALTH_POLL_S)

    # --- calls --------------------------------------------------------------------------
    async def call(
        self, worker: int, route: Route[Req, Rep], request: Req, batch_size: int | None = None
    ) -> Rep:
        """POST the request's wire form to the worker's route; the answer, checked."""
        url = await self.address(worker)
        answer = await self.http.call(
            url + route.path,
            request.to_wire(),  # type: ignore[attr-defined]
            idempotent=route.retry(request),
            timeout_s=route.timeout_s,
        )
        return route.decode(answer, batch_size)

    def close(self) -> None:
        """Nothing to release: the HTTP client and the registry are the caller's."""
