"""Pooling forward/backward against a per-sample numpy reference, and the per-replica payloads."""

from __future__ import annotations

import numpy as np
import pytest

from pyrsia.services.embedding_worker import kernels
from pyrsia.services.embedding_worker.pooling import pool_backward, pool_forward
from pyrsia.services.embedding_worker.preprocess import add_prefix, hash_stack, prepare_batch
from pyrsia.services.embedding_worker.routing import (
    replica_lookups,
    replica_updates,
    scatter_responses,
)
from pyrsia.shared.config import EmbeddingSchema, HashStackConfig, SlotConfig
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.wire.batch import IDFeature
from pyrsia.shared.wire.worker import Gradients
from tests.nonfinite import NON_FINITE_FLOAT32_BITS

REPLICAS = 3


def _csr(samples):
    ids = np.array([i for s in samples for i in s], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in samples])]).astype(np.int64)
    return ids, offsets


def _table(prepared, seed=0):
    """A fake PS: one random vector per unique id, answered per replica, gathered back."""
    rng = np.random.default_rng(seed)
    table = {}
    for dim, group in prepared.groups.items():
        for i in group.ids.tolist():
            table[i] = rng.standard_normal(dim).astype(np.float32)
    answers = [
        [
            np.array([table[i] for i in ids.tolist()], np.float32).reshape(-1, dim)
            for dim, ids in req
        ]
        for req in replica_lookups(prepared)
    ]
    return table, scatter_responses(prepared, answers)


def _buckets(schema, slot, raw_id):
    """The prefixed lookup ids of one raw id, computed one id at a time."""
    one = np.array([raw_id], dtype=np.uint64)
    hs = slot.hash_stack_config
    ids = (
        hash_stack(one, hs.hash_stack_rounds, hs.embedding_size)[0] if hs.hash_stack_rounds else one
    )
    return add_prefix(
        ids, schema.slot_prefixes()[slot.name], schema.feature_index_prefix_bit
    ).tolist()


def _reference_forward(schema, samples_by_slot, table):
    out = []
    for name, samples in samples_by_slot:
        slot = schema.slot(name)
        rounds = max(slot.hash_stack_config.hash_stack_rounds, 1)
        if slot.embedding_summation:
            res = np.zeros((len(samples), slot.dim), np.float32)
            for i, sample in enumerate(samples):
                for raw in sample:
                    for b in _buckets(schema, slot, raw):
                        res[i] += table[b]
                if slot.sqrt_scaling:
                    res[i] /= np.sqrt(max(len(sample) * rounds, 1))
        else:
            res = np.zeros((len(samples), slot.sample_fixed_size, slot.dim + 1), np.float32)
            scale = 1 / np.sqrt(rounds) if slot.sqrt_scaling and rounds > 1 else 1.0
            for i, sample in enumerate(samples):
                for j, raw in enumerate(sample[: slot.sample_fixed_size]):
                    for b in _buckets(schema, slot, raw):
                        res[i, j, : slot.dim] += table[b] * scale
                    res[i, j, slot.dim] = 1.0
        out.append(res)
    return out


def _reference_backward(schema, samples_by_slot, grads, loss_scale, skip=()):
    """Per lookup id: the sum over every occurrence of the row gradient times the row scale."""
    acc = {}
    for (name, samples), g in zip(samples_by_slot, grads, strict=True):
        if name in skip:
            continue
        slot = schema.slot(name)
        rounds = max(slot.hash_stack_config.hash_stack_rounds, 1)
        for i, sample in enumerate(samples):
            if slot.embedding_summation:
                scale = 1 / np.sqrt(max(len(sample) * rounds, 1)) if slot.sqrt_scaling else 1.0
                pairs = [(raw, g[i] * scale) for raw in sample]
            else:
                scale = 1 / np.sqrt(rounds) if slot.sqrt_scaling and rounds > 1 else 1.0
                limit = slot.sample_fixed_size
                pairs = [(raw, g[i, j, : slot.dim] * scale) for j, raw in enumerate(sample[:limit])]
            for raw, row in pairs:
                for b in _buckets(schema, slot, raw):
                    acc[b] = acc.get(b, 0) + row.astype(np.float64) / loss_scale
    return acc


def _run(schema, samples_by_slot):
    feats = [IDFeature(name, *_csr(samples)) for name, samples in samples_by_slot]
    prepared = prepare_batch(schema, feats, replica_count=REPLICAS)
    table, vectors = _table(prepared)
    return prepared, table, vectors


SAMPLES = [[5, 5, 9], [], [7], [1, 2, 3, 4, 5, 6], [9]]

