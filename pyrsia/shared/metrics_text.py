"""Reading a service's ``GET /metrics``: Prometheus text parsed with prometheus_client's parser.

Shared by ``persia-launcher status`` (every process of a job) and the NN worker's TensorBoard
PS curves (pyrsia/services/nn_worker/ps_curves.py), so both read the same names the same way.
"""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pyrsia.shared.auth import AUTH_HEADER, auth_header_value, auth_token_from_env
from pyrsia.shared.settings import Settings

__all__ = ["Samples", "auth_headers", "fetch_samples", "parse_samples", "sample_sum"]

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name (``pyrsia_ps_ids_total``) -> its (labels, value) pairs."""


def parse_samples(text: str) -> Samples:
    """The samples of a Prometheus text exposition, by sample name (ValueError if malformed)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def sample_sum(samples: Samples, metric: str, **labels: str) -> float | None:
    """Sum of ``metric``'s samples whose labels include ``labels``; None if there is none."""
    found = [v for lab, v in samples.get(metric, []) if labels.items() <= lab.items()]
    return sum(found) if found else None


def auth_headers(settings: Settings) -> dict[str, str]:
    """The job's auth header (``PERSIA_AUTH_TOKEN`` of ``settings``), or none: services
    answer 401 without it."""
    token = auth_token_from_env(settings)
    return {AUTH_HEADER: auth_header_value(token)} if token else {}


async def fetch_samples(session: aiohttp.ClientSession, address: str) -> Samples | None:
    """``GET http://<address>/metrics``, parsed; None when it answers another status than 200.
    Raises aiohttp.ClientError, TimeoutError (the session's timeout) or ValueError (not
    Prometheus text)."""
    async with session.get(f"http://{address}/metrics") as resp:
        if resp.status != 200:
            return None
        return parse_samples(await resp.text())
