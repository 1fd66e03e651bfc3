"""One host's link cut mid-job (10 s; a PS for 45 s, 100 s, and until the job stops), then
restored (the 9-host layout of test_multi_host).

For each target host (a PS replica, an embedding worker, NN-worker node 1, Redis) the job
runs with a checkpoint every 40 steps; when NN-worker rank 0 has finished step 60, the
target's switch port goes down (its cable pulled: nothing crosses, in either direction;
open TCP connections stay open and retransmit) and comes back 10 s later. Then either the
job completes, or it stops with an error naming what failed and the same layout with
``--resume`` finishes the epoch from the last checkpoint. A PS cut past the request
deadlines must stop the job with a line naming the peer and the cause, the embedding workers
having named ps0 every 5 s meanwhile; ``--resume`` then finishes the epoch.

Figures per target, against an unfaulted run of the same layout (see tests/faults/
test_kill9.py for the definitions): outcome, the rank-0 steps taken while the link was
down, seconds from restore until rank 0 stepped again, AUC delta, lost acknowledged
updates (must be 0: every batch's embedding update is in the final model exactly once).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from pyrsia.shared.job_checkpoint import latest_complete, read_manifest
from tests.cluster.job import FULL, ClusterJob
from tests.cluster.netns import Network

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EPOCH_BATCHES = 255
CHECKPOINT_EVERY = 40
CUT_AT_STEP = 60
AUC_TOLERANCE = 0.005
# (host, seconds cut): 10 s each; and a PS cut for longer than the embedding worker's 30 s
# PS retry window (PS_RETRY_WINDOW_S). That window counts failed attempts, and a silent
# partition fails none: the open request waits out its 60 s timeout (HttpClient's
# DEFAULT_REQUEST_TIMEOUT_S), so 45 s rides through (measured), and so did 100 s once
# (measured); the workers log the wait every 5 s (HttpClient's stall reports)
TARGETS = [
    ("ps0", 10.0),
    ("ew0", 10.0),
    ("nn1", 10.0),
    ("redis", 10.0),
    ("ps0", 45.0),
    ("ps0", 100.0),
]


@pytest.fixture(scope="module")
def unfaulted(netns_reason, tmp_path_factory):
    if netns_reason is not None:
        pytest.skip(f"cluster in a box needs network namespaces: {netns_reason}")
    work = tmp_path_factory.mktemp("unfaulted")
    with Network(FULL.hosts()) as net:
        job = ClusterJob(net, work, every_n_steps=CHECKPOINT_EVERY, name="unfaulted").start()
        try:
            result = job.wait(timeout_s=240)
        finally:
            job.stop()
    assert all(c == 0 for c in result.codes.values()), result.tail()
    assert sum(result.steps.values()) == EPOCH_BATCHES and result.updates_applied
    return result


def _step_watch(job: ClusterJob, until: float) -> list[tuple[float, int]]:
    """Rank 0's step, polled until ``until`` (monotonic): (time, step) samples."""
    samples = []
    while time.monotonic() < until:
        step = job.step(0)
        if step is not None:
            samples.append((time.monotonic(), step))
        time.sleep(0.1)
    return samples


def _cut_then_restore(net: Network, job: ClusterJob, target: str, cut_seconds: float):
    """Cut ``target``'s link for ``cut_seconds`` (rank 0's step polled meanwhile), restore it,
    and wait (at most 120 s, while the trainers run) for rank 0 to step again.

    Returns (rank 0's step at the cut, the (time, step) samples while cut, its step at the
    restore, seconds from the restore to its next step or None)."""
    net.cut(target)
    cut_at = time.monotonic()
    step_at_cut = job.step(0)
    samples = _step_watch(job, cut_at + cut_seconds)
    net.restore(target)
    restored_at = time.monotonic()
    step_at_restore = job.step(0)
    # how long until rank 0 steps again (or the job ends)
    resumed_s = None
    while time.monotonic() - restored_at < 120 and job.trainers_running():
        now = job.step(0)
        if now is not None and step_at_restore is not None and now > step_at_restore:
            resumed_s = time.monotonic() - restored_at
            break
        time.sleep(0.05)
    return step_at_cut, samples, step_at_restore, resumed_s


