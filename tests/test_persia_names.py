"""PERSIA's helpers outside the contexts: persia.env, persia.utils, persia.logger, persia.prelude,
persia.service, and the lenient constructor arguments PERSIA accepted (no services needed
unless noted)."""

from __future__ import annotations

import logging
import os
import socket

import numpy as np
import pytest

from persia import env
from persia.ctx import BaseCtx, PreprocessMode, _prepare_feature
from persia.data import DataLoader, StreamingDataset
from persia.embedding.data import IDTypeFeature, Label, PersiaBatch
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.batch import DenseArray, DensePart
from tests.nn_helpers import environ, job_services


@pytest.fixture(autouse=True)
def _fresh_env():
    env.reload_env()
    yield
    env.reload_env()


def test_set_env_sets_what_the_getters_return_until_reload():
    with environ(
        RANK=None, LOCAL_RANK=None, WORLD_SIZE=None, REPLICA_INDEX=None, REPLICA_SIZE=None
    ):
        env.set_env(world_size=4, rank=2, local_rank=0)
        assert (env.get_world_size(), env.get_rank(), env.get_local_rank()) == (4, 2, 0)
        assert env.get_replica_index() is None  # left out: None, as in PERSIA
        env.reload_env()
        assert env.get_rank() is None and env.get_replica_size() == 1


def test_persia_switches_are_read_when_asked_for():
    with environ(PERSIA_SKIP_CHECK_DATA="1", PERSIA_LAUNCHER_VERBOSE=None):
        from persia.env import PERSIA_LAUNCHER_VERBOSE, PERSIA_SKIP_CHECK_DATA

        assert PERSIA_SKIP_CHECK_DATA is True and PERSIA_LAUNCHER_VERBOSE is False
    with (
        environ(PERSIA_SKIP_CHECK_DATA="yes"),
        pytest.raises(Exception, match="PERSIA_SKIP_CHECK_DATA"),
    ):
        env.skip_check_data()


def test_utils_yaml_ports_and_commands(tmp_path, caplog):
    from persia.utils import (
        dump_yaml,
        find_free_port,
        load_yaml,
        resolve_binary_execute_path,
        run_command,
    )

    path = tmp_path / "c.yml"
    dump_yaml({"a": {"b": 1}}, path)
    assert load_yaml(path) == {"a": {"b": 1}}
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert find_free_port(port) > port
    with pytest.raises(ValueError, match="port"):
        find_free_port(70000)
    assert os.path.exists(resolve_binary_execute_path("python"))
    with environ(PERSIA_LAUNCHER_VERBOSE="1"), caplog.at_level("INFO", logger="persia.utils"):
        run_command(["true"])
    assert "execute command: true" in caplog.text
    with pytest.raises(Exception, match="returned non-zero"):
        run_command(["false"])


def test_set_logger_configures_the_named_logger(tmp_path):
    from persia.logger import FORMATTER, levelFilter, set_default_logger, setLogger

    log_file = tmp_path / "t.log"
    logger = setLogger(
        "persia-test-setlogger",
        log_level=logging.INFO,
        log_filename=str(log_file),
        enable_file_logger=True,
    )
    logger.debug("hidden")
    logger.info("shown")
    for handler in logger.handlers:
        handler.flush()
    assert log_file.read_text().count("shown") == 1 and "hidden" not in log_file.read_text()
    assert isinstance(FORMATTER, logging.Formatter)
    assert levelFilter(logging.INFO).filter(logging.makeLogRecord({"levelno": logging.WARNING}))
    assert set_default_logger() is set_default_logger()


def test_prelude_dtype_check_and_channel():
    from persia.prelude import PersiaBatchDataChannel, check_pyarray_dtype_valid

    check_pyarray_dtype_valid(np.zeros(2, np.float32), np.float32)
    with pytest.raises(TypeError, match="float16"):
        check_pyarray_dtype_valid(np.zeros(2, np.float16), np.float16)
    with pytest.raises(TypeError, match="expected float32"):
        check_pyarray_dtype_valid(np.zeros(2, np.float64), np.float32)
    channel = PersiaBatchDataChannel(1)
    batch = PersiaBatch([IDTypeFeature("a", [np.array([1], np.uint64)])], requires_grad=False)
    channel.get_sender().send(batch)
    assert channel.get_receiver().receive(100) is batch
    with pytest.raises(TimeoutError):
        channel.get_receiver().receive(10)
    assert batch.data is batch


