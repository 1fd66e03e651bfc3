"""Gathered lookup answers (pyrsia/shared/wire/gathered.py): same tensors and same updates as pooled ones.

A single-id summed slot answered as (unique vectors, per-sample rows) must give the NN worker
exactly the pooled tensor, and the NN worker's per-vector gradient sums must move the PS rows
exactly as the pooled per-sample gradients do; hostile gathered bodies are refused with the
field named and nothing consumed.
"""

import numpy as np
import pytest
import torch

from persia.embedding.data import IDTypeFeature, IDTypeFeatureWithSingleID, Label, PersiaBatch
from pyrsia.services.embedding_worker.gathering import (
    answer_embeddings,
    gather_backward,
    gather_forward,
    gather_plan,
)
from pyrsia.services.embedding_worker.pooling import pool_backward, pool_forward
from pyrsia.services.embedding_worker.preprocess import prepare_batch
from pyrsia.services.nn_worker.features import build_tensors, gradient_payload
from pyrsia.shared.config_schema import EmbeddingSchema
from pyrsia.shared.errors import InvalidInputError, ProtocolError
from pyrsia.shared.scatter import add_blocks_if_finite, add_rows_if_finite
from pyrsia.shared.wire.gathered import SlotEmbeddings
from pyrsia.shared.wire.worker import Embeddings, Gradients
from tests.nonfinite import NON_FINITE_FLOAT32_BITS
from tests.test_embedding_worker_service import client, configs, setup_training, start_cluster

__all__ = ["client", "configs"]  # fixtures re-used from the worker's service tests

SCHEMA = EmbeddingSchema.from_dict(
    {
        "slots_config": {
            "user": {"dim": 4},
            "item": {"dim": 4, "sqrt_scaling": True},
            "tags": {"dim": 4},
            "seq": {"dim": 4, "embedding_summation": False, "sample_fixed_size": 3},
            "hashed": {
                "dim": 4,
                "hash_stack_config": {"hash_stack_rounds": 2, "embedding_size": 7},
            },
            "wide": {"dim": 8},
        },
        "feature_groups": {"ui": ["user", "item"]},
    }
)


def mixed_batch(n: int = 6, seed: int = 0) -> PersiaBatch:
    """Three gather slots (user, item, wide) and four that must stay pooled."""
    rng = np.random.default_rng(seed)
    ragged = [rng.integers(0, 9, size=k, dtype=np.uint64) for k in rng.integers(0, 4, size=n)]
    return PersiaBatch(
        [
            IDTypeFeatureWithSingleID("user", rng.integers(0, 5, size=n, dtype=np.uint64)),
            IDTypeFeatureWithSingleID("item", rng.integers(0, 5, size=n, dtype=np.uint64)),
            IDTypeFeature("tags", ragged),
            IDTypeFeature("seq", ragged),
            IDTypeFeatureWithSingleID("hashed", rng.integers(0, 50, size=n, dtype=np.uint64)),
            IDTypeFeatureWithSingleID("wide", rng.integers(0, 3, size=n, dtype=np.uint64)),
        ],
        labels=[Label(np.zeros((n, 1), np.float32))],
    )


def prepared_and_vectors(batch: PersiaBatch, seed: int = 1):
    prepared = prepare_batch(SCHEMA, batch.id_part().id_type_features, replica_count=2)
    rng = np.random.default_rng(seed)
    vectors = {
        dim: rng.standard_normal((g.ids.shape[0], dim)).astype(np.float32)
        for dim, g in prepared.groups.items()
    }
    return prepared, vectors


def test_only_single_id_summed_slots_without_hash_stack_are_gathered():
    prepared, _ = prepared_and_vectors(mixed_batch())
    plan = gather_plan(prepared)
    names = {dim: [prepared.slots[p].name for p in slots] for dim, slots in plan.groups}
    assert names == {4: ["user", "item"], 8: ["wide"]}


def test_a_tables_rows_are_its_slots_rows_whether_or_not_every_slot_of_its_dim_is_gathered():
    """Dim 8 holds one slot, gathered: its table's index is the dim group's rows as they
    are; dim 4 holds gathered and pooled slots: the gathered slots' rows, one by one."""
    prepared, vectors = prepared_and_vectors(mixed_batch(n=9, seed=2))
    plan = gather_plan(prepared)
    tables = {t.dim: t for t in gather_forward(prepared, plan, vectors)}
    for dim, positions in plan.groups:
        group = prepared.groups[dim]
        assert (positions == group.members) == (dim == 8)
        want = np.stack([prepared.slots[p].inverse for p in positions]).astype(np.int32)
        assert tables[dim].index.dtype == np.int32
        np.testing.assert_array_equal(tables[dim].index, want)


