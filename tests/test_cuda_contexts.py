"""The contexts on CUDA device 0, against a real PS and embedding worker: ``TrainCtx`` with
``mixed_precision=True`` (fp16 autocast, torch's dynamic ``GradScaler``, the embedding
gradient unscaled before the PS applies it), an evaluation context nested in it, EPL's
``amp`` (dynamic loss scale) and ``offload`` options, and an ``InferCtx`` prediction.

Marked ``cuda``: they run under ``make test-gpu`` and skip where torch sees no GPU.
"""

from __future__ import annotations

import copy
import uuid

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import persia.epl as epl
from persia.ctx import InferCtx, TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import SGD, Adagrad
from persia.epl.amp import FixedLossScaler
from persia.service import get_embedding_worker_services
from tests.epl_helpers import DeepModel, inputs, make_ctx
from tests.nn_helpers import PooledModel, SmallModel, environ, job_services, make_batch

CUDA0 = torch.device("cuda", 0)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); run `make test-gpu` there",
    ),
]


@pytest.fixture(scope="module")
def job(redis_server, tmp_path_factory):
    """One PS and one embedding worker for the module's job."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"cuda-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None, EMBEDDING_WORKER_SERVICE=None):
        with job_services(env, tmp_path_factory.mktemp("svc")) as procs:
            yield procs


def _slot_a(batch) -> np.ndarray:
    return np.array(dict(list(batch.embeddings))["a"], dtype=np.float32)


def _looked_up(ids) -> np.ndarray:
    """Slot ``a``'s embeddings of ``ids`` as the PS holds them now (an evaluation lookup)."""
    with eval_ctx() as ctx:
        return _slot_a(ctx.get_embedding_from_data(make_batch(ids, requires_grad=False)))


def test_mixed_precision_step_applies_the_unscaled_embedding_gradient(job):
    """d(sum(e * w))/de = w for every sample: with the loss scaled by the GradScaler on the
    GPU, the PS must still move each id by exactly -lr * w (SGD)."""
    ids = list(range(1, 33))
    model = PooledModel().cuda(0)
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.0),
        model=model,
        mixed_precision=True,
        device_id=0,
    ) as ctx:
        assert type(ctx.grad_scaler) is torch.amp.GradScaler and ctx.grad_scaler.is_enabled()
        batch = ctx.get_embedding_from_data(make_batch(ids))
        before = _slot_a(batch)
        output, labels = ctx.forward(batch)
        assert output.device == CUDA0 and labels[0].device == CUDA0
        embeddings = [t for _, t in ctx._current_embeddings]
        assert all(t.device == CUDA0 and t.requires_grad and t.is_leaf for t in embeddings)
        loss = output.sum()
        scaled = ctx.backward(loss)
        scale = float(ctx.grad_scaler.get_scale())
        got = float(scaled.detach())
        assert scale > 1.0 and got == pytest.approx(float(loss.detach()) * scale, rel=1e-6)
        ctx.wait_for_gradients()
        after = _looked_up(ids)
        ctx.clear_embeddings()  # the module's other tests register Adagrad on this PS
    want = before - 0.1 * np.arange(1.0, 5.0, dtype=np.float32)
    np.testing.assert_allclose(after, want, rtol=0, atol=1e-5)


def test_mixed_precision_trains_in_fp16_on_the_gpu(job):
    torch.manual_seed(0)
    model = SmallModel().cuda(0)
    dtypes: list[torch.dtype] = []
    model.linear.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    batch_ids = list(range(100, 164))
    with TrainCtx(
        Adagrad(lr=0.1),
        torch.optim.Adam(model.parameters(), lr=0.05),
        model=model,
        mixed_precision=True,
        device_id=0,
    ) as ctx:
        losses = []
        for _ in range(30):  # one fixed batch: the loss must fall
            output, labels = ctx.forward(ctx.get_embedding_from_data(make_batch(batch_ids)))
            assert output.dtype == torch.float32  # handed back in fp32 for the loss
            loss = F.binary_cross_entropy(output, labels[0])
            ctx.backward(loss)
            losses.append(float(loss.detach()))
        assert ctx.stats.skipped_updates == 0
    assert set(dtypes) == {torch.float16}
    assert all(p.device == CUDA0 for p in model.parameters())
    assert losses[-1] < 0.8 * losses[0], losses


class _Batches(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def test_an_evaluation_nested_in_a_cuda_trainctx_runs_on_its_device(job):
    """PERSIA's Adult example evaluates with ``eval_ctx(model=model)`` inside TrainCtx, without
    a device_id: the batches (looked up directly or through a DataLoader) land on the GPU."""
    model = SmallModel().cuda(0)
    with TrainCtx(
        Adagrad(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=True,
        device_id=0,
    ):
        with eval_ctx(model=model) as ctx, torch.no_grad():
            output, labels = ctx.forward(
                ctx.get_embedding_from_data(make_batch(range(1, 9), requires_grad=False))
            )
            assert output.device == CUDA0 and labels[0].device == CUDA0
            loader = DataLoader(_Batches([make_batch(range(9, 17), requires_grad=False)]))
            outputs = [ctx.forward(b)[0] for b in loader]
            assert [o.device for o in outputs] == [CUDA0]


def test_epl_amp_dynamic_loss_scale_on_cuda_grows_backs_off_and_skips(job):
    torch.manual_seed(0)
    model = DeepModel().cuda(0)
    ctx = make_ctx(model, epl.Config({"amp.level": "O1"}, environ={}), device_id=0)
    scaler = ctx.grad_scaler
    assert type(scaler) is torch.amp.GradScaler and not isinstance(scaler, FixedLossScaler)
    non_id, emb, labels = inputs(8)
    non_id, labels = [t.cuda(0) for t in non_id], labels.cuda(0)
    emb = [e.detach().cuda(0).requires_grad_() for e in emb]
    with ctx._precision.autocast():
        out = model(non_id, emb)
    assert out.dtype == torch.float16 and out.device == CUDA0
    scale = float(scaler.get_scale())
    before = [p.detach().clone() for p in model.parameters()]
    scaled, got = ctx._precision.scale(F.binary_cross_entropy_with_logits(out.float(), labels))
    assert got == scale
    scaled.backward()
    ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert float(scaler.get_scale()) == scale  # growth only after growth_interval clean steps
    # an inf in a dense gradient: the step is skipped and the dynamic scale backs off (x0.5)
    ctx.dense_optimizer.zero_grad()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model.out.bias.grad.fill_(float("inf"))
    snapshot = [p.detach().clone() for p in model.parameters()]
    ctx._precision.step(ctx.dense_optimizer, True, 4.0)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, model.parameters(), strict=True))
    assert float(scaler.get_scale()) == scale / 2
    # non-finite embedding gradients: TrainCtx asks for the scale / grad_scalar_update_factor
    ctx.dense_optimizer.zero_grad()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    ctx._precision.step(ctx.dense_optimizer, False, 4.0)
    assert float(scaler.get_scale()) == scale / 8


