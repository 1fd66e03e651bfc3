"""Redis down for 30 s while the Adult job trains: no stall, re-registration when it is back.

The services keep the addresses they already know (the registry falls back to them), so
training goes on: the test samples the PS's acknowledged updates (over loopback HTTP,
not through Redis) each second for 10 s before, 30 s during and 10 s after the outage.
Redis is stopped, then started again empty on the same port; every replica's heartbeat
must write its record again.

Lost acknowledged updates: an NN worker's gradients are acknowledged when the embedding
worker answers its ``/gradients``; the worker then counts, in ``/stats``, the id rows the
PS said it applied (``applied_update_ids``) and those it had to drop
(``dropped_update_ids``). Over the outage the dropped count and the batches whose
gradients the worker stopped awaiting must not grow; at the end (the NN worker stopped by
SIGTERM, which drains its in-flight gradients) the rows the worker was told were applied
must equal the PS's own ``updates_applied``, and nothing was left undelivered.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import redis as redis_lib

from pyrsia.shared.constants import (
    HEARTBEAT_INTERVAL_S,
    REDIS_SOCKET_TIMEOUT_S,
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
    ROLE_NN_WORKER,
    service_key,
)
from tests.faults.direct_job import DirectJob, sigterm_and_time
from tests.faults.honcho_job import REPO
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RESULTS = REPO / "bench_results" / "faults.json"
OUTAGE_S = 30.0
WINDOW_S = 10.0
MIN_RATE_RATIO = 0.5  # step rate during the outage / before it
REREGISTER_LIMIT_S = 10.0


def _sample(job: DirectJob, seconds: float) -> list[tuple[float, int]]:
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        out.append((time.monotonic(), job.updates_applied()))
        time.sleep(1.0)
    out.append((time.monotonic(), job.updates_applied()))
    return out


def _rate(samples: list[tuple[float, int]]) -> float:
    (t0, u0), (t1, u1) = samples[0], samples[-1]
    return (u1 - u0) / (t1 - t0)


def _restart_and_wait_reregistered(job: DirectJob, redis: RedisServer) -> float:
    """Start Redis again (same port, empty) and wait until the PS's, the embedding worker's
    and the NN worker's records are written again (at most REREGISTER_LIMIT_S): the seconds
    from the restart."""
    redis.start()  # same port, empty: every record must be written again
    back = time.monotonic()
    keys = [
        service_key(job.env["PERSIA_JOB_ID"], role, 0)
        for role in (ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER)
    ]
    client = redis_lib.Redis.from_url(redis.url)
    try:
        while not all(client.exists(k) for k in keys):
            assert time.monotonic() - back < REREGISTER_LIMIT_S, [client.exists(k) for k in keys]
            time.sleep(0.1)
    finally:
        client.close()
    return time.monotonic() - back


def _quiesce_and_count(job: DirectJob) -> tuple[list, dict, int]:
    """SIGTERM the NN worker and data loader (the NN worker drains its in-flight gradients),
    read the embedding worker's /stats and the PS's updates_applied, then SIGTERM those two.

    Returns (every (exit code, seconds) of the stops, the worker's stats, the PS's count)."""
    procs = job.processes()
    stops = sigterm_and_time([procs["nn_worker"], procs["data_loader"]], 5.0)
    final = job.worker_stats()
    ps_applied = job.updates_applied()
    stops += sigterm_and_time([procs["embedding_parameter_server"], procs["embedding_worker"]], 5.0)
    return stops, final, ps_applied


def _batches_not_delivered(nn_worker_log: str) -> int:
    """The batches of embedding gradients the NN worker logged as not delivered at its stop."""
    return sum(
        int(n)
        for n in re.findall(r"(\d+) batches of embedding gradients not delivered", nn_worker_log)
    )


def _record(key: str, row: dict) -> None:
    """Store ``row`` under ``key`` in bench_results/faults.json."""
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[key] = row
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))


def test_redis_outage_30s_training_goes_on_and_services_reregister(tmp_path):
    redis = RedisServer().start()
    job = DirectJob(tmp_path, redis, epochs=200).start()
    try:
        job.wait_training()
        before = _sample(job, WINDOW_S)
        at_outage = job.worker_stats()
        redis.stop()
        during = _sample(job, OUTAGE_S)
        end_outage = job.worker_stats()
        reregistered_s = _restart_and_wait_reregistered(job, redis)
        after = _sample(job, WINDOW_S)
        for name, proc in (("nn_worker", job.nn), ("data_loader", job.dl)):
            assert proc is not None and proc.poll() is None, job.log(name)[-3000:]
        stops, final, ps_applied = _quiesce_and_count(job)
    finally:
        job.kill_all()
        redis.stop()
    # the slowest 5 s of the outage: no stall anywhere in it
    buckets = [_rate(during[i : i + 6]) for i in range(0, len(during) - 5, 5)]
    row = {
        "updates_per_s_before": round(_rate(before), 1),
        "updates_per_s_during": round(_rate(during), 1),
        "updates_per_s_slowest_5s_during": round(min(buckets), 1),
        "updates_per_s_after": round(_rate(after), 1),
        "reregistered_seconds": round(reregistered_s, 2),
        "stop_codes": [rc for rc, _ in stops],
        # acknowledged to the NN worker (its /gradients got 200), then not applied by the PS
        "lost_updates_during_outage": end_outage["dropped_update_ids"]
        - at_outage["dropped_update_ids"],
        "gradient_batches_evicted_during_outage": end_outage["evicted_awaiting"]
        - at_outage["evicted_awaiting"],
        "updates_acknowledged_by_ps_during_outage": end_outage["applied_update_ids"]
        - at_outage["applied_update_ids"],
        # the whole run: what the PS told the worker it applied vs what the PS holds
        "updates_acknowledged_total": final["applied_update_ids"],
        "updates_applied_by_ps_total": ps_applied,
        "lost_updates_total": final["dropped_update_ids"],
        "gradient_batches_not_delivered_at_stop": _batches_not_delivered(job.log("nn_worker")),
    }
    _record("redis_outage_30s", row)
    print(f"Redis outage: {row}")
    assert min(buckets) > 0, row
    assert row["updates_per_s_during"] >= MIN_RATE_RATIO * row["updates_per_s_before"], row
    # a heartbeat after Redis is back writes the record: two intervals plus a connect timeout
    assert reregistered_s <= 2 * HEARTBEAT_INTERVAL_S + REDIS_SOCKET_TIMEOUT_S, row
    assert all(rc == 0 for rc, _ in stops), row
    assert row["updates_acknowledged_by_ps_during_outage"] > 0, row  # it did train meanwhile
    assert row["lost_updates_during_outage"] == 0, row
    assert row["gradient_batches_evicted_during_outage"] == 0, row
    assert row["lost_updates_total"] == 0, row
    assert row["updates_acknowledged_total"] == row["updates_applied_by_ps_total"], row
    assert row["gradient_batches_not_delivered_at_stop"] == 0, row