def test_gathered_answer_holds_the_pooled_tensors_and_survives_the_wire():
    prepared, vectors = prepared_and_vectors(mixed_batch())
    pooled = pool_forward(prepared, vectors)
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    assert isinstance(answer, SlotEmbeddings) and len(answer.tables) == 2
    wire = Embeddings(answer, 7, True).to_wire()
    assert [set(e) for e in wire["embeddings"]][:3] == [{"name", "table"}] * 2 + [{"name", "data"}]
    # the wire form decodes to the same (slot, array) pairs, in slot order
    decoded = Embeddings.from_wire(wire, batch_size=6)
    assert [n for n, _ in decoded.embeddings] == list(prepared.slot_names)
    for (_, got), want in zip(decoded.embeddings, pooled, strict=True):
        np.testing.assert_array_equal(got, want)
    # the NN worker's tensors (one index_select per table) are the pooled tensors too
    tensors = build_tensors([], [], decoded.embeddings, requires_grad=True)
    for (_, t), want in zip(tensors.embeddings, pooled, strict=True):
        assert t.requires_grad
        np.testing.assert_array_equal(t.detach().numpy(), want)


def test_table_gradients_update_ids_exactly_as_pooled_gradients():
    prepared, vectors = prepared_and_vectors(mixed_batch(n=40, seed=3))
    answer, plan = answer_embeddings(prepared, vectors, gathered=True)
    tensors = build_tensors([], [], answer, requires_grad=True).embeddings
    weights = [torch.randn(t.shape) for _, t in tensors]
    loss = sum((t * w).sum() for (_, t), w in zip(tensors, weights, strict=True))
    loss.backward()
    payload = gradient_payload(tensors, answer.tables)
    assert payload.skipped_slots == () and len(payload.tables) == 2
    assert [n for n, _ in payload.slots] == ["tags", "seq", "hashed"]
    by_name = dict(payload.slots)
    got, skipped = pool_backward(
        prepared, [by_name.get(n) for n in prepared.slot_names], 4.0, plan.positions
    )
    more, nonfinite = gather_backward(prepared, plan, payload.tables, (), 4.0, got)
    assert skipped == more == nonfinite == []
    want, _ = pool_backward(prepared, [w.numpy() for w in weights], 4.0)
    for dim in want:
        np.testing.assert_allclose(got[dim], want[dim], rtol=1e-5, atol=1e-6)


def test_a_non_finite_gathered_slot_is_left_out_and_named():
    prepared, vectors = prepared_and_vectors(mixed_batch())
    answer, plan = answer_embeddings(prepared, vectors, gathered=True)
    tensors = build_tensors([], [], answer, requires_grad=True).embeddings
    named = dict(tensors)
    (named["user"] * float("nan")).sum().backward(retain_graph=True)
    named["item"].sum().backward()
    payload = gradient_payload(tensors, answer.tables)  # "wide" has no gradient at all
    assert payload.skipped_slots == ("user", "wide")
    grads, _ = pool_backward(prepared, [None] * len(prepared.slots), 1.0, plan.positions)
    gather_backward(prepared, plan, payload.tables, payload.skipped_slots, 1.0, grads)
    item_rows = prepared.slots[1].inverse
    want = np.zeros_like(grads[4])
    np.add.at(want, item_rows, 1.0)
    np.testing.assert_array_equal(grads[4], want)  # only item's ones, no NaN from user
    assert not grads[8].any()


def test_table_gradients_read_in_place_or_stacked_are_the_same(monkeypatch):
    """Contiguous CPU float32 gradients are summed where autograd left them (no stacking
    copy); any other layout (here a transposed one) is stacked first: the same payload."""
    prepared, vectors = prepared_and_vectors(mixed_batch(n=40, seed=5))
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    tensors = build_tensors([], [], answer, requires_grad=True).embeddings
    weights = [torch.randn(t.shape) for _, t in tensors]
    sum((t * w).sum() for (_, t), w in zip(tensors, weights, strict=True)).backward()
    stack = torch.stack
    stacks = []
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacks.append(1) or stack(*a, **k))
    in_place = gradient_payload(tensors, answer.tables)
    assert stacks == []
    named = dict(tensors)
    named["user"].grad = named["user"].grad.T.contiguous().T  # same values, strides (1, 40)
    assert not named["user"].grad.is_contiguous()
    stacked = gradient_payload(tensors, answer.tables)
    assert stacks == [1]  # the table holding "user" (the other one is still read in place)
    assert in_place.skipped_slots == stacked.skipped_slots == ()
    for (dim_a, a), (dim_b, b) in zip(in_place.tables, stacked.tables, strict=True):
        assert dim_a == dim_b
        np.testing.assert_array_equal(a, b)