def test_epl_offload_with_amp_steps_like_the_model_on_the_gpu(job):
    """offload v0 + amp O1: weights and optimizer in pinned CPU memory, compute on the GPU in
    fp16, the GradScaler unscales CPU gradients; one step lands where the same step of the
    model kept on the GPU lands."""
    torch.manual_seed(0)
    plain = DeepModel().cuda(0)
    model = copy.deepcopy(plain)
    config = {"amp.level": "O1", "offload.level": "v0"}
    ctx = make_ctx(
        model,
        epl.Config(config, environ={}),
        device_id=0,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    )
    reference = make_ctx(
        plain,
        epl.Config({"amp.level": "O1"}, environ={}),
        device_id=0,
        optimizer=torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9),
    )
    assert ctx.epl_plan.offloaded
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    non_id, emb, labels = inputs(16)
    non_id, labels = [t.cuda(0) for t in non_id], labels.cuda(0)
    for c, m in ((ctx, model), (reference, plain)):
        with c._precision.autocast():
            out = m(non_id, [e.detach().cuda(0).requires_grad_() for e in emb])
        assert out.device == CUDA0 and out.dtype == torch.float16
        scaled, _ = c._precision.scale(F.binary_cross_entropy_with_logits(out.float(), labels))
        scaled.backward()
        c._precision.step(c.dense_optimizer, True, 4.0)
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    assert all(p.grad.device.type == "cpu" for p in model.parameters())
    assert all("momentum_buffer" in ctx.dense_optimizer.state[p] for p in model.parameters())
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        assert ctx.dense_optimizer.state[q]["momentum_buffer"].device.type == "cpu"
        torch.testing.assert_close(q.detach(), p.detach().cpu(), rtol=1e-3, atol=1e-4, msg=name)


def test_epl_offload_trains_through_trainctx_on_cuda(job):
    torch.manual_seed(0)
    model = SmallModel()
    config = epl.Config({"amp.level": "O1", "offload.level": "v0"}, environ={})
    batch_ids = list(range(200, 264))
    with TrainCtx(
        Adagrad(lr=0.1),
        torch.optim.Adam(model.parameters(), lr=0.05),
        model=model,
        mixed_precision=False,
        device_id=0,
        epl_config=config,
    ) as ctx:
        losses = []
        for _ in range(30):
            output, labels = ctx.forward(ctx.get_embedding_from_data(make_batch(batch_ids)))
            assert output.device == CUDA0
            loss = F.binary_cross_entropy(output, labels[0])
            ctx.backward(loss)
            losses.append(float(loss.detach()))
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    assert losses[-1] < 0.8 * losses[0], losses


def test_infer_ctx_predicts_on_the_gpu(job):
    torch.manual_seed(0)
    model = SmallModel()
    ids = list(range(300, 340))
    with TrainCtx(
        Adagrad(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
    ) as train:
        for step in range(3):  # on the CPU: embeddings and a model to serve
            output, labels = train.forward(
                train.get_embedding_from_data(make_batch(ids, seed=step))
            )
            train.backward(F.binary_cross_entropy(output, labels[0]))
    model.eval()
    probe = make_batch(ids, requires_grad=False, labels=False, seed=9)
    with eval_ctx(model=model) as ctx, torch.no_grad():
        want = ctx.forward(
            ctx.get_embedding_from_data(make_batch(ids, requires_grad=False, seed=9))
        )[0]
    gpu_model = copy.deepcopy(model).cuda(0)
    addresses = get_embedding_worker_services()
    with environ(PERSIA_REDIS_URL="redis://127.0.0.1:1/0"):  # no registry: the addresses only
        ctx = InferCtx(addresses, model=gpu_model, device_id=0)
        ctx.wait_for_serving()
        batch = ctx.get_embedding_from_bytes(probe.to_bytes())
        non_id, embeddings, labels = ctx.prepare_features(batch)
        assert labels is None
        assert all(t.device == CUDA0 and not t.requires_grad for t in [*non_id, *embeddings])
        with torch.no_grad():
            got = gpu_model(non_id, embeddings)
            with ctx:
                output, _ = ctx.forward(ctx.get_embedding_from_bytes(probe.to_bytes()))
        ctx.close()
    assert got.device == CUDA0 and output.device == CUDA0
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(output.cpu(), want, rtol=1e-5, atol=1e-6)
