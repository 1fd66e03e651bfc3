"""The PS side of a job as TensorBoard points: entries and hit/admit/evict rates.

Rank 0's TensorBoard writer thread (pyrsia/services/nn_worker/tensorboard.py) calls
:meth:`PSCurves.poll` every ``PS_POLL_INTERVAL_S`` and once at close. A poll finds the PS
replicas registered for the job (the same registry ``persia-launcher status`` reads), reads
each one's ``GET /metrics`` (pyrsia/shared/metrics_text.py) and turns the counters into::

    ps/entries        embedding entries held, summed over the replicas
    ps/hit_rate       training-lookup ids found stored / ids looked up, since the previous poll
    ps/admit_rate     ids given a new entry per second, since the previous poll
    ps/evict_rate     entries evicted per second, since the previous poll

A replica that does not answer within ``SCRAPE_TIMEOUT_S`` is left out of that poll (one
debug line); its counters rejoin the sums at the next poll that reads it, so the rates are
measured per replica against that replica's own previous reading. A poll never raises.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from pyrsia.shared.constants import (
    PS_POLL_INTERVAL_S,  # a module attribute: a test (or a user) can shorten it
    ROLE_EMBEDDING_PS,
)
from pyrsia.shared.constants import PS_SCRAPE_TIMEOUT_S as SCRAPE_TIMEOUT_S
from pyrsia.shared.metrics_text import Samples, auth_headers, fetch_samples, sample_sum
from pyrsia.shared.registry import Registry, RegistrySettings

log = logging.getLogger(__name__)

__all__ = ["PSCurves", "PS_POLL_INTERVAL_S", "SCRAPE_TIMEOUT_S"]


_COUNTERS = ("hits", "admitted", "refused", "evicted")
"""pyrsia_ps_lookup_<name>_total, the PS store's training-lookup counters."""


class PSCurves:
    """Polls the job's PS replicas; each poll returns the ``ps/*`` values since the last one."""

    def __init__(self, settings: RegistrySettings):
        self.settings = settings
        # replica address -> (monotonic time, counters) of its last reading
        self._last: dict[str, tuple[float, dict[str, float]]] = {}

    def poll(self) -> dict[str, float]:
        """``{"ps/entries": ..., "ps/hit_rate": ..., ...}`` from the replicas that answered
        (a rate only once a replica was read twice; hit_rate only when ids were looked up);
        empty when none answered. Runs its own event loop: call it off the training thread."""
        try:
            readings = asyncio.run(self._read())
        except Exception as exc:  # the registry down, ...: no point this time
            log.debug("PS curves: no PS point this time: %s", exc)
            return {}
        return self._values(readings)

    async def _read(self) -> dict[str, Samples]:
        registry = Registry(self.settings)
        try:
            records = await registry.discover(ROLE_EMBEDDING_PS)
        finally:
            await registry.close()
        addresses = sorted({rec.address for rec in records.values()})
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        async with aiohttp.ClientSession(
            timeout=timeout, headers=auth_headers(self.settings.environment)
        ) as session:

            async def one(address: str) -> tuple[str, Samples | None]:
                try:
                    return address, await fetch_samples(session, address)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.debug("PS curves: %s skipped: %s", address, exc or type(exc).__name__)
                    return address, None

            answers = await asyncio.gather(*(one(a) for a in addresses))
        return {address: samples for address, samples in answers if samples is not None}

    def _values(self, readings: dict[str, Samples]) -> dict[str, float]:
        """Entries summed; each rate summed over the replicas read twice, each over its own
        interval; hit_rate pools the ids of those replicas."""
        if not readings:
            return {}
        now = time.monotonic()
        entries, admit, evict, hits, looked_up, rated = 0.0, 0.0, 0.0, 0.0, 0.0, False
        for address, samples in readings.items():
            entries += sample_sum(samples, "pyrsia_ps_entries") or 0.0
            counters = {n: sample_sum(samples, f"pyrsia_ps_lookup_{n}_total") for n in _COUNTERS}
            if any(v is None for v in counters.values()):
                continue  # a PS without these counters: entries only
            previous, self._last[address] = self._last.get(address), (now, counters)
            if previous is None or any(counters[n] < previous[1][n] for n in _COUNTERS):
                continue  # first reading, or the replica restarted: no rate yet
            d = {n: counters[n] - previous[1][n] for n in _COUNTERS}
            seconds = max(now - previous[0], 1e-9)
            admit += d["admitted"] / seconds
            evict += d["evicted"] / seconds
            hits += d["hits"]
            looked_up += d["hits"] + d["admitted"] + d["refused"]
            rated = True
        values = {"ps/entries": entries}
        if rated:
            values["ps/admit_rate"], values["ps/evict_rate"] = admit, evict
            if looked_up > 0:
                values["ps/hit_rate"] = hits / looked_up
        return values
