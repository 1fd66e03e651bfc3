"""Contexts used outside ``with``, as PERSIA allows: InferCtx in a TorchServe-style handler,
query methods before ``with`` and after it ends; against a real PS and embedding worker."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from persia.ctx import EmbeddingCtx, InferCtx, PreprocessMode, TrainCtx, cnt_ctx, eval_ctx
from persia.embedding.optim import Adagrad
from persia.service import get_embedding_worker_services
from tests.nn_helpers import SmallModel, environ, job_services, make_batch

IDS = list(range(1, 31))


@pytest.fixture(scope="module")
def job(redis_server, tmp_path_factory):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"nowith-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None, EMBEDDING_WORKER_SERVICE=None):
        with job_services(env, tmp_path_factory.mktemp("svc"), ps_replicas=2) as procs:
            model = SmallModel()
            with TrainCtx(
                Adagrad(lr=0.1),
                torch.optim.SGD(model.parameters(), lr=0.1),
                model=model,
                mixed_precision=False,
            ) as ctx:
                for step in range(2):
                    out, labels = ctx.forward(
                        ctx.get_embedding_from_data(make_batch(IDS, seed=step))
                    )
                    ctx.backward(torch.nn.functional.binary_cross_entropy(out, labels[0]))
            yield procs, model


def _eval_output(model, batch):
    with eval_ctx(model=model) as ctx, torch.no_grad():
        output, _ = ctx.forward(ctx.get_embedding_from_data(batch))
    return output


def test_infer_ctx_as_persia_torchserve_handler_uses_it(job):
    _, model = job
    probe = make_batch(IDS, requires_grad=False, seed=5)
    want = _eval_output(model, probe)
    addresses = get_embedding_worker_services()
    # the handler's initialize() / preprocess() / inference(): no `with`, and no registry needed
    with environ(PERSIA_REDIS_URL="redis://127.0.0.1:1/0"):
        ctx = InferCtx(addresses)
        assert ctx._session is None  # construction does no network work
        ctx.wait_for_serving()
        assert cnt_ctx() is None
        batch = ctx.get_embedding_from_bytes(probe.to_bytes())
        non_id, embeddings, labels = ctx.prepare_features(batch)
        assert labels is None
        with torch.no_grad():
            got = model(non_id, embeddings)
        assert torch.equal(got, want)
        assert sum(ctx.get_embedding_size()) > 0
        ctx.close()
        ctx.close()  # idempotent
        # a closed context reconnects on the next call
        assert sum(ctx.get_embedding_size()) > 0
        ctx.close()


def test_query_methods_work_before_with_and_after_it_ends(job, tmp_path):
    _, model = job
    ctx = EmbeddingCtx(PreprocessMode.EVAL, model=model)
    sizes = ctx.get_embedding_size()  # before any `with`
    assert len(sizes) == 2 and sum(sizes) > 0
    ctx.dump_checkpoint(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "dense.pt").is_file()
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("replica_*.manifest.json")) == [
        "replica_0.manifest.json",
        "replica_1.manifest.json",
    ]
    with pytest.raises(RuntimeError, match="entered"):
        with ctx:
            ctx.close()
    with ctx:  # the connection opened before `with` is reused, then released at its end
        assert ctx.get_embedding_size() == sizes
    assert ctx._session is None
    assert ctx.get_embedding_size() == sizes  # after `with` ended
    ctx.clear_embeddings()
    assert sum(ctx.get_embedding_size()) == 0
    ctx.load_checkpoint(str(tmp_path / "ckpt"))  # restores the embeddings after `with` too
    assert ctx.get_embedding_size() == sizes
    probe = make_batch(IDS, requires_grad=False, seed=7)
    lookup = ctx.get_embedding_from_data(probe)
    with eval_ctx() as other:
        want = other.get_embedding_from_data(probe).embeddings[0][1]
    np.testing.assert_array_equal(ctx.prepare_features(lookup)[1][0].numpy(), want)
    ctx.close()


def test_train_ctx_queries_after_with_ends(job, tmp_path):
    _, model = job
    ctx = TrainCtx(
        Adagrad(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
    )
    with ctx:
        inside = ctx.get_embedding_size()
    assert ctx.get_embedding_size() == inside
    ctx.dump_checkpoint(str(tmp_path / "after"))
    assert (tmp_path / "after" / "opt.pt").is_file()
    with pytest.raises(RuntimeError, match="outside the context"):
        ctx.backward(torch.ones((), requires_grad=True))
    ctx.close()
