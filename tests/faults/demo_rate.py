"""Measure the request rate the Adult demo puts on its PS and embedding worker.

``python -m tests.faults.demo_rate`` runs the real ``Procfile`` job (as ``make demo`` does,
on free ports and its own Redis), scrapes the PS's and the worker's ``/metrics`` every
``--interval`` seconds while it trains, and prints JSON: requests per second on each
service over the busy window (from the first to the last scrape where a counter moved),
and the peak over any one-second window. The load suite (test_load.py) drives 10x
the busy-window rate; rerun this when the demo changes.

Counted requests: PS ``/lookup`` and ``/update`` (``pyrsia_ps_request_seconds_count``);
worker ``/batch``, ``/lookup``, ``/lookup_direct`` and ``/gradients`` (each training batch
is one ``/batch`` + one ``/lookup`` + one ``/gradients``; ``/batch`` has no histogram, so
it is counted as the training lookups, ``pyrsia_ew_update_seconds_count``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, service_key
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]


def _counts(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_count"):
                key = sample.name + "".join(
                    f"{{{k}={v}}}" for k, v in sorted(sample.labels.items())
                )
                out[key] = out.get(key, 0.0) + sample.value
    return out


def ps_requests(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.startswith("pyrsia_ps_request_seconds_count"))


def ew_requests(counts: dict[str, float]) -> float:
    lookups = counts.get("pyrsia_ew_lookup_seconds_count", 0.0)
    updates = counts.get("pyrsia_ew_update_seconds_count", 0.0)
    return lookups + 2 * updates  # + one /batch per training batch (= per gradient update)


def measure(interval_s: float = 0.25, timeout_s: float = 600.0) -> dict:
    env_lines = (REPO / ".honcho.env").read_text().splitlines()
    redis_port = free_port()
    job = f"rate-{uuid.uuid4().hex[:8]}"
    overrides = {
        "REDIS_PORT": str(redis_port),
        "PS_PORT": str(free_port()),
        "EMBEDDING_WORKER_PORT": str(free_port()),
        "PERSIA_JOB_ID": job,
        "PERSIA_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    kept = [line for line in env_lines if line.split("=", 1)[0] not in overrides]
    env_file = Path(f"/tmp/pyrsia-demo-rate-{job}.env")
    env_file.write_text("\n".join(kept + [f"{k}={v}" for k, v in overrides.items()]) + "\n")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "honcho", "-e", str(env_file), "-f", "Procfile", "start"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: list[tuple[float, float, float]] = []
    urls: dict[str, str] = {}
    started = time.monotonic()
    try:
        client = None
        while proc.poll() is None and time.monotonic() - started < timeout_s:
            time.sleep(interval_s)
            try:
                if client is None:
                    client = redis.Redis(port=redis_port, decode_responses=True)
                for role, name in ((ROLE_EMBEDDING_PS, "ps"), (ROLE_EMBEDDING_WORKER, "ew")):
                    if name not in urls:
                        raw = client.get(service_key(job, role, 0))
                        if raw:
                            urls[name] = "http://" + json.loads(raw)["address"]
                if len(urls) == 2:
                    ps, ew = _counts(urls["ps"]), _counts(urls["ew"])
                    samples.append((time.monotonic(), ps_requests(ps), ew_requests(ew)))
            except (OSError, redis.RedisError):
                continue  # not up yet, or already stopping
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)
        env_file.unlink(missing_ok=True)
    return summarize(samples)


def summarize(samples: list[tuple[float, float, float]]) -> dict:
    moving = [i for i in range(1, len(samples)) if samples[i][1:] != samples[i - 1][1:]]
    if not moving:
        raise RuntimeError("the demo's counters never moved: did the job run?")
    first, last = samples[moving[0] - 1], samples[moving[-1]]
    window = last[0] - first[0]
    peak_ps = peak_ew = 0.0
    for i, (t, ps, ew) in enumerate(samples):
        j = next((j for j in range(i, len(samples)) if samples[j][0] - t >= 1.0), None)
        if j is not None:
            dt = samples[j][0] - t
            peak_ps = max(peak_ps, (samples[j][1] - ps) / dt)
            peak_ew = max(peak_ew, (samples[j][2] - ew) / dt)
    return {
        "busy_seconds": round(window, 2),
        "ps_requests": last[1] - first[1],
        "ew_requests": last[2] - first[2],
        "ps_requests_per_s": round((last[1] - first[1]) / window, 1),
        "ew_requests_per_s": round((last[2] - first[2]) / window, 1),
        "ps_peak_per_s": round(peak_ps, 1),
        "ew_peak_per_s": round(peak_ew, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    print(json.dumps(measure(args.interval), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
