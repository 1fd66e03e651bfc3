"""Gathered slots' tensors (``features.slot_rows``) behave as leaves do for training, minus
the gradient copy: each slot's ``.grad`` after backward is the gradient autograd handed
over (a view of the concatenation's gradient), summed over several backward calls, None
for an unused slot (read without torch's non-leaf warning), and the gradient payload reads
those views in place with the same bits as from contiguous copies."""

import warnings

import numpy as np
import pytest
import torch

from pyrsia.services.embedding_worker.gathering import answer_embeddings
from pyrsia.services.nn_worker.features import (
    build_tensors,
    gradient_payload,
    nonfinite_slots,
    slot_gradient,
    slot_rows,
)
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.scatter import add_blocks_if_finite
from tests.test_gathered_lookups import mixed_batch, prepared_and_vectors


def _concat_model(tensors: list[torch.Tensor], seed: int = 0) -> torch.Tensor:
    """A loss over the concatenation of ``tensors`` and a dense part, as a DLRM does."""
    gen = torch.Generator().manual_seed(seed)
    n = tensors[0].shape[0]
    dense = torch.randn(n, 3, generator=gen)
    x = torch.cat([*tensors, dense], dim=1)
    weight = torch.randn(x.shape[1], 2, generator=gen)
    return (torch.tanh(x @ weight) ** 2).sum()


def test_slot_rows_get_the_gradients_leaves_get_without_copying_them():
    block = torch.randn(5, 3, 4)  # (batch, slots, dim)
    rows = slot_rows(block)
    leaves = [r.detach().clone().requires_grad_(True) for r in block.unbind(1)]
    assert all(r.requires_grad for r in rows)
    _concat_model(list(rows[:2])).backward()
    _concat_model(leaves[:2]).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not a leaf Tensor" warning for the unused slot
        assert slot_gradient(rows[2]) is None and leaves[2].grad is None
        grads = [slot_gradient(r) for r in rows[:2]]
    for got, want in zip(grads, leaves[:2], strict=True):
        torch.testing.assert_close(got, want.grad, rtol=0, atol=0)
        assert got.stride() == (2 * 4 + 3, 1)  # a view of the (5, 11) gradient: not copied
    assert grads[1].data_ptr() - grads[0].data_ptr() == 4 * 4  # side by side in it


def test_slot_rows_sum_gradients_over_several_backward_calls_as_leaves_do():
    block = torch.randn(4, 2, 3)
    rows = slot_rows(block)
    leaves = [r.detach().clone().requires_grad_(True) for r in block.unbind(1)]
    for tensors in (rows, leaves):
        loss = _concat_model(list(tensors))
        loss.backward(retain_graph=True)
        (tensors[0] * 3.0).sum().backward()
    for got, want in zip(rows, leaves, strict=True):
        torch.testing.assert_close(slot_gradient(got), want.grad)


def test_build_tensors_makes_gathered_slots_slot_rows_and_keeps_them_alive_alone():
    prepared, vectors = prepared_and_vectors(mixed_batch(n=12, seed=4))
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    tensors = build_tensors([], [], answer, requires_grad=True).embeddings
    gathered = {name for table in answer.tables for name in table.slots}
    for name, t in tensors:
        assert t.requires_grad
        assert t.is_leaf == (name not in gathered)  # pooled slots stay leaves
    inference = build_tensors([], [], answer, requires_grad=False).embeddings
    assert not any(t.requires_grad for _, t in inference)


def test_payload_reads_concatenation_gradient_views_in_place_with_the_same_bits(monkeypatch):
    prepared, vectors = prepared_and_vectors(mixed_batch(n=40, seed=6))
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    tensors = build_tensors([], [], answer, requires_grad=True).embeddings
    dims = {t.shape[1] for _, t in tensors}
    _concat_model([t.reshape(t.shape[0], -1) for _, t in tensors if t.shape[1] in dims]).backward()
    stack = torch.stack
    stacks = []
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacks.append(1) or stack(*a, **k))
    in_place = gradient_payload(tensors, answer.tables)
    assert stacks == []  # strided views: summed where they are
    copies = [(n, t.detach().clone().requires_grad_(True)) for n, t in tensors]
    for (_, copy), (_, t) in zip(copies, tensors, strict=True):
        grad = slot_gradient(t)
        if grad is not None:  # same values; a gathered slot's in another layout
            copy.grad = grad.T.contiguous().T if grad.ndim == 2 else grad
    stacked = gradient_payload(copies, answer.tables)
    assert stacks  # the transposed layout is stacked first
    assert in_place.skipped_slots == stacked.skipped_slots
    for (dim_a, a), (dim_b, b) in zip(in_place.tables, stacked.tables, strict=True):
        assert dim_a == dim_b
        np.testing.assert_array_equal(a, b)
    assert nonfinite_slots(tensors) == []


def test_block_scatter_add_reads_rows_a_stride_apart_and_refuses_a_short_stride():
    matrix = np.arange(4 * 11, dtype=np.float32).reshape(4, 11)
    blocks = [matrix[:, 0:4], matrix[:, 4:8]]  # two slots' rows in one (4, 11) matrix
    addresses = np.array([b.__array_interface__["data"][0] for b in blocks], np.int64)
    index = np.array([[0, 1, 0, 2], [2, 2, 1, 0]], dtype=np.int64)
    out = np.zeros((3, 4), np.float32)
    assert add_blocks_if_finite(index, addresses, out, np.array([11, 11]))
    want = np.zeros((3, 4), np.float32)
    np.add.at(want, index.reshape(-1), np.concatenate(blocks))
    np.testing.assert_array_equal(out, want)
    with pytest.raises(InvalidInputError, match="row_strides"):
        add_blocks_if_finite(index, addresses, np.zeros((3, 4), np.float32), np.array([11, 3]))
