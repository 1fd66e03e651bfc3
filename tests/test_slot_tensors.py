"""A gathered block's slots as the model gets them (``slot_tensors.SlotTensor``): a
``torch.cat`` of consecutive slots along the last dim reads the block's columns as one run,
with the values and the per-slot gradients (``slot_gradient``) the slot-by-slot join gives;
every other use of a slot is a plain tensor's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pyrsia.services.embedding_worker.gathering import answer_embeddings
from pyrsia.services.nn_worker import slot_tensors
from pyrsia.services.nn_worker.features import build_tensors, gradient_payload
from pyrsia.services.nn_worker.slot_tensors import (
    SlotBlock,
    SlotTensor,
    model_slots,
    slot_gradient,
    slot_rows,
)
from tests.test_gathered_lookups import mixed_batch, prepared_and_vectors

BATCH, SLOTS, DIM = 6, 5, 4


def _block(seed: int = 0) -> torch.Tensor:
    return torch.randn(BATCH, SLOTS, DIM, generator=torch.Generator().manual_seed(seed))


def _model_and_rows(block: torch.Tensor) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]:
    rows = slot_rows(block)
    return model_slots(SlotBlock(block, rows), rows), rows


def _leaves(block: torch.Tensor) -> list[torch.Tensor]:
    return [r.detach().clone().requires_grad_(True) for r in block.unbind(1)]


def _loss(x: torch.Tensor, seed: int = 1) -> torch.Tensor:
    weight = torch.randn(x.shape[1], 3, generator=torch.Generator().manual_seed(seed))
    return (torch.tanh(x @ weight) ** 2).sum()


@pytest.fixture
def columns_calls(monkeypatch) -> list[tuple[int, int]]:
    """The (first, stop) of every run a join read as the block's columns."""
    calls: list[tuple[int, int]] = []
    columns = SlotBlock.columns

    def counted(self, first, stop):
        calls.append((first, stop))
        return columns(self, first, stop)

    monkeypatch.setattr(slot_tensors.SlotBlock, "columns", counted)
    return calls


def test_a_join_of_every_slot_reads_the_columns_once_with_the_same_values_and_gradients(
    columns_calls,
):
    block = _block()
    model, rows = _model_and_rows(block)
    leaves = _leaves(block)
    dense = torch.randn(BATCH, 3)
    joined = torch.cat([*model, dense], dim=1)
    want = torch.cat([*leaves, dense], dim=1)
    assert columns_calls == [(0, SLOTS)]
    assert type(joined) is torch.Tensor  # a plain tensor from here on
    torch.testing.assert_close(joined, want, rtol=0, atol=0)
    _loss(joined).backward()
    _loss(want).backward()
    for row, leaf in zip(rows, leaves, strict=True):
        torch.testing.assert_close(slot_gradient(row), leaf.grad, rtol=0, atol=0)
    # each slot's gradient is a view of the join's gradient, as the slot-by-slot join leaves it
    strides = {slot_gradient(row).stride() for row in rows}
    assert strides == {(SLOTS * DIM + 3, 1)}


def test_runs_of_consecutive_slots_are_joined_and_the_rest_as_called(columns_calls):
    block = _block(2)
    model, rows = _model_and_rows(block)
    leaves = _leaves(block)
    dense = torch.randn(BATCH, 2)
    order = [0, 1, "dense", 4, 2, 3]  # runs 0-1 and 2-3; 4 alone
    joined = torch.concat([dense if k == "dense" else model[k] for k in order], -1)
    want = torch.cat([dense if k == "dense" else leaves[k] for k in order], -1)
    assert columns_calls == [(0, 2), (2, 4)]
    torch.testing.assert_close(joined, want, rtol=0, atol=0)
    _loss(joined, 3).backward()
    _loss(want, 3).backward()
    for row, leaf in zip(rows, leaves, strict=True):
        torch.testing.assert_close(slot_gradient(row), leaf.grad, rtol=0, atol=0)


def test_unused_slots_get_no_gradient_and_a_slot_used_twice_gets_the_sum(columns_calls):
    block = _block(4)
    model, rows = _model_and_rows(block)
    leaves = _leaves(block)
    for tensors in (model, leaves):
        x = torch.concatenate(tensors[:3], axis=1)
        (_loss(x) + (tensors[1] * 2.0).sum()).backward()
    assert columns_calls == [(0, 3)]
    for row, leaf in zip(rows[:3], leaves[:3], strict=True):
        torch.testing.assert_close(slot_gradient(row), leaf.grad)
    assert slot_gradient(rows[3]) is None and slot_gradient(rows[4]) is None


