"""SIGTERM under load: every service drains and exits 0 within 5 s.

A multi-epoch Adult job trains (PS, embedding worker, NN worker, data loader as real
processes, gradients and batches in flight); then one service, or all at once as honcho
does at the end of a job, gets SIGTERM. Each must exit with code 0 within
``SHUTDOWN_BUDGET_S``; a process still running then is killed and the test fails on its -9.
"""

from __future__ import annotations

import json

import pytest

from pyrsia.shared.constants import SHUTDOWN_BUDGET_S
from tests.faults.direct_job import DirectJob, sigterm_and_time
from tests.faults.honcho_job import REPO
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RESULTS = REPO / "bench_results" / "faults.json"
TARGETS = ["embedding_parameter_server", "embedding_worker", "nn_worker", "data_loader", "all"]


@pytest.fixture
def redis():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize("target", TARGETS)
def test_sigterm_under_load_exits_0_within_5s(target, redis, tmp_path):
    job = DirectJob(tmp_path, redis, epochs=20).start()
    try:
        job.wait_training()
        procs = job.processes()
        names = list(procs) if target == "all" else [target]
        results = sigterm_and_time([procs[n] for n in names], SHUTDOWN_BUDGET_S)
    finally:
        job.kill_all()
    measured = {
        n: {"rc": rc, "seconds": round(s, 2)} for n, (rc, s) in zip(names, results, strict=True)
    }
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[f"sigterm_{target}"] = measured
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"SIGTERM {target}: {measured}")
    logs = {n: job.log(n)[-2000:] for n in ("nn_worker", "data_loader")}
    assert all(rc == 0 for rc, _ in results), (measured, logs)
    assert all(s < SHUTDOWN_BUDGET_S for _, s in results), measured
    # The rank drained its in-flight gradients, it was not killed. Only checked when the NN
    # worker alone gets SIGTERM: with every service signalled at once, the embedding worker
    # may refuse the rank's gradients (503, shutting down) before the rank's own signal
    # arrives: the rank then leaves its context through that error, and the signal may come
    # after the context removed its handler (seen once in CI: exit 0, no SIGTERM line).
    if names == ["nn_worker"]:
        assert "SIGTERM: stopping training" in job.log("nn_worker"), logs["nn_worker"]
