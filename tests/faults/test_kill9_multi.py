"""kill -9 of one PS replica of three in ``Procfile.multi`` (two NN-worker ranks, two embedding
workers, two data loaders), then ``--resume``: the checkpoint is one point in time across the
three shards and both ranks, so no acknowledged update is lost and every batch of the epoch
is trained exactly once (see test_kill9.py for how the figures are defined). The replica is
killed when rank 0 has finished step 30 of its 128 (checkpoints every 20 steps)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pyrsia.shared.job_checkpoint import latest_complete, read_manifest
from tests.faults.honcho_job import HonchoJob
from tests.faults.test_kill9 import AUC_TOLERANCE, MID_JOB_LIMIT, _record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHECKPOINT_EVERY = 20  # steps per rank: 40 batches of the job
# The whole epoch: 255 batches, 128 on rank 0 and 127 on rank 1 (rank 1 shadows the last step)
EPOCH_STEPS = 255
STEPS_PER_RANK = 128  # synchronous steps of each rank
KILL_AT_STEP = 30  # rank 0's step: after the step-20 checkpoint, before the step-40 one


def _job(make, work, ckpt, name, *, resume=False) -> HonchoJob:
    return make(
        work,
        ckpt,
        every_n_steps=CHECKPOINT_EVERY,
        resume=resume,
        name=name,
        procfile="Procfile.multi",
    )


def test_kill9_one_of_three_ps_replicas_with_two_ranks_then_resume(honcho_jobs, tmp_path):
    unfaulted = (
        _job(honcho_jobs, tmp_path / "u", tmp_path / "u" / "ckpt", "unfaulted").start().wait()
    )
    assert unfaulted.returncode == 0, unfaulted.log[-4000:]
    assert unfaulted.total_steps == EPOCH_STEPS and unfaulted.updates_applied

    ckpt = tmp_path / "ckpt"
    job = _job(honcho_jobs, tmp_path, ckpt, "faulted").start()
    pid = job.pid_of("embedding_parameter_server", replica_index=1)
    step_at_kill = job.steps(rank=0).wait_for(KILL_AT_STEP, alive=job.running)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    at_kill = latest_complete(ckpt)
    checkpoint_step_at_kill = (read_manifest(at_kill) or {}).get("step") if at_kill else None
    first = job.wait(timeout_s=120)
    stopped_s = time.monotonic() - killed_at
    assert first.stops.get("embedding_parameter_server_1") == "-9", first.stops
    base = read_manifest(latest_complete(ckpt))
    assert base["ps_replicas"] == 3 and base["world_size"] == 2
    resumed = _job(honcho_jobs, tmp_path, ckpt, "resumed", resume=True).start()
    resumed.wait_for_log(r"resumed from \S+: step \d+")
    resumed_s = time.monotonic() - resumed.started
    final = resumed.wait()
    assert final.returncode == 0, final.log[-4000:]
    lost = unfaulted.updates_applied - (base["updates_applied_total"] + final.updates_applied)
    row = {
        "outcome": "stopped, resumed",
        "step_at_kill": step_at_kill,
        "steps_per_rank": STEPS_PER_RANK,
        "killed_after_checkpoint_step": base["step"],
        "auc": final.auc,
        "auc_delta": round(abs(final.auc - unfaulted.auc), 4),
        "lost_updates": lost,
        "batches_before_checkpoint": base["trained_batches"],
        "batches_after_resume": final.total_steps,
        "stop_seconds": round(stopped_s, 1),
        "resume_to_training_seconds": round(resumed_s, 1),
        "recovery_seconds": round(stopped_s + resumed_s, 1),
    }
    _record("kill9_multi_ps_replica_1_of_3", row)
    print(f"kill -9 PS replica 1 of 3 (Procfile.multi): {row}")
    assert checkpoint_step_at_kill == base["step"] == CHECKPOINT_EVERY, row
    assert KILL_AT_STEP <= step_at_kill < MID_JOB_LIMIT * STEPS_PER_RANK, row
    assert base["trained_batches"] + final.total_steps == EPOCH_STEPS, row
    assert lost == 0, row
    assert row["auc_delta"] <= AUC_TOLERANCE, row
