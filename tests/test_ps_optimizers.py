"""The PS optimizers against plain numpy references (and PyTorch's own SGD/Adam) over several steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, EmbeddingHyperparams, SGDSpec

DIM = 8
STEPS = 6


def _reference(spec, w, g, state):
    """One step of ``spec`` on float64 arrays w (n, dim), g (n, dim); returns new (w, state)."""
    wd = spec.weight_decay
    if isinstance(spec, SGDSpec):
        gp = g + wd * w
        if spec.momentum > 0:
            buf = state.get("buf")
            buf = gp.copy() if buf is None else spec.momentum * buf + gp
            state["buf"] = buf
            return w - spec.lr * buf, state
        return w - spec.lr * gp, state
    if isinstance(spec, AdagradSpec):
        a = state.setdefault(
            "a",
            np.full(
                (w.shape[0], 1 if spec.vectorwise_shared else w.shape[1]),
                spec.initial_accumulator_value,
            ),
        )
        w = w - spec.lr * (g + wd * w) / np.sqrt(a + spec.eps)
        sq = (g * g).mean(axis=1, keepdims=True) if spec.vectorwise_shared else g * g
        state["a"] = a * spec.g_square_momentum + sq
        return w, state
    b1, b2 = spec.betas
    t = state.get("t", 0) + 1
    gp = g + wd * w
    m = b1 * state.get("m", 0.0) + (1 - b1) * gp
    v = b2 * state.get("v", 0.0) + (1 - b2) * gp * gp
    state.update(t=t, m=m, v=v)
    denom = np.sqrt(v) / np.sqrt(1 - b2**t) + spec.eps
    return w - spec.lr / (1 - b1**t) * m / denom, state


SPECS = [
    SGDSpec(0.1),
    SGDSpec(0.05, weight_decay=0.1),
    SGDSpec(0.05, momentum=0.9, weight_decay=0.01),
    AdagradSpec(lr=0.1),
    AdagradSpec(
        lr=0.05, initial_accumulator_value=0.3, weight_decay=0.05, g_square_momentum=0.8, eps=1e-6
    ),
    AdagradSpec(lr=0.05, weight_decay=0.02, g_square_momentum=0.9, vectorwise_shared=True),
    AdamSpec(lr=0.01),
    AdamSpec(lr=0.02, betas=(0.8, 0.95), weight_decay=0.1, eps=1e-6),
]


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_engine_matches_numpy_reference(spec):
    rng = np.random.default_rng(0)
    store = EmbeddingStore(
        1000, hyperparams=EmbeddingHyperparams((-0.5, 0.5), weight_bound=0), optimizer=spec
    )
    ids = np.unique(rng.integers(0, 2**64, size=200, dtype=np.uint64, endpoint=False))
    w = store.lookup(ids, DIM, train=True).astype(np.float64)
    state: dict = {}
    for _ in range(STEPS):
        g = rng.normal(size=(ids.shape[0], DIM)).astype(np.float32)
        res = store.update(ids, g)
        assert res.applied == ids.shape[0]
        w, state = _reference(spec, w, g.astype(np.float64), state)
        got = store.lookup(ids, DIM, train=False)
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    # the optimizer state in the stored rows matches too
    ((stored_ids, rows),) = store.export_entries().values()
    order = np.argsort(stored_ids)
    ref_order = np.argsort(ids)
    rows = rows[order]
    if isinstance(spec, AdagradSpec):
        np.testing.assert_allclose(rows[:, DIM:], state["a"][ref_order], rtol=1e-5)
    elif isinstance(spec, AdamSpec):
        np.testing.assert_allclose(
            rows[:, DIM : 2 * DIM], state["m"][ref_order], rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            rows[:, 2 * DIM : 3 * DIM], state["v"][ref_order], rtol=1e-5, atol=1e-9
        )
        assert (rows[:, 3 * DIM] == STEPS).all()
    elif spec.momentum > 0:
        np.testing.assert_allclose(rows[:, DIM:], state["buf"][ref_order], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("spec", "make"),
    [
        (
            SGDSpec(0.05, momentum=0.9, weight_decay=0.01),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
        ),
        (
            AdamSpec(lr=0.02, betas=(0.8, 0.95), weight_decay=0.1, eps=1e-6),
            lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.95), weight_decay=0.1, eps=1e-6),
        ),
    ],
)
def test_sgd_momentum_and_adam_follow_pytorch(spec, make):
    rng = np.random.default_rng(1)
    store = EmbeddingStore(100, hyperparams=EmbeddingHyperparams(weight_bound=0), optimizer=spec)
    ids = np.arange(10, dtype=np.uint64)
    w0 = store.lookup(ids, DIM, train=True)
    param = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = make([param])
    for _ in range(STEPS):
        g = rng.normal(size=(10, DIM)).astype(np.float32)
        store.update(ids, g)
        param.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    np.testing.assert_allclose(
        store.lookup(ids, DIM, train=False), param.detach().numpy(), rtol=1e-5, atol=1e-6
    )


def test_weight_bound_clips_embedding_only():
    spec = AdagradSpec(lr=10.0)
    store = EmbeddingStore(10, hyperparams=EmbeddingHyperparams(weight_bound=0.5), optimizer=spec)
    ids = np.arange(4, dtype=np.uint64)
    store.lookup(ids, DIM, train=True)
    g = np.ones((4, DIM), np.float32)
    g[1] = -1
    store.update(ids, g * 100)
    got = store.lookup(ids, DIM, train=False)
    assert np.all(got[0] == -0.5) and np.all(got[1] == 0.5)
    ((_, rows),) = store.export_entries().values()
    assert rows[:, DIM:].max() > 1000  # the accumulator is not clipped


def test_duplicate_ids_in_one_update_get_one_step_each():
    store = EmbeddingStore(
        10, hyperparams=EmbeddingHyperparams((0.0, 1e-9), weight_bound=0), optimizer=SGDSpec(1.0)
    )
    ids = np.array([3, 3, 3], dtype=np.uint64)
    w0 = store.lookup(ids[:1], 2, train=True)
    res = store.update(ids, np.ones((3, 2), np.float32))
    assert res.applied == 3
    np.testing.assert_allclose(store.lookup(ids[:1], 2, train=False), w0 - 3.0)
