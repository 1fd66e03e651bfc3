"""Batches whose every slot is plain (summed, no hash stack) with one id per sample.

The usual CTR batch (Census-Income's 33 slots, Criteo's 26) is prepared per dim group, with
no per-slot work: ``PreparedBatch.single_ids``, its slot plans made only when read, one
gather plan per layout, and on the NN worker one table holding every slot. Each test runs
the same ids through that path and through the general one (the same features with offsets
equal to, but not the shared, ``single_id_offsets`` array) and asks for the same answer,
the same tensors and the same updates.
"""

import numpy as np
import pytest
import torch

from persia.embedding.data import IDTypeFeatureWithSingleID, PersiaBatch
from pyrsia.services.embedding_worker.gathering import (
    Awaited,
    answer_embeddings,
    check_gradients,
    gather_backward,
    gather_plan,
)
from pyrsia.services.embedding_worker.plans import batch_layout
from pyrsia.services.embedding_worker.pooling import pool_backward
from pyrsia.services.embedding_worker.preprocess import prepare_batch
from pyrsia.services.embedding_worker.routing import replica_updates
from pyrsia.services.nn_worker.features import build_tensors, gradient_payload
from pyrsia.shared.config_schema import EmbeddingSchema
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.wire.batch import IDFeature, single_id_offsets

SCHEMA = EmbeddingSchema.from_dict(
    {
        "slots_config": {
            "user": {"dim": 4},
            "item": {"dim": 4, "sqrt_scaling": True},
            "wide": {"dim": 8},
            "city": {"dim": 4},
            "seq": {"dim": 4, "embedding_summation": False, "sample_fixed_size": 2},
        },
        "feature_groups": {"ui": ["user", "item"]},
    }
)
NAMES = ("user", "wide", "item", "city")  # not the file's order: the batch's order rules


def features(n: int = 12, seed: int = 0) -> list[IDTypeFeatureWithSingleID]:
    rng = np.random.default_rng(seed)
    return [IDTypeFeatureWithSingleID(name, rng.integers(0, 6, n, np.uint64)) for name in NAMES]


def general(feats) -> list[IDFeature]:
    """The same features, with offsets that are not the shared single-id array."""
    return [IDFeature(f.name, f.ids, np.arange(len(f.ids) + 1, dtype=np.int64)) for f in feats]


def both(n: int = 12, seed: int = 0, replicas: int = 2):
    feats = features(n, seed)
    fast = prepare_batch(SCHEMA, feats, replicas)
    slow = prepare_batch(SCHEMA, general(feats), replicas)
    assert fast.single_ids and not slow.single_ids
    return fast, slow


