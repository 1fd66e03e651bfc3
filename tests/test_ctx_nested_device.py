"""A context entered inside another without a ``device_id`` takes the enclosing context's
device for as long as it is entered (PERSIA's Adult example evaluates with
``eval_ctx(model=model)`` inside a TrainCtx on a GPU). On the GPU this is checked by
tests/test_cuda_contexts.py; here, on any machine, the device index is only carried along."""

from __future__ import annotations

import uuid

import pytest

from persia.ctx import EmbeddingCtx, PreprocessMode, eval_ctx
from tests.nn_helpers import environ, job_services


@pytest.fixture(scope="module")
def job(redis_server, tmp_path_factory):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"nest-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None, EMBEDDING_WORKER_SERVICE=None):
        with job_services(env, tmp_path_factory.mktemp("svc")) as procs:
            yield procs


def test_a_nested_context_takes_the_enclosing_device_while_entered(job):
    with EmbeddingCtx(PreprocessMode.EVAL) as parent:
        child = eval_ctx()
        with child:
            assert child.device_id is None  # the parent is on the CPU
        parent.device_id = 3  # as a TrainCtx(device_id=3) would be; nothing here runs CUDA
        with child:
            assert child.device_id == 3
            assert child.session is parent.session
        assert child.device_id is None  # given back: entered elsewhere it is on the CPU again
        parent.device_id = None