def test_joins_that_are_not_a_run_along_the_last_dim_run_as_called(columns_calls):
    block = _block(5)
    model, _ = _model_and_rows(block)
    leaves = _leaves(block)
    torch.testing.assert_close(torch.cat(model[:2], dim=0), torch.cat(leaves[:2], dim=0))
    torch.testing.assert_close(
        torch.cat([model[3], model[1]], 1), torch.cat([leaves[3], leaves[1]], 1)
    )
    out = torch.empty(BATCH, 2 * DIM)
    with torch.no_grad():  # out= takes no part in autograd (torch's rule)
        torch.cat(model[:2], 1, out=out)
    torch.testing.assert_close(out, torch.cat(leaves[:2], 1).detach())
    other, _ = _model_and_rows(_block(6))  # slots of two blocks: no run across them
    torch.testing.assert_close(
        torch.cat([model[4], other[0]], 1), torch.cat([leaves[4], _leaves(_block(6))[0]], 1)
    )
    assert columns_calls == []


def test_other_operations_on_a_slot_are_a_plain_tensors():
    block = _block(7)
    model, rows = _model_and_rows(block)
    assert isinstance(model[0], SlotTensor)
    assert model[0].float() is model[0]  # PERSIA's example model calls .float() on each slot
    summed = model[0] + model[1]
    assert type(summed) is torch.Tensor
    summed.sum().backward()
    torch.testing.assert_close(slot_gradient(rows[0]), torch.ones(BATCH, DIM))
    assert slot_gradient(rows[2]) is None
    assert model[2].shape == (BATCH, DIM) and model[2].requires_grad


def test_inference_slots_join_as_columns_without_a_gradient(columns_calls):
    block = _block(8)
    rows = block.unbind(1)
    model = model_slots(SlotBlock(block, None), rows)
    joined = torch.cat(model, 1)
    assert columns_calls == [(0, SLOTS)]
    assert not joined.requires_grad
    torch.testing.assert_close(joined, block.reshape(BATCH, -1), rtol=0, atol=0)
    joined += 1.0  # a join is a copy, as torch.cat's: the block is untouched
    torch.testing.assert_close(torch.cat(rows, 1), block.reshape(BATCH, -1), rtol=0, atol=0)


def test_a_batchs_model_tensors_train_as_its_slot_tensors_and_the_payload_is_the_same():
    prepared, vectors = prepared_and_vectors(mixed_batch(n=24, seed=9))
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    payloads = []
    for through_model in (True, False):
        tensors = build_tensors([], [], answer, requires_grad=True)
        model = tensors.model_tensors() if through_model else [t for _, t in tensors.embeddings]
        assert any(isinstance(t, SlotTensor) for t in model) == through_model
        widths = [t.reshape(t.shape[0], -1) if t.ndim != 2 else t for t in model]
        _loss(torch.cat(widths, 1), 5).backward()
        payloads.append(gradient_payload(tensors.embeddings, answer.tables))
    joined, plain = payloads
    assert joined.skipped_slots == plain.skipped_slots
    for (dim_a, a), (dim_b, b) in zip(joined.tables, plain.tables, strict=True):
        assert dim_a == dim_b
        np.testing.assert_array_equal(a, b)
    for (name_a, a), (name_b, b) in zip(joined.slots, plain.slots, strict=True):
        assert name_a == name_b
        np.testing.assert_array_equal(a, b)


def test_a_batch_bound_for_a_cuda_device_gets_contiguous_slots_from_either_gather(monkeypatch):
    """For a device the slots are copied slot-major (each one contiguous run for its copy to
    the device) and the model gets them as they are; pinning is the device's part."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    prepared, vectors = prepared_and_vectors(mixed_batch(n=10, seed=11))
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    on_cpu = dict(build_tensors([], [], answer, requires_grad=False).embeddings)
    table = answer.tables[0]
    gathered = table.data[np.asarray(table.index).T]  # embedded mode's (batch, slots, dim)
    tables = (dataclasses.replace(table, block=gathered), *answer.tables[1:])
    with_block = type(answer)(answer._entries, tables)
    for source in (answer, with_block):
        tensors = build_tensors([], [], source, requires_grad=False, cuda=True)
        assert tensors.model_embeddings is None
        for name, tensor in tensors.embeddings:
            assert tensor.is_contiguous()
            torch.testing.assert_close(tensor, on_cpu[name], rtol=0, atol=0)