def _assert_resumed_the_epoch(final, base: dict) -> None:
    """The ``--resume`` run exited 0 everywhere, started from the checkpoint ``base`` and
    trained the rest of the epoch: every batch once, before the checkpoint or after it."""
    assert all(c == 0 for c in final.codes.values()), final.tail()
    assert final.resumed_step == base["step"], final.tail()
    assert base["trained_batches"] + sum(final.steps.values()) == EPOCH_BATCHES


@pytest.mark.parametrize(
    ("target", "cut_seconds"), TARGETS, ids=[f"{h}-{s:g}s" for h, s in TARGETS]
)
def test_link_cut_mid_job(target, cut_seconds, unfaulted, network, tmp_path):
    net = network(FULL.hosts())
    job = ClusterJob(net, tmp_path, every_n_steps=CHECKPOINT_EVERY, name="faulted").start()
    resumed_job = None
    try:
        job.wait_for_step(CUT_AT_STEP)
        step_at_cut, samples, step_at_restore, resumed_s = _cut_then_restore(
            net, job, target, cut_seconds
        )
        first = job.wait(timeout_s=time.monotonic() - job.started + 180)
        steps_during_cut = (samples[-1][1] - samples[0][1]) if samples else None
        completed = not first.timed_out and all(c == 0 for c in first.codes.values())
        if completed:
            outcome, final, base = "completed", first, {"updates_applied_total": 0}
            assert sum(first.steps.values()) == EPOCH_BATCHES, first.steps
        else:
            outcome = "hung, stopped, resumed" if first.timed_out else "stopped, resumed"
            base = read_manifest(latest_complete(job.checkpoint_dir))
            resumed_job = ClusterJob(
                net, tmp_path, every_n_steps=CHECKPOINT_EVERY, resume=True, name="resumed"
            )
            resumed_job.start()
            final = resumed_job.wait(timeout_s=300)
            _assert_resumed_the_epoch(final, base)
        assert final.updates_applied is not None, final.tail()
        lost = unfaulted.updates_applied - (base["updates_applied_total"] + final.updates_applied)
        errors = {
            h: [ln for ln in t.splitlines() if " ERROR " in ln or "Error" in ln][:3]
            for h, t in first.logs.items()
        }
        row = {
            "target": target,
            "cut_seconds": cut_seconds,
            "outcome": outcome,
            "first_run_codes": first.codes,
            "step_at_cut": step_at_cut,
            "rank0_steps_while_cut": steps_during_cut,
            "step_at_restore": step_at_restore,
            "seconds_from_restore_to_next_step": None if resumed_s is None else round(resumed_s, 1),
            "resumed_from_step": base.get("step"),
            "auc": final.auc,
            "auc_delta": round(abs(final.auc - unfaulted.auc), 4),
            "lost_updates": lost,
            "first_run_seconds": round(first.seconds, 1),
            "errors": {h: e for h, e in errors.items() if e},
        }
        print(f"\npartition {target} {cut_seconds:g}s: {json.dumps(row, indent=1)}")
        assert lost == 0, row
        assert row["auc_delta"] <= AUC_TOLERANCE, row
    finally:
        job.stop()
        if resumed_job is not None:
            resumed_job.stop()


# A PS cut past the deadlines on the way (100 to 210 s, measured): the NN worker stops on
# whichever gives up first, its own 120 s deadline on the embedding worker (which waits on
# ps0 meanwhile, saying so every 5 s) or the worker's 503 once its PS call (60 s attempts,
# one retry) and 30 s PS retry window are over. The link comes back once the job stopped.
STOP_CUT_LIMIT_S = 300.0
STOP_LINE = re.compile(
    r"(ServiceUnavailableError|GradientSendError|error: nn_worker/\d+): .*"
    r"http://(ew[01]:8887|ps0:8888)/\S+ "
    r"(did not answer within [\d.]+s|answered 503: PS replica 0 unreachable)"
)
STALL_LINE = re.compile(r"no answer from http://ps0:8888/\S+ for ([\d.]+) s")


