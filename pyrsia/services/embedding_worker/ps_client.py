"""The embedding worker's view of the PS replicas: addresses, retries, fan-out.

:class:`PSClient` is the HTTP implementation of the embedding worker's
:class:`~pyrsia.services.embedding_worker.ps_link.PSLink` (services mode).

Addresses come from the registry, or for inference from ``infer_config.servers``
(replica i at ``servers[i]``, no Redis). When a replica stops answering, the client
re-reads the registry (the replica may have restarted on another port) and
retries within a bound; lookups are safe to repeat. Gradient updates for a
replica that stays unreachable are dropped and counted, never raised into the
worker's request loop. A replica that comes back as a new, empty process after the worker
trained on it is refused, naming it (``ps_boots.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyrsia.services.embedding_worker.ps_boots import ReplicaBoots
from pyrsia.shared.constants import (
    ADMIN_TIMEOUT_S,
    PS_REDISCOVER_TIMEOUT_S,
    PS_RETRY_WINDOW_S,
    PS_SETUP_REPLAY_TIMEOUT_S,
    ROLE_EMBEDDING_PS,
)
from pyrsia.shared.errors import (
    InvalidInputError,
    PersiaError,
    RegistryError,
    RemoteBadRequestError,
    ServiceUnavailableError,
)
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry
from pyrsia.shared.wire.admin import Configure, Directory, RegisterOptimizer
from pyrsia.shared.wire.ps import IdGroup, PSLookup, PSLookupAnswer, PSStats, PSUpdate, UpdateTotals

log = logging.getLogger(__name__)


class PSClient:
    """Calls to every PS replica of the job, by replica index (a ``PSLink`` over HTTP)."""

    def __init__(
        self,
        registry: Registry | None,
        http: HttpClient,
        *,
        retry_window_s: float = PS_RETRY_WINDOW_S,
        addresses: tuple[str, ...] = (),
    ):
        if (registry is None) == (not addresses):
            raise InvalidInputError(
                "addresses",
                "a registry or fixed addresses (infer_config.servers), not both",
                message="PSClient needs a registry or fixed addresses (infer_config.servers)",
            )
        self.registry = registry
        self.http = http
        self.retry_window_s = retry_window_s
        self.fixed = [
            a if a.startswith("http") else f"http://{a.replace(' ', '')}" for a in addresses
        ]
        self.urls: list[str] = []
        self.dropped_updates = 0
        self.applied_updates = 0  # id rows the PS replicas said they applied (their answers)
        self._setup: dict[str, Any] = {}
        self.boots = ReplicaBoots()

    @property
    def replica_count(self) -> int:
        return len(self.urls)

    async def connect(self, timeout_s: float) -> None:
        """Wait for every PS replica (count from the registry) and remember their addresses.

        With fixed addresses (``infer_config.servers``) replica i is ``addresses[i]``.
        """
        if self.registry is None:
            self.urls = list(self.fixed)
            log.info("PS replicas from infer_config.servers: %s", ", ".join(self.urls))
            return
        records = await self.registry.wait_for(ROLE_EMBEDDING_PS, timeout_s=timeout_s)
        self.urls = [r.url for r in records]
        log.info("found %d PS replica(s): %s", len(self.urls), ", ".join(self.urls))

    async def _rediscover(self, index: int) -> None:
        if self.registry is None:
            return  # fixed addresses: retry the same one
        try:
            records = await self.registry.wait_for(
                ROLE_EMBEDDING_PS, count=len(self.urls), timeout_s=PS_REDISCOVER_TIMEOUT_S
            )
        except RegistryError as exc:
            log.warning("PS replica %d still missing from the registry: %s", index, exc)
            return
        fresh = records[index].url
        if fresh != self.urls[index]:
            log.info("PS replica %d moved: %s -> %s", index, self.urls[index], fresh)
            self.urls[index] = fresh

    def remember_setup(self, path: str, body: Any) -> None:
        """Keep the last /configure and /register_optimizer so a restarted replica gets them again."""
        self._setup[path] = body

    async def _replay_setup(self, index: int) -> None:
        for path, body in self._setup.items():
            try:
                answer = await self.http.call(
                    f"{self.urls[index]}{path}", body, timeout_s=PS_SETUP_REPLAY_TIMEOUT_S
                )
            except PersiaError as exc:
                log.debug("replaying %s to PS replica %d failed: %s", path, index, exc)
                return
            self._observe(index, path, answer)
        if self._setup:
            log.info("PS replica %d: replayed %s", index, ", ".join(self._setup))

    def _observe(self, index: int, path: str, answer: Any) -> None:
        """Note the boot id a replica answered with; log once when it marks the replica lost."""
        lost_before = index in self.boots.lost
        if self.boots.observe(index, answer, path, self.urls[index]) and not lost_before:
            log.error("%s", self.boots.lost[index])

    async def _probe_boot(self, index: int) -> None:
        """Ask a replica that holds job state which process answers now (its ``/stats``);
        before each refusal of a lost one too (a resume may have loaded it since)."""
        if index not in self.boots.holds or index not in self.boots.seen:
            return
        try:
            answer = await self.http.call(
                f"{self.urls[index]}/stats", {}, timeout_s=PS_SETUP_REPLAY_TIMEOUT_S
            )
        except PersiaError as exc:
            log.debug("PS replica %d: /stats for its boot id failed: %s", index, exc)
            return
        self._observe(index, "/stats", answer)

    async def hold(self, index: int) -> None:
        """Replica ``index`` is about to get job state (a training lookup or an update):
        learn which process it is first, when no answer told yet (one ``/stats``)."""
        if index in self.boots.holds:
            return
        if index not in self.boots.seen:
            try:
                answer = await self.call(index, "/stats", {}, timeout_s=PS_SETUP_REPLAY_TIMEOUT_S)
            except ServiceUnavailableError:
                answer = None  # the call itself retries and reports
            self._observe(index, "/stats", answer)
        self.boots.hold(index)

    async def call(
        self, index: int, path: str, body: Any, *, timeout_s: float | None = None
    ) -> Any:
        """POST to replica ``index``, re-resolving and retrying while it is unreachable.

        A replica that answers 503 (a restarted one that was never configured) is sent
        the remembered /configure and /register_optimizer before the retry.
        """
        deadline = time.monotonic() + self.retry_window_s
        delay = 0.05
        while True:
            if self.boots.refuses(index, path):
                await self._probe_boot(index)
                self.boots.check(index, path)
            try:
                answer = await self.http.call(
                    f"{self.urls[index]}{path}",
                    body,
                    idempotent=True,
                    retries=1,
                    timeout_s=timeout_s,
                )
                self._observe(index, path, answer)
                return answer
            except ServiceUnavailableError as exc:
                if time.monotonic() + delay >= deadline:
                    raise ServiceUnavailableError(
                        f"PS replica {index} unreachable for {self.retry_window_s:g}s: {exc}"
                    ) from exc
                log.warning("PS replica %d: %s; re-resolving", index, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                await self._rediscover(index)
                await self._probe_boot(index)
                self.boots.check(index, path)
                if path not in self._setup and index not in self.boots.lost:
                    await self._replay_setup(index)

    async def fan_out(
        self, path: str, body: Any = None, *, timeout_s: float | None = None
    ) -> list[Any]:
        """The same call to every replica, concurrently; answers in replica order."""
        return list(
            await asyncio.gather(
                *(
                    self.call(i, path, body or {}, timeout_s=timeout_s)
                    for i in range(len(self.urls))
                )
            )
        )

    async def admin(self, path: str, body: Any, *, remember: bool = False) -> list[Any]:
        """An administration call to every replica (``remember``: replayed to a replica that
        restarts); a body a PS refuses is an ``InvalidInputError`` naming its field."""
        if remember:
            self.remember_setup(path, body)
        try:
            return await self.fan_out(path, body, timeout_s=ADMIN_TIMEOUT_S)
        except RemoteBadRequestError as exc:  # the PS refused the body our caller wrote: a 400
            field, expected = exc.field or "body", exc.expected or "a body the PS accepts"
            raise InvalidInputError(field, expected, message=str(exc)) from exc

    async def configure(self, request: Configure) -> list[Any]:
        return await self.admin("/configure", request.to_wire(), remember=True)

    async def register_optimizer(self, request: RegisterOptimizer) -> list[Any]:
        return await self.admin("/register_optimizer", request.to_wire(), remember=True)

    async def dump(self, request: Directory) -> list[Any]:
        return await self.admin("/dump", request.to_wire())

    async def load(self, request: Directory) -> list[Any]:
        return await self.admin("/load", request.to_wire())

    async def clear(self) -> list[Any]:
        return await self.admin("/clear", {})

    async def stats(self) -> list[PSStats]:
        """Every replica's ``/stats``, checked (none before the replicas are known)."""
        answers = await self.fan_out("/stats")
        return [PSStats.from_wire(a, f"ps[{i}]") for i, a in enumerate(answers)]

    async def lookup(
        self, per_replica: list[list[tuple[int, Any]]], *, train: bool
    ) -> list[tuple[np.ndarray, ...]]:
        """One /lookup per replica with all its dim groups; answers (checked by
        ``PSLookupAnswer``: one ``(n, dim)`` float32 array per group) in replica order."""
        answers, _ = await self.lookup_carrying(per_replica, (), train=train)
        return answers

    async def lookup_carrying(
        self,
        per_replica: list[list[tuple[int, Any]]],
        updates: Sequence[list[list[tuple[int, Any, Any]]]],
        *,
        train: bool,
    ) -> tuple[list[tuple[np.ndarray, ...]], list[tuple[UpdateTotals, int]]]:
        """One /lookup per replica carrying that replica's part of each of ``updates`` (applied
        first, in order): the lookups' answers in replica order, and per update its summed
        totals and the id rows dropped. A replica that stays unreachable fails the lookup;
        the updates it was sent count as dropped."""
        totals = [UpdateTotals() for _ in updates]
        dropped = [0] * len(updates)

        async def one(index: int, groups: list[tuple[int, Any]]) -> tuple[np.ndarray, ...]:
            carried = [[(d, ids, g) for d, ids, g in u[index] if len(ids)] for u in updates]
            if not any(carried) and all(len(ids) == 0 for _, ids in groups):
                return tuple(np.empty((0, dim), np.float32) for dim, _ in groups)
            request = PSLookup(
                train,
                tuple(IdGroup(d, ids) for d, ids in groups),
                tuple(PSUpdate(tuple(IdGroup(d, ids, g) for d, ids, g in c)) for c in carried),
            )
            if train or any(carried):
                await self.hold(index)
            try:
                answer = await self.call(index, "/lookup", request.to_wire())
            except ServiceUnavailableError as exc:
                per_update = [sum(len(ids) for _, ids, _ in c) for c in carried]
                for k, n in enumerate(per_update):
                    dropped[k] += n
                lost = sum(per_update)
                self.dropped_updates += lost
                if lost:
                    log.error(
                        "dropping gradients of %d ids for PS replica %d: %s", lost, index, exc
                    )
                raise
            checked = PSLookupAnswer.from_wire(answer, request)
            for k, result in enumerate(checked.applied):
                totals[k] += result
                self.applied_updates += result.applied
            return checked.groups

        answers = list(await asyncio.gather(*(one(i, g) for i, g in enumerate(per_replica))))
        return answers, list(zip(totals, dropped, strict=True))

    async def update(
        self, per_replica: list[list[tuple[int, Any, Any]]]
    ) -> tuple[UpdateTotals, int]:
        """One /update per replica: the summed totals, and the ids dropped because their
        replica stayed unreachable (counted in ``dropped_updates`` too)."""
        totals: list[UpdateTotals] = []
        dropped = 0

        async def one(index: int, groups: list[tuple[int, Any, Any]]) -> None:
            nonlocal dropped
            groups = [(d, ids, g) for d, ids, g in groups if len(ids)]
            if not groups:
                return
            body = PSUpdate(tuple(IdGroup(d, ids, g) for d, ids, g in groups)).to_wire()
            await self.hold(index)
            try:
                answer = await self.call(index, "/update", body)
            except ServiceUnavailableError as exc:
                n = sum(len(ids) for _, ids, _ in groups)
                self.dropped_updates += n
                dropped += n
                log.error("dropping gradients of %d ids for PS replica %d: %s", n, index, exc)
                return
            result = UpdateTotals.from_wire(answer)
            totals.append(result)
            self.applied_updates += result.applied

        await asyncio.gather(*(one(i, g) for i, g in enumerate(per_replica)))
        return sum(totals, UpdateTotals()), dropped
