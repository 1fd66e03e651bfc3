"""Periodic-checkpoint settings and the job checkpoint layout (commit marker, newest complete,
pruning, data position)."""

from __future__ import annotations

import numpy as np
import pytest

from pyrsia.shared import job_checkpoint as jc
from pyrsia.shared.config import parse_global_config
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings


def _checkpointing(**keys):
    data = {"common_config": {"checkpointing_config": keys}}
    return parse_global_config(data, source="global_config.yml").common_config.checkpointing_config


def test_periodic_checkpoint_keys_are_read_and_default_off():
    assert not _checkpointing().periodic
    c = _checkpointing(checkpoint_dir="/ckpt", checkpoint_every_n_steps=50, keep_checkpoints=3)
    assert (c.checkpoint_dir, c.checkpoint_every_n_steps, c.keep_checkpoints) == ("/ckpt", 50, 3)
    assert c.periodic and c.checkpoint_every_n_seconds == 0


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"checkpoint_every_n_steps": 10}, "checkpointing_config.checkpoint_dir: is required"),
        ({"checkpoint_every_n_seconds": 60}, "checkpointing_config.checkpoint_dir: is required"),
        ({"checkpoint_dir": "/c", "checkpoint_every_n_steps": -1}, "a non-negative integer"),
        ({"checkpoint_dir": "/c", "checkpoint_every_n_seconds": "10"}, 'got "10"'),
        ({"checkpoint_dir": 5, "checkpoint_every_n_steps": 1}, "checkpoint_dir: expected a string"),
        ({"keep_checkpoints": 0}, "keep_checkpoints: expected a positive integer"),
    ],
)
def test_bad_checkpoint_settings_name_the_key(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _checkpointing(**keys)


def test_resume_flag_env_is_validated():
    assert jc.resume_requested(Settings.from_env({"PERSIA_RESUME": "1"}))
    with pytest.raises(ConfigError, match="PERSIA_RESUME: expected 0 or 1"):
        jc.resume_requested(Settings.from_env({"PERSIA_RESUME": "yes"}))


def _write(root, step, ranks, *, commit=True):
    directory = jc.step_dir(root, step)
    for rank, ids in ranks.items():
        jc.save_data_position(directory, rank, ids)
    if commit:
        jc.commit(directory, {"step": step})
    return directory


def test_only_committed_checkpoints_count_and_the_newest_wins(tmp_path):
    assert jc.latest_complete(tmp_path / "missing") is None
    _write(tmp_path, 50, {0: [0, 2]})
    newest = _write(tmp_path, 100, {0: [0, 2, 4], 1: [1, 3]})
    _write(tmp_path, 150, {0: [0, 2, 4, 6]}, commit=False)  # crashed before its manifest
    assert jc.latest_complete(tmp_path) == newest
    assert jc.trained_batch_ids(newest).tolist() == [0, 1, 2, 3, 4]
    assert jc.trained_batch_ids(newest).dtype == np.uint64
    (newest / jc.MANIFEST).write_text("{not json")
    assert jc.latest_complete(tmp_path).name == "step_0000000050"


def test_prune_keeps_the_newest_and_drops_stale_incomplete_dirs(tmp_path):
    for step in (50, 100, 150):
        _write(tmp_path, step, {0: [step]})
    _write(tmp_path, 120, {0: [1]}, commit=False)  # older than the newest complete one
    _write(tmp_path, 200, {0: [2]}, commit=False)  # may be being written right now
    jc.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_0000000100",
        "step_0000000150",
        "step_0000000200",
    ]


def test_a_resumed_data_loader_replica_skips_its_own_trained_batches(tmp_path):
    from pyrsia.shared.constants import ENV_GLOBAL_CONFIG

    glob = tmp_path / "global_config.yml"
    glob.write_text(f"common_config:\n  checkpointing_config:\n    checkpoint_dir: {tmp_path}\n")
    settings = Settings.from_env({ENV_GLOBAL_CONFIG: str(glob)})
    assert jc.resumed_batch_ids(0, 1, settings) == frozenset()  # no checkpoint: send everything
    _write(tmp_path, 100, {0: [0, 2, 4, 5], 1: [1, 3, 7]})
    assert jc.resumed_batch_ids(0, 1, settings) == {0, 1, 2, 3, 4, 5, 7}  # embedded: one loader
    assert jc.resumed_batch_ids(0, 2, settings) == {0, 2, 4}  # replica 0 of 2: ids 0, 2, 4, ...
    assert jc.resumed_batch_ids(1, 2, settings) == {1, 3, 5, 7}


async def test_reproducible_order_steps_over_batches_trained_before_the_resume():
    from pyrsia.services.nn_worker.ingress import BatchQueue
    from pyrsia.shared.wire.ingress import IngressBatch

    # rank 1 of 2 expects 1, 3, 5, ...; 1 and 5 were trained before the checkpoint
    queue = BatchQueue(4, rank=1, world_size=2, reproducible=True, skip=frozenset({0, 1, 5}))
    for batch_id in (7, 3):
        await queue.put(IngressBatch(loader=0, batch_id=batch_id, worker=0, dense=None))  # type: ignore[arg-type]
    await queue.done(loader=0, loader_count=1, sent=2)
    assert [(await queue.get()).batch_id for _ in range(2)] == [3, 7]
    assert await queue.get() is None


class _RecordingCheckpointer:
    """The trigger policy of PeriodicCheckpointer with ``save`` recording instead of writing."""

    @staticmethod
    def make(clock=None, **keys):
        from pyrsia.services.nn_worker.checkpointer import PeriodicCheckpointer

        class Recording(PeriodicCheckpointer):
            saved: list[int]

            def save(self, ctx, step):
                self.saved.append(step)

        config = _checkpointing(checkpoint_dir="/unused", **keys)
        checkpointer = Recording(config, 0, 1, **({"clock": clock} if clock else {}))
        checkpointer.saved = []
        return checkpointer


class _Steps:
    update_times = 0


def test_checkpoints_are_due_every_n_steps_or_every_n_seconds():
    by_steps, ctx = _RecordingCheckpointer.make(checkpoint_every_n_steps=3), _Steps()
    for ctx.update_times in range(1, 10):
        by_steps.after_step(ctx)
    assert by_steps.saved == [3, 6, 9]

    now = [100.0]
    by_time = _RecordingCheckpointer.make(clock=lambda: now[0], checkpoint_every_n_seconds=60)
    for ctx.update_times, now[0] in [(1, 130.0), (2, 160.5), (3, 170.0), (4, 221.0)]:
        by_time.after_step(ctx)
    assert by_time.saved == [2, 4]  # 60.5 s after the start, then 60.5 s after that one


def test_a_failed_training_loop_names_the_checkpoint_to_resume_from(tmp_path, caplog):
    from pyrsia.services.nn_worker.checkpointer import PeriodicCheckpointer

    config = _checkpointing(checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=50)
    checkpointer = PeriodicCheckpointer(config, 0, 2)
    checkpointer.report_stop()
    assert "before the first complete checkpoint" in caplog.text
    caplog.clear()
    _write(tmp_path, 50, {0: [0, 2]})
    _write(tmp_path, 100, {0: [0, 2, 4]}, commit=False)  # not complete: not the one
    checkpointer.report_stop()
    assert f"checkpoint is {jc.step_dir(tmp_path, 50)} (step 50)" in caplog.text
    assert "--resume (docker compose: PERSIA_RESUME=1)" in caplog.text
    caplog.clear()
    PeriodicCheckpointer(_checkpointing(), 0, 1).report_stop()  # no periodic checkpoints
    assert caplog.text == ""