def _cut_ps0_until_an_nn_worker_stops(net: Network, job: ClusterJob) -> float:
    """Cut ps0's link until an NN-worker node's process exits (at most STOP_CUT_LIMIT_S),
    then restore it. Returns the seconds from the cut to that stop."""
    net.cut("ps0")
    cut_at = time.monotonic()
    while time.monotonic() - cut_at < STOP_CUT_LIMIT_S and all(
        job.procs[h].poll() is None for h in job.procs if h.startswith("nn")
    ):
        time.sleep(0.2)
    stopped_after = time.monotonic() - cut_at
    net.restore("ps0")
    return stopped_after


@pytest.mark.timeout(900)  # the unfaulted run, up to 300 s of cut, then the resumed run
def test_ps_cut_past_the_deadline_stops_the_job_and_resume_finishes(unfaulted, network, tmp_path):
    """ps0's cable pulled until the job stops: the embedding workers report the silent PS
    every 5 s while it lasts, an NN-worker node stops with a line naming ps0 and the
    timeout, and ``--resume`` finishes the epoch from the last checkpoint that the PS hosts
    wrote, with no acknowledged update lost."""
    net = network(FULL.hosts())
    job = ClusterJob(net, tmp_path, every_n_steps=CHECKPOINT_EVERY, name="faulted").start()
    resumed_job = None
    try:
        job.wait_for_step(CUT_AT_STEP)
        stopped_after = _cut_ps0_until_an_nn_worker_stops(net, job)
        first = job.wait(timeout_s=time.monotonic() - job.started + 60)
        nn_codes = {h: c for h, c in first.codes.items() if h.startswith("nn")}
        assert any(c not in (0, None) for c in nn_codes.values()), (stopped_after, first.tail())
        # the stop: one line naming the peer and the cause
        stop_lines = [
            ln for h in nn_codes for ln in first.logs[h].splitlines() if STOP_LINE.search(ln)
        ]
        assert stop_lines, first.tail(6000)
        # the silence is gone: while the link was down the workers said so every 5 s
        stalls = [float(m[1]) for h in ("ew0", "ew1") for m in STALL_LINE.finditer(first.logs[h])]
        assert len(stalls) >= 10 and max(stalls) >= 50.0, stalls

        manifest_dir = latest_complete(job.checkpoint_dir)
        assert manifest_dir is not None, "no complete checkpoint before the stop"
        base = read_manifest(manifest_dir)
        resumed_job = ClusterJob(
            net, tmp_path, every_n_steps=CHECKPOINT_EVERY, resume=True, name="resumed"
        )
        resumed_job.start()
        final = resumed_job.wait(timeout_s=300)
        _assert_resumed_the_epoch(final, base)
        assert final.updates_applied is not None, final.tail()
        lost = unfaulted.updates_applied - (base["updates_applied_total"] + final.updates_applied)
        row = {
            "target": "ps0",
            "outcome": "stopped, resumed",
            "cut_to_stop_s": round(stopped_after, 1),
            "first_run_codes": first.codes,
            "stop_line": stop_lines[0][-300:],
            "stall_reports": len(stalls),
            "longest_reported_wait_s": max(stalls),
            "resumed_from_step": base["step"],
            "auc": final.auc,
            "auc_delta": round(abs(final.auc - unfaulted.auc), 4),
            "lost_updates": lost,
        }
        print(f"\npartition ps0 until stopped: {json.dumps(row, indent=1)}")
        assert lost == 0, row
        assert row["auc_delta"] <= AUC_TOLERANCE, row
    finally:
        job.stop()
        if resumed_job is not None:
            resumed_job.stop()
