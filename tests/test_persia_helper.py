"""persia.helper.ensure_persia_service: a local job (Redis when needed, PS, embedding worker,
the data-loader function in a thread) that a PERSIA-style test script trains against."""

from __future__ import annotations

import os

import numpy as np
import pytest

from persia import env
from persia.ctx import BaseCtx, DataCtx, PreprocessMode, _prepare_feature
from persia.data import DataLoader, StreamingDataset
from persia.embedding import get_default_embedding_config
from persia.embedding.data import IDTypeFeature, Label, NonIDTypeFeature, PersiaBatch
from persia.embedding.optim import SGD
from persia.helper import ensure_persia_service
from tests.nn_helpers import environ

EMBEDDING_CONFIG = {"slots_config": {"age": {"dim": 8}}}


def _batch(i: int) -> PersiaBatch:
    return PersiaBatch(
        [IDTypeFeature("age", [np.array([i, i + 1], np.uint64)])],
        non_id_type_features=[NonIDTypeFeature(np.full((1, 2), i, np.float32))],
        labels=[Label(np.full((1, 1), i, np.float32))],
        requires_grad=False,
    )


def _send_two():
    with DataCtx() as ctx:
        ctx.send_data(_batch(1))
        ctx.send_data(_batch(2))


def test_streamed_batches_reach_a_base_ctx_and_the_stream_ends(job_env):
    with environ(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"):
        env.reload_env()
        with ensure_persia_service(data_loader_func=_send_two, embedding_config=EMBEDDING_CONFIG):
            config = get_default_embedding_config()
            with BaseCtx() as ctx:
                ctx.common_context.configure_embedding_parameter_servers(
                    *config.emb_initialization, config.admit_probability, True, config.weight_bound
                )
                ctx.common_context.wait_servers_ready()
                SGD(lr=0.1).apply()
                got = []
                for batch in DataLoader(StreamingDataset(buffer_size=4), timeout_ms=30000):
                    non_id, embeddings, labels = _prepare_feature(batch, PreprocessMode.EVAL)
                    assert embeddings[0].shape == (1, 8)
                    got.append(float(labels[0][0, 0]))
        assert sorted(got) == [1.0, 2.0]  # both batches, then the loop ended by itself
    env.reload_env()


def test_an_error_in_the_function_is_raised_at_the_end_and_the_environment_restored(job_env):
    def broken():
        raise ValueError("loader broke")

    before = {k: os.environ.get(k) for k in ("PERSIA_REDIS_URL", "PERSIA_EMBEDDING_CONFIG")}
    with environ(PERSIA_REDIS_URL=None):  # the helper starts its own redis-server
        with pytest.raises(ValueError, match="loader broke"):
            with ensure_persia_service(data_loader_func=broken, embedding_config=EMBEDDING_CONFIG):
                assert os.environ["PERSIA_REDIS_URL"].startswith("redis://127.0.0.1:")
        assert "PERSIA_REDIS_URL" not in os.environ
    assert {k: os.environ.get(k) for k in before} == before


def test_more_than_one_replica_of_a_function_is_refused():
    with pytest.raises(ValueError, match="data_loader_replica_num=2"):
        ensure_persia_service(embedding_config=EMBEDDING_CONFIG, data_loader_replica_num=2)
    with pytest.raises(ValueError, match="embedding_config"):
        ensure_persia_service()
