"""Embedded mode's plumbing (pyrsia/services/embedded/): the variable that selects
it, the data loader's batches handed over in process, and a failing loader ending the stream."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from pyrsia.services.embedded.job import (
    EmbeddedSession,
    get_embedded_job,
    reset_embedded_job,
)
from pyrsia.services.embedded.mode import embedded_requested
from pyrsia.services.embedded.sender import EmbeddedSender
from pyrsia.shared.constants import (
    ENV_CPU_PRIORITY,
    ENV_DATALOADER_ENTRY,
    ENV_EMBEDDED,
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
)
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings
from tests.nn_helpers import EMBEDDING_CONFIG, make_batch


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        (" ON ", True),
        ("yes", True),
        ("", False),
        ("0", False),
        ("false", False),
        ("off", False),
        (None, False),
    ],
)
def test_persia_embedded_selects_the_mode(value, expected):
    environ = {} if value is None else {ENV_EMBEDDED: value}
    assert embedded_requested(environ) is expected


@pytest.mark.parametrize("value", ["2", "embedded", "y e s"])
def test_a_bad_persia_embedded_names_the_variable(value):
    with pytest.raises(ConfigError, match=rf"\$PERSIA_EMBEDDED='{value}': expected 1"):
        embedded_requested({ENV_EMBEDDED: value})


@pytest.fixture
def embedded_env(tmp_path, monkeypatch):
    """PERSIA_EMBEDDED=1 with the helpers' embedding config and a small forward buffer; a
    fresh engine before and after."""
    emb = tmp_path / "embedding_config.yml"
    emb.write_text(EMBEDDING_CONFIG)
    glob = tmp_path / "global_config.yml"
    glob.write_text(
        "embedding_parameter_server_config: {capacity: 100000, num_hashmap_internal_shards: 2}\n"
        "embedding_worker_config: {forward_buffer_size: 3}\n"
    )
    for key, value in {
        ENV_EMBEDDED: "1",
        ENV_EMBEDDING_CONFIG: str(emb),
        ENV_GLOBAL_CONFIG: str(glob),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(ENV_DATALOADER_ENTRY, raising=False)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "REPLICA_INDEX", "REPLICA_SIZE"):
        monkeypatch.delenv(key, raising=False)
    reset_embedded_job()
    yield tmp_path
    reset_embedded_job()


def _send(batches, errors: list) -> None:
    try:
        sender = EmbeddedSender(
            0, 1, wait_timeout_s=30, send_timeout_s=30, max_inflight=4, settings=Settings.from_env()
        )
        sender.open()
        for b in batches:
            sender.send(b)
        sender.finish()
        sender.close()
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_batches_reach_the_training_loop_in_order_through_the_bounds(embedded_env):
    """12 batches through a queue of 2 and a forward buffer of 3: every one arrives, in batch
    order, and its buffered embeddings are those of a direct lookup of the same ids."""
    session = EmbeddedSession.open(Settings.from_env())
    client, runtime = session.client, session.runtime
    runtime.run(client.configure({"emb_initialization": [-0.1, 0.1]}))
    runtime.run(client.register_optimizer({"type": "sgd", "lr": 0.1}))
    queue = session.ingress(rank=0, world_size=1, capacity=2, reproducible=True)
    batches = [make_batch([10 * i + j for j in range(5)], seed=i) for i in range(12)]
    errors: list = []
    loader = threading.Thread(target=_send, args=(batches, errors))
    loader.start()

    async def consume() -> list[tuple[int, np.ndarray, np.ndarray]]:
        seen = []
        while (item := await queue.get()) is not None:
            buffered, trainable = await client.lookup(
                item.worker, item.batch_id, True, item.dense.batch_size
            )
            assert trainable and buffered.batch_id == item.batch_id
            ids = batches[item.batch_id].id_part()
            direct, _ = await client.lookup_direct(ids, False)
            seen.append(
                (
                    item.batch_id,
                    np.asarray(buffered.embeddings[0][1]),
                    np.asarray(direct.embeddings[0][1]),
                )
            )
            assert len(client.worker.forward) <= 3  # the loader's forward buffer bound
            grads = [(n, np.ones_like(d)) for n, d in buffered.embeddings]
            await client.gradients(0, item.batch_id, 1.0, grads)
        return seen

    seen = runtime.run(consume(), timeout_s=60)
    loader.join(30)
    session.close()
    assert not errors
    assert [b for b, _, _ in seen] == list(range(12))
    for batch_id, buffered, direct in seen:
        np.testing.assert_array_equal(buffered, direct, err_msg=str(batch_id))


def test_a_failing_data_loader_ends_the_training_loops_stream_with_its_error(embedded_env):
    script = embedded_env / "data_loader.py"
    script.write_text("raise RuntimeError('no such data file: /data/census.npz')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_DATALOADER_ENTRY, str(script))
        reset_embedded_job()
        session = EmbeddedSession.open(Settings.from_env())  # starts the loader thread
    queue = session.ingress(rank=0, world_size=1, capacity=4, reproducible=False)
    get_embedded_job(Settings.from_env()).join_loader(30)
    with pytest.raises(RuntimeError, match="no such data file"):
        session.runtime.run(queue.get(), timeout_s=30)
    session.close()


def test_embedded_mode_has_one_loader_and_one_rank(embedded_env):
    with pytest.raises(ConfigError, match="replica 1 of 2"):
        EmbeddedSender(
            1, 2, wait_timeout_s=1, send_timeout_s=1, max_inflight=1, settings=Settings.from_env()
        )
    session = EmbeddedSession.open(Settings.from_env())
    with pytest.raises(ConfigError, match="one NN-worker rank, not 2"):
        session.ingress(rank=0, world_size=2, capacity=4, reproducible=False)
    session.close()
    sender = EmbeddedSender(
        0, 1, wait_timeout_s=0.2, send_timeout_s=1, max_inflight=1, settings=Settings.from_env()
    )
    with pytest.raises(Exception, match="no training loop took batches"):
        sender.open()  # no StreamingDataset opened a queue


def test_embedded_mode_needs_the_embedding_config(embedded_env, monkeypatch):
    monkeypatch.delenv(ENV_EMBEDDING_CONFIG)
    with pytest.raises(ConfigError, match="PERSIA_EMBEDDING_CONFIG"):
        get_embedded_job(Settings.from_env())


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
def test_the_engine_threads_run_in_the_idle_class_while_a_context_is_open(embedded_env):
    """The loop thread is in SCHED_IDLE from the first open session to the last close (an
    eval context opened and closed inside a training one leaves it there), the data loader's
    thread for its whole run; the training thread keeps its class."""
    script = embedded_env / "data_loader.py"
    seen = embedded_env / "loader_policy.txt"
    script.write_text(
        f"import os, pathlib\npathlib.Path({str(seen)!r}).write_text(str(os.sched_getscheduler(0)))\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_DATALOADER_ENTRY, str(script))
        reset_embedded_job()
        training = EmbeddedSession.open(Settings.from_env())
    loop_thread = training.runtime.native_id
    get_embedded_job(Settings.from_env()).join_loader(30)
    assert seen.read_text() == str(os.SCHED_IDLE)
    assert os.sched_getscheduler(loop_thread) == os.SCHED_IDLE
    evaluation = EmbeddedSession.open(Settings.from_env())
    evaluation.close()
    evaluation.close()  # closing twice counts once
    assert os.sched_getscheduler(loop_thread) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    training.close()
    assert os.sched_getscheduler(loop_thread) == os.SCHED_OTHER


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
def test_persia_cpu_priority_normal_keeps_the_engine_threads_in_the_default_class(
    embedded_env, monkeypatch
):
    monkeypatch.setenv(ENV_CPU_PRIORITY, "normal")
    reset_embedded_job()
    session = EmbeddedSession.open(Settings.from_env())
    try:
        assert os.sched_getscheduler(session.runtime.native_id) == os.SCHED_OTHER
    finally:
        session.close()