def test_prepare_feature_gives_tensors_of_a_batch():
    from pyrsia.services.nn_worker.batch import PersiaTrainingBatch

    dense = DensePart(
        batch_size=2,
        non_id_type_features=(DenseArray(None, np.ones((2, 3), np.float32)),),
        labels=(DenseArray(None, np.zeros((2, 1), np.float32)),),
        meta=None,
    )
    batch = PersiaTrainingBatch(dense, [("a", np.ones((2, 4), np.float32))], requires_grad=False)
    non_id, embeddings, labels = _prepare_feature(batch, PreprocessMode.EVAL)
    assert non_id[0].shape == (2, 3) and embeddings[0].shape == (2, 4) and labels[0].shape == (2, 1)
    assert not embeddings[0].requires_grad
    assert _prepare_feature(batch, PreprocessMode.INFERENCE)[2] is None


def test_negative_device_id_means_cpu_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="persia.ctx"):
        ctx = BaseCtx(device_id=-1)
    assert ctx.device_id is None
    assert "device_id=-1" in caplog.text and "PERSIA" in caplog.text


def test_service_default_is_persias_embedding_worker(job_env):
    from persia.service import get_embedding_worker_services

    with environ(EMBEDDING_WORKER_SERVICE=None):
        assert get_embedding_worker_services() == ["embedding_worker:8887"]
    with environ(EMBEDDING_WORKER_SERVICE="a:1, b:2"):
        assert get_embedding_worker_services() == ["a:1", "b:2"]


def test_dataloader_timeout_ends_the_loop_with_a_warning(job_env, tmp_path, caplog):
    """Services: a PS and an embedding worker; no data loader runs, so no batch comes."""
    with job_services(job_env, tmp_path), environ(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"):
        env.reload_env()
        with BaseCtx() as ctx, caplog.at_level("WARNING", logger="persia.data"):
            ctx.common_context.wait_servers_ready()
            assert list(DataLoader(StreamingDataset(buffer_size=2), timeout_ms=300)) == []
    assert "timeout_ms=300 after 0 batch(es)" in caplog.text and "PERSIA" in caplog.text


def test_optimizer_apply_registers_it_through_the_current_context(job_env, tmp_path):
    """Services: a PS and an embedding worker. Before apply() the PS refuses lookups (no
    optimizer); after it, an eval lookup answers."""
    from persia.ctx import eval_ctx
    from persia.embedding import EmbeddingConfig
    from persia.embedding.optim import SGD

    batch = PersiaBatch(
        [IDTypeFeature("a", [np.array([1, 2], np.uint64)])],
        labels=[Label(np.zeros((1, 1), np.float32))],
        requires_grad=False,
    )
    with pytest.raises(RuntimeError, match="inside"):
        SGD(lr=0.1).apply()
    with job_services(job_env, tmp_path), eval_ctx(embedding_config=EmbeddingConfig()) as ctx:
        SGD(lr=0.1).apply()
        looked_up = ctx.get_embedding_from_data(batch)
        assert ctx.prepare_features(looked_up)[1][0].shape == (1, 4)


def test_metrics_default_is_persias_and_true_without_a_gateway_only_logs_info(caplog):
    """PERSIA's persia-embedding-config: ``#[serde(default = "get_false")] enable_metrics``."""
    from pyrsia.shared.config import parse_global_config
    from pyrsia.shared.config_schema import MetricsConfig
    from pyrsia.shared.metrics_push import push_settings

    assert (
        parse_global_config(
            {}, source="global_config.yml"
        ).common_config.metrics_config.enable_metrics
        is False
    )
    with caplog.at_level("DEBUG"):
        assert push_settings(MetricsConfig(enable_metrics=True), Settings.from_env({})) is None
    assert caplog.records and all(r.levelno <= logging.INFO for r in caplog.records)
