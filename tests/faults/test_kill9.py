"""kill -9 of each process of the Adult job under honcho, then ``--resume``.

For each Procfile process in turn (a PS replica, the embedding worker, the NN-worker rank,
the data loader, redis-server, the Procfile's whole redis entry) the job runs with a checkpoint every 50 steps; the process gets
SIGKILL as soon as NN-worker rank 0 has finished step 80 (read from its
``pyrsia_nn_worker_steps`` gauge, see :mod:`tests.faults.step_watch`), so the kill lands
mid-job on a quiet machine as on a loaded one. The step read at the kill is recorded and
must be below 60 % of the epoch, and the resume must start from the step-50 checkpoint.
Honcho then stops the whole job (it names the process and its -9), and the same Procfile
with ``--resume`` on the nn_worker and data_loader lines finishes the epoch. Redis is the
exception: the Procfile runs it under ``pyrsia.shared.redis_local --restart-on-failure``, which
starts a killed redis-server again on the same port; the services kept their known
addresses meanwhile and re-register, so the job completes without a stop (recovery is
then the time until every record is back). Killing that supervisor too takes the stop and
``--resume`` path.

Figures per fault, against an unfaulted run with the same checkpoint settings:

- AUC delta: |faulted-then-resumed test AUC - unfaulted test AUC| (must be <= 0.005);
- lost updates: an *acknowledged* embedding update is one id row a PS replica applied a
  gradient to and reported as applied in its /update answer (PS stat ``updates_applied``).
  The final model of a run holds ``updates_applied_total`` of the checkpoint it resumed
  from (recorded in its manifest) plus the PS replicas' ``updates_applied`` of the resumed
  run (logged at their shutdown). An unfaulted run holds its own total. Lost = unfaulted
  total - faulted total (must be 0: every batch's update is in the final model exactly once);
- replayed: updates acknowledged after the checkpoint and before the kill, rolled back by
  the resume and applied again (known when the PS survived to log its count);
- recovery: kill -> job stopped, plus resumed start -> training again from the checkpoint.

Results go to ``bench_results/faults.json`` (the README table quotes them).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis as redis_lib

from pyrsia.shared.constants import (
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
    service_key,
)
from pyrsia.shared.job_checkpoint import latest_complete, read_manifest
from tests.faults.honcho_job import REPO, HonchoJob, JobResult

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EPOCH_STEPS = 255  # Adult training split, batch size 128
AUC_TOLERANCE = 0.005
CHECKPOINT_EVERY = 50
KILL_AT_STEP = 80  # after the step-50 checkpoint: steps 51..80 are rolled back and replayed
MID_JOB_LIMIT = 0.6  # the kill must land before 60 % of the epoch
FAULTS = [
    "embedding_parameter_server",
    "embedding_worker",
    "nn_worker_rank",
    "data_loader",
    "redis",  # redis-server: its supervisor restarts it and the job rides through
    "redis_supervisor",  # the whole Procfile entry: honcho stops the job, --resume finishes it
]
# Procfile entry whose process each fault kills
HONCHO_ENTRY = {"nn_worker_rank": "nn_worker", "redis_supervisor": "redis"}
RESULTS = REPO / "bench_results" / "faults.json"


def _record(key: str, value: dict) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[key] = value
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))


def _wait_reregistered(job: HonchoJob, since: float, timeout_s: float = 30.0) -> float | None:
    """Seconds from ``since`` until the PS and worker records are in Redis again; None when
    the job finished first (on a quiet machine the rest of the epoch after the kill can take
    less than one heartbeat, and finished services deregister: nothing is left to come back;
    re-registration itself is asserted by test_redis_outage, where the job outlasts Redis).

    Not the NN worker's: its rank can finish the epoch (and deregister) before its next
    heartbeat, ~2 s after the kill.
    """
    keys = [service_key(job.job_id, role, 0) for role in (ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER)]
    client = redis_lib.Redis.from_url(job.redis_url, socket_timeout=1)
    try:
        while time.monotonic() - since < timeout_s:
            if not job.running():
                return None
            try:
                if all(client.exists(k) for k in keys):
                    return time.monotonic() - since
            except redis_lib.RedisError:
                pass  # not back yet
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"not every service re-registered within {timeout_s}s")


def _assert_completed(result: JobResult) -> None:
    assert result.returncode == 0, result.log[-4000:]
    assert result.auc is not None and result.steps is not None, result.log[-4000:]


@pytest.fixture(scope="module")
def unfaulted(tmp_path_factory) -> JobResult:
    work = tmp_path_factory.mktemp("unfaulted")
    result = (
        HonchoJob(work, work / "ckpt", every_n_steps=CHECKPOINT_EVERY, name="unfaulted")
        .start()
        .wait()
    )
    _assert_completed(result)
    assert result.steps == EPOCH_STEPS
    assert result.updates_applied, "the PS did not log its final updates_applied"
    _record(
        "unfaulted",
        {
            "auc": result.auc,
            "updates_applied": result.updates_applied,
            "seconds": round(result.seconds, 1),
        },
    )
    return result


def test_unfaulted_runs_agree_so_the_figures_measure_the_fault(unfaulted, honcho_jobs, tmp_path):
    """A second unfaulted run: the AUC noise of the job itself, and the update count is exact
    (the same batches give the same acknowledged updates, so a lost one would show)."""
    again = (
        honcho_jobs(tmp_path, tmp_path / "ckpt", every_n_steps=CHECKPOINT_EVERY, name="control")
        .start()
        .wait()
    )
    _assert_completed(again)
    row = {
        "auc": again.auc,
        "auc_delta": round(abs(again.auc - unfaulted.auc), 4),
        "lost_updates": unfaulted.updates_applied - again.updates_applied,
    }
    _record("unfaulted_control", row)
    print(f"unfaulted control: {row}")
    assert row["lost_updates"] == 0, row
    assert row["auc_delta"] <= AUC_TOLERANCE, row


def _kill9_mid_job(job: HonchoJob, target: str, ckpt) -> tuple:
    """SIGKILL ``target``'s process as soon as NN-worker rank 0 has finished KILL_AT_STEP.

    Returns (the step read at the kill, the step read right after it (None once the rank is
    gone), the step of the latest complete checkpoint at the kill, the monotonic kill time).
    """
    pid = job.pid_of(target)  # found first: the kill must follow the step read at once
    watch = job.steps()
    step_at_kill = watch.wait_for(KILL_AT_STEP, alive=job.running)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    step_after_kill = watch.step()  # None once the rank is gone
    at_kill = latest_complete(ckpt)  # read now: keep_checkpoints prunes it after the resume
    checkpoint_step_at_kill = (read_manifest(at_kill) or {}).get("step") if at_kill else None
    return step_at_kill, step_after_kill, checkpoint_step_at_kill, killed_at


def _stopped_then_resumed(first: JobResult, target: str, honcho_jobs, tmp_path, ckpt):
    """The faulted job stopped: check honcho's stop, run the same Procfile with ``--resume``
    from the latest complete checkpoint to the end of the epoch and check it.

    Returns (the resumed run's result, the checkpoint's manifest, seconds from the resumed
    start until training again)."""
    honcho_entry = HONCHO_ENTRY.get(target, target)
    # a clear stop: honcho names the process that died and every other one stops
    assert honcho_entry in first.stops, first.log[-4000:]
    assert first.stops[honcho_entry] != "0", first.stops
    checkpoint = latest_complete(ckpt)
    base = read_manifest(checkpoint)
    resumed = honcho_jobs(
        tmp_path, ckpt, every_n_steps=CHECKPOINT_EVERY, resume=True, name="resumed"
    ).start()
    resumed.wait_for_log(r"resumed from \S+: step \d+")
    resumed_s = time.monotonic() - resumed.started
    final = resumed.wait()
    _assert_completed(final)
    assert final.resumed_step == base["step"], final.log[-3000:]
    # every batch of the epoch trained exactly once: before the checkpoint or after it
    assert final.resumed_step + final.steps == EPOCH_STEPS, (final.resumed_step, final.steps)
    return final, base, resumed_s


@pytest.mark.parametrize("target", FAULTS)
def test_kill9_mid_job_then_resume_loses_no_acknowledged_update(
    target, unfaulted, honcho_jobs, tmp_path
):
    ckpt = tmp_path / "ckpt"
    job = honcho_jobs(tmp_path, ckpt, every_n_steps=CHECKPOINT_EVERY, name="faulted").start()
    step_at_kill, step_after_kill, checkpoint_step_at_kill, killed_at = _kill9_mid_job(
        job, target, ckpt
    )
    reregistered_s = _wait_reregistered(job, killed_at) if target == "redis" else None
    first = job.wait(timeout_s=120)
    stopped_s = time.monotonic() - killed_at
    if first.returncode == 0:  # the job completed despite the fault
        final, base, resumed_s = first, {"updates_applied_total": 0}, 0.0
        outcome = "completed"
        stopped_s = 0.0  # it never stopped
        assert first.steps == EPOCH_STEPS, first.log[-3000:]
    else:
        final, base, resumed_s = _stopped_then_resumed(first, target, honcho_jobs, tmp_path, ckpt)
        outcome = "stopped, resumed"
    assert final.updates_applied is not None, final.log[-3000:]
    held = base["updates_applied_total"] + final.updates_applied
    lost = unfaulted.updates_applied - held
    replayed = (
        first.updates_applied - base["updates_applied_total"]
        if first.updates_applied is not None and outcome != "completed"
        else None
    )
    delta = abs(final.auc - unfaulted.auc)
    row = {
        "outcome": outcome,
        "step_at_kill": step_at_kill,
        "step_read_after_kill": step_after_kill,
        "epoch_steps": EPOCH_STEPS,
        "killed_after_checkpoint_step": base.get("step"),
        "auc": final.auc,
        "auc_delta": round(delta, 4),
        "lost_updates": lost,
        "replayed_updates": replayed,
        "stop_seconds": round(stopped_s, 1),
        "resume_to_training_seconds": round(resumed_s, 1),
        "recovery_seconds": round(stopped_s + resumed_s, 1),
    }
    if target == "redis" and outcome == "completed":  # riding through
        if reregistered_s is None:
            row["reregistered_seconds"] = "job finished first"
        else:  # recovered once every record is back
            row["reregistered_seconds"] = row["recovery_seconds"] = round(reregistered_s, 1)
    _record(f"kill9_{target}", row)
    print(f"kill -9 {target}: {row}")
    # mid-job: past the first checkpoint, before the second, well before the end
    assert checkpoint_step_at_kill == CHECKPOINT_EVERY, row
    assert KILL_AT_STEP <= step_at_kill < MID_JOB_LIMIT * EPOCH_STEPS, row
    if outcome != "completed":
        assert base["step"] == CHECKPOINT_EVERY, row  # no checkpoint after the kill
    if target == "redis":  # restarted by the Procfile's supervisor: no stop, no rollback
        assert outcome == "completed", row
        assert "redis-server (--port" in first.log and "restarting it empty" in first.log
    assert lost == 0, row
    assert delta <= AUC_TOLERANCE, row