def test_block_scatter_add_sums_in_place_and_refuses_non_finite_or_out_of_range():
    blocks = [np.arange(8, dtype=np.float32).reshape(4, 2) + 10 * k for k in range(3)]
    addresses = np.array([b.__array_interface__["data"][0] for b in blocks], np.int64)
    index = np.array([[2, 0, 2, 1], [0, 0, 1, 1], [2, 2, 2, 2]], dtype=np.int32)
    index.setflags(write=False)  # as decoded from the wire
    out = np.zeros((3, 2), np.float32)
    assert add_blocks_if_finite(index, addresses, out)
    want = np.zeros((3, 2), np.float32)
    np.add.at(want, index.reshape(-1), np.concatenate(blocks))
    np.testing.assert_array_equal(out, want)
    blocks[1][3, 0] = np.nan
    assert not add_blocks_if_finite(index, addresses, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="outside"):
        add_blocks_if_finite(index + 1, addresses, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="addresses"):
        add_blocks_if_finite(index, addresses[:2], np.zeros((3, 2), np.float32))


@NON_FINITE_FLOAT32_BITS
@pytest.mark.parametrize(
    "where", [(0, 0, 0), (1, 57, 9), (2, 99, 15)], ids=["first", "middle", "last"]
)
def test_block_scatter_add_refuses_every_non_finite_pattern_anywhere(bits, where):
    blocks = np.ones((3, 100, 16), np.float32)
    blocks.view(np.uint32)[where] = bits
    addresses = np.array([b.__array_interface__["data"][0] for b in blocks], np.int64)
    index = np.tile(np.arange(100, dtype=np.int64) % 7, (3, 1))
    assert not add_blocks_if_finite(index, addresses, np.zeros((7, 16), np.float32))


def test_scatter_add_sums_rows_and_refuses_non_finite_or_out_of_range():
    index = np.array([2, 0, 2, 1], dtype=np.int32)
    index.setflags(write=False)  # as decoded from the wire
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = np.ones((3, 2), np.float32)
    assert add_rows_if_finite(index, rows, out)
    want = np.ones((3, 2), np.float32)
    np.add.at(want, index, rows)
    np.testing.assert_array_equal(out, want)
    rows[3, 1] = np.inf
    assert not add_rows_if_finite(index, rows, out)
    np.testing.assert_array_equal(out, want)  # nothing added
    with pytest.raises(ValueError, match="outside"):
        add_rows_if_finite(np.array([0, 3, 0, 0], np.int32), np.zeros((4, 2), np.float32), out)
    with pytest.raises(ValueError, match="rows"):
        add_rows_if_finite(index, np.zeros((3, 2), np.float32), out)


@NON_FINITE_FLOAT32_BITS
@pytest.mark.parametrize("where", [(0, 0), (57, 9), (99, 15)], ids=["first", "middle", "last"])
def test_scatter_add_refuses_every_non_finite_pattern_anywhere(bits, where):
    index = np.arange(100, dtype=np.int32) % 7
    rows = np.ones((100, 16), np.float32)
    rows.view(np.uint32)[where] = bits
    out = np.zeros((7, 16), np.float32)
    assert not add_rows_if_finite(index, rows, out)
    assert not out.any()


def test_scatter_add_takes_the_extreme_finite_values():
    extremes = np.array(
        [
            np.finfo(np.float32).max,
            -np.finfo(np.float32).max,
            np.finfo(np.float32).smallest_subnormal,
            -0.0,
            np.finfo(np.float32).tiny,
            1.0,
        ],
        dtype=np.float32,
    )
    rows = np.tile(extremes, (4, 1))
    out = np.zeros((4, 6), np.float32)
    assert add_rows_if_finite(np.arange(4, dtype=np.int64), rows, out)
    np.testing.assert_array_equal(out, rows)


