"""Calls from an NN worker (or an inference client) to the embedding workers.

The embedding workers are found either through the Redis registry (training and
evaluation jobs) or from a fixed ``host:port`` list (``InferCtx``, which needs no
registry). Every call goes through the process's one :class:`HttpClient` and
returns validated numpy arrays; the protocol is PROTOCOL.md.

Embedding layout per slot, as the worker answers it::

    summed slot  (embedding_summation: true)   float32 (batch, dim)
    raw slot     (embedding_summation: false)  float32 (batch, sample_fixed_size, dim + 1)
                                               last column: 1 for a real id, 0 for padding
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np

from pyrsia.shared.constants import (
    ADMIN_TIMEOUT_S,
    DEFAULT_WAIT_TIMEOUT_S,
    HEALTH_CHECK_TIMEOUT_S,
    HEALTH_POLL_S,
    LOOKUP_TIMEOUT_S,
    ROLE_EMBEDDING_WORKER,
)
from pyrsia.shared.embedding_spec import EmbeddingHyperparams, optimizer_from_dict
from pyrsia.shared.errors import InvalidInputError, ServiceUnavailableError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.worker import (
    Embeddings,
    Gradients,
    GradientsApplied,
    Lookup,
    LookupDirect,
    WorkerSchema,
    WorkerStats,
)


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


class EmbeddingWorkerClient:
    """Addresses of the embedding workers and the calls an NN worker makes to them.

    Use from coroutines running on the NN-worker runtime's loop.
    """

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
        self._round_robin = itertools.count()

    # --- discovery ----------------------------------------------------------------------
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

    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    async def url(self, index: int) -> str:
        """Address of embedding worker ``index`` (re-resolved once when unknown)."""
        if not self._urls:
            await self.connect()
        if not 0 <= index < len(self._urls):
            await self.refresh()
        if not 0 <= index < len(self._urls):
            raise InvalidInputError(
                "worker", f"an embedding worker index in [0, {len(self._urls)})", index
            )
        return self._urls[index]

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll every worker's ``/health`` until all say ready (they wait for their PS)."""
        deadline = time.monotonic() + (self.wait_timeout_s if timeout_s is None else timeout_s)
        urls = await self.connect() if not self._urls else self.urls
        pending = list(urls)
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

    # --- data path ----------------------------------------------------------------------
    async def lookup(
        self, worker: int, batch_id: int, train: bool, batch_size: int, *, gathered: bool = False
    ) -> tuple[Embeddings, bool]:
        """Embeddings of a batch a data loader buffered on ``worker`` under ``batch_id``.

        Returns them with whether the worker awaits gradients for the batch (``train`` and
        the batch's ``requires_grad``). With ``gathered`` single-id summed slots come as
        tables (``pyrsia.shared.wire.gathered``), and their gradients must go back as tables.
        """
        url = await self.url(worker)
        body = Lookup(batch_id, train, gathered).to_wire()
        answer = await self.http.call(f"{url}/lookup", body, timeout_s=LOOKUP_TIMEOUT_S)
        embeddings = Embeddings.from_wire(answer, batch_size)
        return embeddings, bool(train and embeddings.requires_grad)

    async def lookup_direct(
        self, id_part: IDPart, train: bool, worker: int | None = None, *, gathered: bool = False
    ) -> tuple[Embeddings, int]:
        """Embeddings of ids sent in the request; returns (embeddings, worker).

        ``embeddings.batch_id`` is the reference for the gradients (None unless a training
        lookup of a batch that requires grad). Without ``worker`` the workers take turns.
        """
        if not self._urls:
            await self.connect()
        if worker is None:
            worker = next(self._round_robin) % len(self._urls)
        url = await self.url(worker)
        answer = await self.http.call(
            f"{url}/lookup_direct",
            LookupDirect(id_part, train, gathered).to_wire(),
            idempotent=not train,
            timeout_s=LOOKUP_TIMEOUT_S,
        )
        return Embeddings.from_wire(answer, id_part.batch_size), worker

    async def gradients(
        self,
        worker: int,
        batch_id: int,
        loss_scale: float,
        grads: list[tuple[str, np.ndarray]],
        *,
        tables: list[tuple[int, np.ndarray]] | None = None,
        skipped_slots: tuple[str, ...] = (),
    ) -> GradientsApplied:
        """Send one batch's embedding gradients: per pooled slot (the embeddings' layout), and
        per table of a gathered answer (``tables``; gathered slots left out named in
        ``skipped_slots``)."""
        url = await self.url(worker)
        body = Gradients(
            batch_id, float(loss_scale), tuple(grads),
            None if tables is None else tuple(tables), tuple(skipped_slots),
        ).to_wire()  # fmt: skip
        answer = await self.http.call(f"{url}/gradients", body, timeout_s=LOOKUP_TIMEOUT_S)
        return GradientsApplied.from_wire(answer)

    # --- administration (the worker fans these out to every PS replica) ------------------
    async def admin(self, path: str, body: dict, *, idempotent: bool = True) -> Any:
        """POST ``path`` to one embedding worker, which forwards it to every PS replica."""
        url = await self.url(0)
        return await self.http.call(
            f"{url}{path}", body, idempotent=idempotent, timeout_s=ADMIN_TIMEOUT_S
        )

    async def configure(self, hyperparams: dict) -> Any:
        params = EmbeddingHyperparams.from_dict(hyperparams, field="hyperparams")
        return await self.admin("/configure", Configure(params).to_wire())

    async def register_optimizer(self, optimizer: dict) -> Any:
        spec = optimizer_from_dict(optimizer, field="optimizer")
        return await self.admin("/register_optimizer", RegisterOptimizer(spec).to_wire())

    async def dump(self, directory: str) -> Any:
        return await self.admin("/dump", Directory(directory).to_wire(), idempotent=False)

    async def load(self, directory: str) -> Any:
        return await self.admin("/load", Directory(directory).to_wire(), idempotent=False)

    async def clear(self) -> Any:
        return await self.admin("/clear", Empty().to_wire())

    async def schema(self) -> WorkerSchema:
        """The embedding schema worker 0 serves and its PS replica count."""
        return WorkerSchema.from_wire(await self.admin("/schema", {}))

    async def stats(self) -> WorkerStats:
        """Worker 0's buffers and every PS replica's counters."""
        return WorkerStats.from_wire(await self.admin("/stats", {}))