def vectors_of(prepared, seed: int = 1) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        dim: rng.standard_normal((g.ids.shape[0], dim)).astype(np.float32)
        for dim, g in prepared.groups.items()
    }


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_per_dim_path_prepares_the_same_groups_and_plans(replicas):
    fast, slow = both(n=30, seed=3, replicas=replicas)
    assert fast.slot_names == slow.slot_names == NAMES
    assert list(fast.groups) == list(slow.groups) == [4, 8]
    for dim in fast.groups:
        a, b = fast.groups[dim], slow.groups[dim]
        assert a.members == b.members
        for field in ("ids", "replica_offsets", "inverse"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    for a, b in zip(fast.slots, slow.slots, strict=True):  # made from the groups when read
        assert (a.name, a.dim, a.summation, a.sample_fixed_size, a.batch_size, a.rounds) == (
            b.name,
            b.dim,
            b.summation,
            b.sample_fixed_size,
            b.batch_size,
            b.rounds,
        )
        for field in ("offsets", "inverse", "scale"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert fast.slots[0].offsets is single_id_offsets(30)


def test_a_batch_with_a_pooled_slot_or_several_ids_per_sample_takes_the_general_path():
    feats = features()
    seq = IDFeature("seq", feats[0].ids, single_id_offsets(12))  # plain ids, a raw slot
    assert not prepare_batch(SCHEMA, [*feats, seq], 1).single_ids
    two = np.arange(25, dtype=np.int64)[::2]  # two ids per sample
    ragged = IDFeature("city", np.zeros(24, np.uint64), two)
    assert not prepare_batch(SCHEMA, [*feats[:3], ragged], 1).single_ids


def test_layouts_are_shared_per_list_of_names_and_refuse_an_unknown_slot():
    assert batch_layout(SCHEMA, NAMES) is batch_layout(SCHEMA, tuple(NAMES))
    assert batch_layout(SCHEMA, NAMES) is not batch_layout(SCHEMA, NAMES[::-1])
    assert batch_layout(SCHEMA, NAMES).plain
    assert not batch_layout(SCHEMA, (*NAMES, "seq")).plain
    feats = features()
    feats[2] = IDTypeFeatureWithSingleID("nope", feats[2].ids)
    with pytest.raises(InvalidInputError, match=r"batch\.id_type_features\[2\]\.name"):
        prepare_batch(SCHEMA, feats, 1)


def test_one_gather_plan_serves_every_batch_of_a_layout_and_answers_as_the_general_one():
    fast, slow = both()
    other, _ = both(seed=5)
    assert gather_plan(fast) is gather_plan(other)
    vectors = vectors_of(fast)
    got, plan = answer_embeddings(fast, vectors, gathered=True)
    want, want_plan = answer_embeddings(slow, vectors, gathered=True)
    assert plan.groups == want_plan.groups == ((4, (0, 2, 3)), (8, (1,)))
    assert got.single_table is None  # two dims: two tables
    assert list(got) != [] and [n for n, _ in got] == [n for n, _ in want] == list(NAMES)
    for (_, a), (_, b) in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got.tables, want.tables, strict=True):
        assert a.slots == b.slots
        np.testing.assert_array_equal(a.index, b.index)


def one_dim_batch(n: int = 16, seed: int = 0, nan: bool = False):
    """Three dim-4 slots (one table holds them all), answered and made into tensors."""
    rng = np.random.default_rng(seed)
    feats = [
        IDTypeFeatureWithSingleID(name, rng.integers(0, 5, n, np.uint64))
        for name in ("user", "item", "city")
    ]
    prepared = prepare_batch(SCHEMA, feats, 1)
    answer, plan = answer_embeddings(prepared, vectors_of(prepared), gathered=True)
    return prepared, answer, plan


def test_one_table_of_every_slot_gives_the_tensors_and_gradients_of_the_general_path():
    prepared, answer, plan = one_dim_batch()
    table = answer.single_table
    assert table is not None and table.slots == ("user", "item", "city")
    fast = build_tensors([], [], answer, requires_grad=True).embeddings
    assert [n for n, _ in fast] == ["user", "item", "city"]
    for (_, t), (_, want) in zip(fast, answer, strict=True):
        np.testing.assert_array_equal(t.detach().numpy(), want)
    weights = [torch.randn(t.shape) for _, t in fast]
    torch.cat([t * w for (_, t), w in zip(fast, weights, strict=True)], 1).sum().backward()
    payload = gradient_payload(fast, answer.tables)
    assert payload.slots == [] and payload.skipped_slots == ()
    # the general path: the slots in another order than the table's
    reordered = fast[::-1]
    general_payload = gradient_payload(reordered, answer.tables)
    np.testing.assert_array_equal(payload.tables[0][1], general_payload.tables[0][1])
    # and the worker turns it into the per-id update the pooled gradients give
    check_gradients(Awaited(prepared, plan), 1, {}, payload.tables, ())
    grads, skipped = pool_backward(prepared, [None] * 3, 2.0, plan.positions)
    assert skipped == [] and not grads[4].any()
    gather_backward(prepared, plan, payload.tables, (), 2.0, grads)
    want, _ = pool_backward(prepared, [w.numpy() for w in weights], 2.0)
    np.testing.assert_allclose(grads[4], want[4], rtol=1e-5, atol=1e-6)
    (update,) = replica_updates(prepared, grads)
    np.testing.assert_array_equal(update[0][1], prepared.groups[4].ids)


def test_one_table_leaves_out_and_names_a_non_finite_slot_and_one_without_gradient():
    prepared, answer, plan = one_dim_batch(seed=4)
    tensors = build_tensors([], [], answer, requires_grad=True).embeddings
    named = dict(tensors)
    (named["user"] * float("nan")).sum().backward(retain_graph=True)
    named["item"].sum().backward()  # "city" gets no gradient
    payload = gradient_payload(tensors, answer.tables)
    assert payload.skipped_slots == ("user", "city")
    grads, _ = pool_backward(prepared, [None] * 3, 1.0, plan.positions)
    gather_backward(prepared, plan, payload.tables, payload.skipped_slots, 1.0, grads)
    want = np.zeros_like(grads[4])
    np.add.at(want, prepared.slots[1].inverse, 1.0)
    np.testing.assert_array_equal(grads[4], want)
    # only the ids of "item" are updated
    (update,) = replica_updates(prepared, grads, payload.skipped_slots)
    used = np.unique(prepared.slots[1].inverse)
    np.testing.assert_array_equal(update[0][1], prepared.groups[4].ids[used])


def test_a_persia_batch_is_prepared_from_its_own_features_as_from_its_wire_form():
    """Embedded mode's sender hands ``Worker.prepare`` the PersiaBatch itself: its features
    have what preprocessing reads, without ``id_part()``'s conversion of each."""
    batch = PersiaBatch(features(), requires_grad=False)
    direct = prepare_batch(SCHEMA, batch.id_type_features, 2)
    wired = prepare_batch(SCHEMA, batch.id_part().id_type_features, 2)
    assert direct.single_ids and wired.single_ids
    for dim in direct.groups:
        np.testing.assert_array_equal(direct.groups[dim].ids, wired.groups[dim].ids)
        np.testing.assert_array_equal(direct.groups[dim].inverse, wired.groups[dim].inverse)