CASES = {
    "sum": SlotConfig("s", 4),
    "sum_sqrt": SlotConfig("s", 4, sqrt_scaling=True),
    "raw": SlotConfig("s", 4, embedding_summation=False, sample_fixed_size=3),
    "sum_hash_sqrt": SlotConfig("s", 4, sqrt_scaling=True, hash_stack_config=HashStackConfig(3, 7)),
    "raw_hash": SlotConfig(
        "s",
        4,
        embedding_summation=False,
        sample_fixed_size=3,
        hash_stack_config=HashStackConfig(2, 5),
    ),
    "raw_hash_sqrt": SlotConfig(
        "s",
        4,
        embedding_summation=False,
        sample_fixed_size=2,
        sqrt_scaling=True,
        hash_stack_config=HashStackConfig(2, 5),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference(case):
    schema = EmbeddingSchema(slots_config=(CASES[case],))
    prepared, table, vectors = _run(schema, [("s", SAMPLES)])
    got = pool_forward(prepared, vectors)
    want = _reference_forward(schema, [("s", SAMPLES)], table)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert got[0].dtype == np.float32


def test_forward_summed_details():
    schema = EmbeddingSchema(slots_config=(SlotConfig("s", 4, sqrt_scaling=True),))
    prepared, table, vectors = _run(schema, [("s", SAMPLES)])
    out = pool_forward(prepared, vectors)[0]
    (b5,), (b9,) = _buckets(schema, schema.slot("s"), 5), _buckets(schema, schema.slot("s"), 9)
    np.testing.assert_allclose(out[0], (2 * table[b5] + table[b9]) / np.sqrt(3), rtol=1e-6)
    assert not out[1].any()  # empty sample -> zeros


def test_forward_raw_padding_and_truncation():
    schema = EmbeddingSchema(slots_config=(CASES["raw"],))
    prepared, _, vectors = _run(schema, [("s", SAMPLES)])
    out = pool_forward(prepared, vectors)[0]
    assert out.shape == (5, 3, 5)
    assert out[:, :, 4].tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert not out[1].any() and not out[2, 1:].any()


def test_forward_follows_batch_order_with_mixed_dims():
    schema = EmbeddingSchema(
        slots_config=(SlotConfig("a", 4), SlotConfig("b", 8, embedding_summation=False))
    )
    by_slot = [("b", [[1, 2], [3]]), ("a", [[1], []])]
    prepared, table, vectors = _run(schema, by_slot)
    got = pool_forward(prepared, vectors)
    want = _reference_forward(schema, by_slot, table)
    assert [g.shape for g in got] == [(2, 10, 9), (2, 4)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_backward_matches_reference_and_is_the_adjoint(case):
    schema = EmbeddingSchema(slots_config=(CASES[case],))
    by_slot = [("s", SAMPLES)]
    prepared, _, vectors = _run(schema, by_slot)
    rng = np.random.default_rng(1)
    out = pool_forward(prepared, vectors)
    grads = [rng.standard_normal(o.shape).astype(np.float32) for o in out]
    got, skipped = pool_backward(prepared, grads, loss_scale=8.0)
    assert skipped == []
    want = _reference_backward(schema, by_slot, grads, 8.0)
    ids = prepared.groups[4].ids.tolist()
    np.testing.assert_allclose(got[4], np.array([want[i] for i in ids]), rtol=1e-5, atol=1e-6)
    # adjoint: <forward(D), G> / loss_scale == <backward(G), D>, the mask column aside
    d = rng.standard_normal(vectors[4].shape).astype(np.float32)
    fwd = pool_forward(prepared, {4: d})[0]
    g0 = grads[0].copy()
    if fwd.ndim == 3:
        fwd, g0 = fwd[..., :4], g0[..., :4]
    np.testing.assert_allclose(np.sum(fwd * g0) / 8.0, np.sum(got[4] * d), rtol=1e-4)


def test_backward_dedups_across_slots_of_one_dim_and_skips_nan_slots():
    schema = EmbeddingSchema(
        slots_config=(SlotConfig("a", 4), SlotConfig("b", 4), SlotConfig("c", 4)),
        feature_groups=(("ab", ("a", "b")),),
    )
    by_slot = [("a", [[1, 2], [1]]), ("b", [[1], [3]]), ("c", [[1], [4]])]
    prepared, _, vectors = _run(schema, by_slot)
    assert len(prepared.groups[4].ids) == 5  # a/b share 1, 2, 3; c has its own 1 and 4
    grads = [np.ones((2, 4), np.float32) * (k + 1) for k in range(3)]
    grads[2][1, 0] = np.nan
    got, skipped = pool_backward(prepared, grads, loss_scale=2.0)
    assert skipped == ["c"]
    want = _reference_backward(schema, by_slot, grads, 2.0, skip={"c"})
    ids = prepared.groups[4].ids.tolist()
    np.testing.assert_allclose(got[4], np.array([want.get(i, np.zeros(4)) for i in ids]))
    shared_one = _buckets(schema, schema.slot("a"), 1)[0]
    np.testing.assert_allclose(got[4][ids.index(shared_one)], (1 + 1 + 2) / 2.0)
    # ids seen only in the skipped slot get no update at all
    sent = {
        i
        for req in replica_updates(prepared, got, skipped)
        for _, g_ids, _ in req
        for i in g_ids.tolist()
    }
    c_ids = {_buckets(schema, schema.slot("c"), r)[0] for r in (1, 4)}
    assert sent == set(ids) - c_ids
    for k, req in enumerate(replica_updates(prepared, got, skipped)):
        for dim, g_ids, g in req:
            owned = prepared.groups[dim].ids[prepared.groups[dim].replica_slice(k)]
            assert set(g_ids.tolist()) <= set(owned.tolist())
            np.testing.assert_array_equal(g, got[dim][[ids.index(i) for i in g_ids.tolist()]])


def test_backward_skips_inf_and_none_and_accepts_float16():
    schema = EmbeddingSchema(
        slots_config=(SlotConfig("a", 4), SlotConfig("b", 4), SlotConfig("c", 4))
    )
    by_slot = [("a", [[1]]), ("b", [[2]]), ("c", [[3]])]
    prepared, _, _ = _run(schema, by_slot)
    grads = [np.full((1, 4), np.inf, np.float32), None, np.full((1, 4), 3, np.float16)]
    got, skipped = pool_backward(prepared, grads, loss_scale=1.0)
    assert skipped == ["a", "b"]
    c_id = _buckets(schema, schema.slot("c"), 3)[0]
    row = prepared.groups[4].ids.tolist().index(c_id)
    np.testing.assert_array_equal(got[4][row], [3, 3, 3, 3])
    assert np.count_nonzero(got[4]) == 4


def test_raw_mask_column_gradient_is_ignored():
    schema = EmbeddingSchema(slots_config=(CASES["raw"],))
    prepared, _, _ = _run(schema, [("s", SAMPLES)])
    g = np.zeros((5, 3, 5), np.float32)
    g[..., 4] = np.nan  # the mask column carries no gradient and is not checked
    got, skipped = pool_backward(prepared, [g])
    assert skipped == [] and not got[4].any()


def test_gradient_of_the_wrong_shape_names_the_slot():
    """dtype and container are checked once by the wire type; the shape needs the plan."""
    schema = EmbeddingSchema(slots_config=(SlotConfig("a", 4),))
    prepared, _, _ = _run(schema, [("a", [[1], [2]])])
    with pytest.raises(InvalidInputError, match="gradients.a: expected shape"):
        pool_backward(prepared, [np.zeros((2, 5), np.float32)])


@pytest.mark.parametrize(
    "body, field",
    [
        ({"gradients": [{"name": "a", "data": np.zeros((2, 4))}]}, "gradients[0].data"),
        ({"gradients": [{"name": "a", "data": [[0.0] * 4] * 2}]}, "gradients[0].data"),
        ({"gradients": [{"name": "", "data": np.zeros((2, 4), np.float32)}]}, "gradients[0].name"),
        ({"gradients": {}}, "gradients"),
        ({"gradients": [], "loss_scale": 0.0}, "loss_scale"),
        ({"gradients": [], "loss_scale": float("nan")}, "loss_scale"),
        ({"gradients": [], "batch_id": "7"}, "batch_id"),
    ],
)
def test_gradients_body_is_checked_once_naming_the_field(body, field):
    with pytest.raises(InvalidInputError) as err:
        Gradients.from_wire({"batch_id": 1, **body})
    assert err.value.field == field


@NON_FINITE_FLOAT32_BITS
@pytest.mark.parametrize("where", [(0, 0), (300, 7), (499, 15)], ids=["first", "middle", "last"])
def test_the_finite_check_finds_every_non_finite_pattern_anywhere(bits, where):
    rows = np.ones((500, 17), np.float32)
    rows[:, 16] = np.nan  # a raw slot's mask column: outside the checked columns
    assert kernels.all_finite(rows, 16)
    rows.view(np.uint32)[where] = bits
    assert not kernels.all_finite(rows, 16)
    big = np.full((2, 16), np.finfo(np.float32).max, np.float32)
    big[1] = np.finfo(np.float32).smallest_subnormal
    assert kernels.all_finite(big, 16)
