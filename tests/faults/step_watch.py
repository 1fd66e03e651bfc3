"""Where a running job is, in training steps: an NN-worker rank's ``pyrsia_nn_worker_steps``.

Every rank's ingress publishes the step it has finished on ``GET /metrics`` (the runtime sets
the gauge at the end of ``TrainCtx.backward``). :class:`StepWatch` finds the rank's ingress
through the job's Redis registry once (so a later Redis kill does not blind it) and then
reads the gauge over loopback HTTP. The fault tests use it to kill a process at a chosen
step rather than after a time: on a quiet machine the Adult epoch trains in seconds, so a
time-based kill lands wherever the machine's speed puts it.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import redis as redis_lib

from pyrsia.shared.constants import ROLE_NN_WORKER, service_key
from pyrsia.shared.registry import ServiceRecord

_GAUGE = re.compile(rb"^pyrsia_nn_worker_steps (\S+)$", re.MULTILINE)


class StepWatch:
    """Reads one NN-worker rank's finished training step."""

    def __init__(self, redis_url: str, job_id: str, rank: int = 0):
        self.redis_url = redis_url
        self.job_id = job_id
        self.rank = rank
        self.address: str | None = None

    def _find(self) -> str | None:
        client = redis_lib.Redis.from_url(self.redis_url, socket_timeout=2)
        try:
            raw = client.get(service_key(self.job_id, ROLE_NN_WORKER, self.rank))
        except redis_lib.RedisError:
            return None
        finally:
            client.close()
        return ServiceRecord.from_json(raw).address if raw else None

    def step(self) -> int | None:
        """The rank's last finished step; None before its ingress runs or once it is gone."""
        if self.address is None:
            self.address = self._find()
            if self.address is None:
                return None
        try:
            with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=2) as resp:
                found = _GAUGE.search(resp.read())
        except (OSError, urllib.error.URLError):
            return None
        return int(float(found[1])) if found else None

    def wait_for(self, step: int, *, alive: Callable[[], bool], timeout_s: float = 300.0) -> int:
        """Poll (every few ms) until the rank has finished ``step``; return the step read.

        ``alive`` is checked between polls so a job that died is reported, not waited on.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            current = self.step()
            if current is not None and current >= step:
                return current
            if not alive():
                raise AssertionError(f"the job ended before step {step} (last seen {current})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step} not reached in {timeout_s}s (at {current})")
            time.sleep(0.002 if current is not None else 0.05)