def test_answers_with_bad_tables_are_protocol_errors():
    prepared, vectors = prepared_and_vectors(mixed_batch())
    answer, _ = answer_embeddings(prepared, vectors, gathered=True)
    wire = Embeddings(answer, 1, True).to_wire()
    bad_index = [{**wire["tables"][0], "index": wire["tables"][0]["index"] + 1000}]
    cases = {
        "rows in": {**wire, "tables": bad_index + wire["tables"][1:]},
        "dtype int32": {
            **wire,
            "tables": [{**wire["tables"][0], "index": wire["tables"][0]["index"].astype(np.int64)}]
            + wire["tables"][1:],
        },
        "table number below 2": {
            **wire,
            "embeddings": [{"name": "user", "table": 5}, *wire["embeddings"][1:]],
        },
        "shape": {**wire, "tables": wire["tables"][::-1]},
    }
    for expected, body in cases.items():
        with pytest.raises(ProtocolError, match=expected):
            Embeddings.from_wire(body, batch_size=6)


def test_gradient_bodies_check_their_tables_and_slot_names():
    with pytest.raises(InvalidInputError, match="tables.0..data"):
        Gradients.from_wire(
            {"batch_id": 1, "gradients": [], "tables": [{"dim": 4, "data": np.zeros((3, 5))}]}
        )
    with pytest.raises(InvalidInputError, match="distinct"):
        Gradients.from_wire({"batch_id": 1, "gradients": [], "skipped_slots": ["a", "a"]})


async def test_gathered_training_through_the_worker_and_two_ps(services, configs, client):
    _, (w,) = start_cluster(services, configs(), n_ps=2)
    await setup_training(client, w.url)
    rng = np.random.default_rng(5)
    users = rng.integers(0, 7, size=12, dtype=np.uint64)
    tags = [rng.integers(0, 9, size=k, dtype=np.uint64) for k in rng.integers(0, 3, size=12)]
    batch = PersiaBatch(
        [IDTypeFeatureWithSingleID("user", users), IDTypeFeature("tags", tags)],
        labels=[Label(np.zeros((12, 1), np.float32))],
    )
    part = batch.id_part().to_wire()
    await client.call(f"{w.url}/batch", {"loader": 0, "batch_id": 4, "batch": part})
    raw = await client.call(f"{w.url}/lookup", {"batch_id": 4, "train": True, "gathered": True})
    answer = Embeddings.from_wire(raw, batch_size=12)
    (table,) = answer.tables
    assert table.slots == ("user",) and table.rows <= 7 + 12 * 2
    before = dict(answer.embeddings)["user"]
    # refused bodies leave the batch waiting: wrong row count, a pooled slot named skipped
    g = np.arange(table.rows * 4, dtype=np.float32).reshape(table.rows, 4) / 100
    for body, field in (
        ({"tables": [{"dim": 4, "data": g[:-1]}]}, "tables[0]"),
        ({"tables": [{"dim": 4, "data": g}], "skipped_slots": ["tags"]}, "skipped_slots[0]"),
        (
            {"tables": [{"dim": 4, "data": g}], "gradients": [{"name": "user", "data": g}]},
            "gradients",
        ),
    ):
        with pytest.raises(Exception, match=field.replace("[", r"\[")):
            await client.call(
                f"{w.url}/gradients", {"batch_id": 4, "gradients": [], "loss_scale": 2.0, **body}
            )
    res = await client.call(
        f"{w.url}/gradients",
        {"batch_id": 4, "loss_scale": 2.0, "gradients": [], "tables": [{"dim": 4, "data": g * 2}]},
    )
    assert res["dropped"] == 0 and res["applied"] > 0
    after = await client.call(
        f"{w.url}/lookup_direct", {"batch": part, "train": False, "gathered": True}
    )
    after_user = dict(Embeddings.from_wire(after, batch_size=12).embeddings)["user"]
    # SGD lr=1: each user's row moves by minus its table row's gradient (loss scale undone)
    np.testing.assert_allclose(after_user, before - g[table.index[0]], rtol=1e-5, atol=1e-6)


def test_a_prepared_batch_counts_the_rows_of_every_slot_once_through_its_dim_groups():
    """The offloader's size of a batch: hash-stacked slots count a row per round, raw
    slots their kept ids; every slot's rows are its dim group's, in order."""
    from pyrsia.services.embedding_worker.replica import occurrence_count

    prepared, _ = prepared_and_vectors(mixed_batch(n=11, seed=9))
    assert occurrence_count(prepared) == sum(p.inverse.shape[0] for p in prepared.slots)
    for group in prepared.groups.values():
        rows = np.concatenate([prepared.slots[m].inverse for m in group.members])
        np.testing.assert_array_equal(group.inverse, rows)
