"""The training step's embedding-gradient check (``features.nonfinite_slots``) names exactly
the slots holding a NaN or an inf, whatever the gradients' layout: strided views of one
concatenation's gradient (read together in place by ``scatter.blocks_finite``), separate
arrays, and layouts the compiled pass does not read (other dtypes, transposed views)."""

import numpy as np
import pytest
import torch

from pyrsia.services.nn_worker.features import nonfinite_slots, slot_gradient, slot_rows
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.scatter import blocks_finite

BAD = (float("nan"), float("inf"), float("-inf"))


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("where", [(0, 0, 0), (2, 2, 1), (5, 1, 3)])
def test_blocks_finite_finds_one_bad_value_side_by_side_and_apart(bad, where):
    row, block, col = where
    matrix = np.random.default_rng(0).standard_normal((6, 3 * 4 + 5)).astype(np.float32)
    side_by_side = [matrix[:, 4 * s : 4 * s + 4] for s in range(3)]  # one row-major array
    apart = [np.ascontiguousarray(b) for b in side_by_side]  # three arrays
    for blocks in (side_by_side, apart):
        addresses = np.array([_address(b) for b in blocks], np.int64)
        strides = np.array([b.strides[0] // 4 for b in blocks], np.int64)
        assert blocks_finite(addresses, strides, (6, 4)) is True
        blocks[block][row, col] = bad
        assert blocks_finite(addresses, strides, (6, 4)) is False
        blocks[block][row, col] = 1.0
    matrix[row, 3 * 4 + 1] = bad  # outside the blocks: not read
    addresses = np.array([_address(b) for b in side_by_side], np.int64)
    assert blocks_finite(addresses, np.full(3, matrix.shape[1]), (6, 4)) is True


def test_blocks_finite_with_no_blocks_or_rows_and_its_refusals():
    assert blocks_finite(np.zeros(0, np.int64), np.zeros(0, np.int64), (5, 4)) is True
    rows = np.ones((2, 4), np.float32)
    assert blocks_finite(np.array([_address(rows)]), np.array([4]), (0, 4)) is True
    with pytest.raises(InvalidInputError, match="row_strides"):
        blocks_finite(np.array([_address(rows)]), np.array([3]), (2, 4))  # rows overlap
    with pytest.raises(InvalidInputError, match="row_strides"):
        blocks_finite(np.array([_address(rows)]), np.array([4, 4]), (2, 4))


def _views_of_a_concatenation(slots: int, batch: int = 8, dim: int = 4):
    """Slot tensors as a gathered answer makes them, after a model concatenated them."""
    rows = slot_rows(torch.randn(batch, slots, dim))
    x = torch.cat([*rows, torch.randn(batch, 3)], dim=1)
    (x @ torch.randn(x.shape[1], 1)).sum().backward()
    return [(f"s{i}", r) for i, r in enumerate(rows)]


@pytest.mark.parametrize("bad", BAD)
def test_nonfinite_slots_names_the_bad_slots_of_a_concatenation_in_order(bad):
    tensors = _views_of_a_concatenation(6)
    assert nonfinite_slots(tensors) == []
    slot_gradient(tensors[4][1])[2, 1] = bad
    slot_gradient(tensors[1][1])[7, 3] = bad
    assert nonfinite_slots(tensors) == ["s1", "s4"]


def test_nonfinite_slots_checks_every_layout_and_skips_slots_without_a_gradient():
    def leaf(shape, dtype=torch.float32):
        t = torch.zeros(shape, dtype=dtype, requires_grad=True)
        t.grad = torch.ones(shape, dtype=dtype)
        return t

    unused = torch.zeros(8, 4, requires_grad=True)  # no gradient: not a bad slot
    transposed = torch.zeros(8, 4, requires_grad=True)
    transposed.grad = torch.ones(4, 8).T  # values not contiguous along a row
    tensors = [
        ("pooled", leaf((8, 4))),
        ("other_dim", leaf((8, 2))),
        ("double", leaf((8, 4), torch.float64)),
        ("raw", leaf((8, 3, 5))),
        ("transposed", transposed),
        ("unused", unused),
        *_views_of_a_concatenation(3),
    ]
    assert nonfinite_slots(tensors) == []
    for name, tensor in tensors:
        grad = slot_gradient(tensor)
        if grad is None:
            continue
        last = tuple(n - 1 for n in grad.shape)  # the last row's last value
        grad[last] = float("nan")
        assert nonfinite_slots(tensors) == [name], name
        grad[last] = 1.0
    assert nonfinite_slots(tensors) == []
