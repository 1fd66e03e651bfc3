"""Id preprocessing: hash stack, feature prefix, routing, dedup per dim, validation."""

from __future__ import annotations

import struct

import farmhash as pyfarmhash
import numpy as np
import pytest

from pyrsia.services.embedding_worker.pooling import pool_backward, pool_forward
from pyrsia.services.embedding_worker.preprocess import add_prefix, hash_stack, prepare_batch
from pyrsia.services.embedding_worker.routing import scatter_responses
from pyrsia.shared.config import EmbeddingSchema, HashStackConfig, SlotConfig
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.farmhash import farmhash64, farmhash64_numpy, replica_of
from pyrsia.shared.wire.batch import IDFeature, IDPart, single_id_offsets


def _prepare(schema, feats, replica_count):
    """prepare_batch over (name, ids, offsets) triples taken as already checked."""
    return prepare_batch(schema, [IDFeature(*f) for f in feats], replica_count)


def _from_wire(schema, feats, replica_count=1):
    """What the worker's /batch does: check the id half once, then preprocess it."""
    body = {
        "batch_size": len(feats[0][2]) - 1,
        "requires_grad": False,
        "id_type_features": [dict(zip(("name", "ids", "offsets"), f, strict=False)) for f in feats],
    }
    part = IDPart.from_wire(body, "batch")
    return prepare_batch(schema, part.id_type_features, replica_count)


def _csr(samples: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([i for s in samples for i in s], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in samples])]).astype(np.int64)
    return ids, offsets


def _schema(*slots: SlotConfig, bits: int = 8, groups=()) -> EmbeddingSchema:
    return EmbeddingSchema(
        slots_config=tuple(slots), feature_index_prefix_bit=bits, feature_groups=groups
    )


def test_hash_stack_matches_persia_vector():
    ids = np.array([12, 23, 34, 56, 78, 90], dtype=np.uint64)
    got = hash_stack(ids, 2, 10)
    assert got.tolist() == [[2, 18], [5, 10], [0, 11], [6, 17], [7, 12], [8, 16]]


def test_add_prefix_matches_persia_vectors():
    ids = np.array([12, 16000000000000000], dtype=np.uint64)
    got = add_prefix(ids, 100 << 52, 12)
    assert got.tolist() == [450359962737049612, 452849163854938115]


def test_farmhash64_equals_pyfarmhash_on_random_ids_and_extremes():
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 2**64 - 1, size=500, dtype=np.uint64, endpoint=True)
    ids[:2] = [0, 2**64 - 1]
    want = [pyfarmhash.hash64(struct.pack("<Q", int(x))) for x in ids]
    assert farmhash64(ids).tolist() == want
    assert farmhash64_numpy(ids).tolist() == want
    assert replica_of(ids, 3).tolist() == [w % 3 for w in want]


def test_prepare_routes_every_unique_id_to_its_replica_once():
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 4))
    a = _csr([[1, 2, 2], [], [3]])
    b = _csr([[1], [5, 6], [7]])
    p = _prepare(schema, [("a", *a), ("b", *b)], replica_count=3)
    group = p.groups[4]
    prefixes = schema.slot_prefixes()
    expected = set(add_prefix(a[0], prefixes["a"], 8).tolist()) | set(
        add_prefix(b[0], prefixes["b"], 8).tolist()
    )
    assert sorted(group.ids.tolist()) == sorted(expected)
    assert group.replica_offsets[0] == 0 and group.replica_offsets[-1] == len(group.ids)
    for k in range(3):
        assert (replica_of(group.ids[group.replica_slice(k)], 3) == k).all()
    # every occurrence maps back to its own prefixed id
    for plan, (ids, _) in zip(p.slots, [a, b], strict=True):
        assert group.ids[plan.inverse].tolist() == add_prefix(ids, prefixes[plan.name], 8).tolist()


def test_ids_around_and_above_the_prefix_spacing_fold_as_add_prefix_does():
    """The kernel skips the modulo for ids below the spacing; the ones at and above it
    (up to 2**64 - 1) must still fold exactly as PERSIA's add_prefix."""
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 4))
    spacing = (1 << 56) - 1  # feature_index_prefix_bit 8
    edge = [0, 1, spacing - 1, spacing, spacing + 1, 2 * spacing + 5, 2**63, 2**64 - 1]
    a = _csr([edge[:4], edge[4:]])
    b = _csr([edge[::-1], [7]])
    p = _prepare(schema, [("a", *a), ("b", *b)], replica_count=2)
    prefixes = schema.slot_prefixes()
    for plan, (ids, _) in zip(p.slots, [a, b], strict=True):
        want = add_prefix(ids, prefixes[plan.name], 8).tolist()
        assert p.groups[4].ids[plan.inverse].tolist() == want


def test_equal_raw_ids_in_two_slots_are_different_unless_grouped():
    slots = (SlotConfig("a", 4), SlotConfig("b", 4), SlotConfig("c", 4))
    feats = [(n, *_csr([[42], [42]])) for n in ("a", "b", "c")]
    apart = _prepare(_schema(*slots), feats, replica_count=1)
    assert len(apart.groups[4].ids) == 3
    grouped = _prepare(_schema(*slots, groups=(("ab", ("a", "b")),)), feats, replica_count=1)
    assert len(grouped.groups[4].ids) == 2
    assert grouped.slots[0].inverse.tolist() == grouped.slots[1].inverse.tolist()
    assert grouped.slots[2].inverse[0] != grouped.slots[0].inverse[0]


def test_slots_of_different_dims_go_to_different_groups_in_batch_order():
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 8), SlotConfig("c", 4))
    p = _prepare(schema, [("b", *_csr([[1]])), ("c", *_csr([[1]]))], replica_count=2)
    assert list(p.groups) == [8, 4]
    assert p.slot_names == ("b", "c")
    assert [s.output_shape for s in p.slots] == [(1, 8), (1, 4)]


def test_hash_stack_slot_looks_up_prefixed_buckets():
    slot = SlotConfig("h", 4, hash_stack_config=HashStackConfig(2, 10))
    schema = _schema(slot, bits=12)
    ids, offsets = _csr([[12, 23], [34]])
    p = _prepare(schema, [("h", ids, offsets)], replica_count=1)
    plan = p.slots[0]
    assert plan.rounds == 2
    buckets = p.groups[4].ids[plan.inverse].reshape(-1, 2)
    prefix = schema.slot_prefixes()["h"]
    assert (buckets - np.uint64(prefix)).tolist() == [[2, 18], [5, 10], [0, 11]]


def test_raw_slot_keeps_first_sample_fixed_size_ids_only():
    schema = _schema(SlotConfig("r", 4, embedding_summation=False, sample_fixed_size=2))
    p = _prepare(schema, [("r", *_csr([[1, 2, 3], [], [4]]))], replica_count=1)
    plan = p.slots[0]
    assert plan.offsets.tolist() == [0, 2, 2, 3]
    assert len(p.groups[4].ids) == 3  # id 3 is truncated away and never looked up
    assert plan.output_shape == (3, 2, 5)


def test_empty_feature_list_is_an_empty_batch():
    p = _prepare(_schema(SlotConfig("a", 4)), [], replica_count=2)
    assert p.slots == () and p.groups == {} and p.batch_size == 0


@pytest.mark.parametrize(
    "feature, field",
    [
        (("zzz", *_csr([[1]])), "batch.id_type_features[1].name"),
        (("a", *_csr([[1]])), "batch.id_type_features[1].name"),  # duplicate slot
        (("b", np.array([1], dtype=np.int64), np.array([0, 1])), "batch.id_type_features[1].ids"),
        (
            ("b", np.array([1, 2], dtype=np.uint64), np.array([1, 2])),
            "batch.id_type_features[1].offsets",
        ),
        (
            ("b", np.array([1, 2], dtype=np.uint64), np.array([0, 1])),
            "batch.id_type_features[1].offsets",
        ),
        (
            ("b", np.array([1, 2], dtype=np.uint64), np.array([0, 2, 1, 2])),
            "batch.id_type_features[1].offsets",
        ),
        (
            ("b", np.array([1, 2], dtype=np.uint64), np.array([0.0, 2.0])),
            "batch.id_type_features[1].offsets",
        ),
        (("b", *_csr([[1], [2]])), "batch.id_type_features[1].offsets"),  # batch size 2 vs 1
        # no offsets means one id per sample: two ids in a batch of one are refused
        (("b", np.array([1, 2], dtype=np.uint64)), "batch.id_type_features[1].ids"),
    ],
)
def test_bad_features_name_the_field(feature, field):
    """Structure is checked once (IDPart.from_wire); slot names against the schema after."""
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 4))
    with pytest.raises(InvalidInputError) as err:
        _from_wire(schema, [("a", *_csr([[1]])), feature])
    assert err.value.field == field


def test_a_feature_without_offsets_has_one_id_per_sample():
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 4))
    p = _from_wire(schema, [("a", *_csr([[1], [2]])), ("b", np.array([5, 6], dtype=np.uint64))])
    assert p.slots[1].offsets.tolist() == [0, 1, 2]
    assert p.slots[1].offsets is single_id_offsets(2)  # shared, read-only: the gather fast path


def test_bad_feature_container_names_the_field():
    with pytest.raises(InvalidInputError, match="batch.id_type_features: expected a list"):
        IDPart.from_wire({"batch_size": 1, "requires_grad": False, "id_type_features": {}}, "batch")


def test_strided_offsets_and_zero_samples():
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 4))
    strided = np.array([0, 9, 1, 9, 2], dtype=np.int64)[::2]
    p = _prepare(
        schema,
        [
            ("a", np.array([1, 2], np.uint64), strided),
            ("b", np.array([3, 4], np.uint64), strided.copy()),
        ],
        replica_count=2,
    )
    assert p.batch_size == 2 and len(p.groups[4].ids) == 4
    empty = _prepare(
        schema, [("a", np.array([], np.uint64), np.array([0], np.int64))], replica_count=2
    )
    assert empty.batch_size == 0 and empty.slots[0].output_shape == (0, 4)
    vectors = scatter_responses(empty, [[np.zeros((0, 4), np.float32)]] * 2)
    assert pool_forward(empty, vectors)[0].shape == (0, 4)
    grads, skipped = pool_backward(empty, [np.zeros((0, 4), np.float32)])
    assert grads[4].shape == (0, 4) and skipped == []


def _dedup_reference(schema, feats):
    """Each slot's prefixed ids, and the unique ones in first-seen order (numpy, no kernel)."""
    prefixes = schema.slot_prefixes()
    keys = np.concatenate([add_prefix(ids, prefixes[name], 8) for name, ids, _ in feats])
    _, first = np.unique(keys, return_index=True)
    return keys, keys[np.sort(first)]


@pytest.mark.parametrize("order", ["few_then_many", "many_then_few"])
def test_dedup_gives_the_same_answer_whatever_the_last_batch_held(order):
    """The dedup table is sized from the last batch's unique ids; a batch with far more
    (the table fills up: another pass, sized for all ids) or far fewer is deduped all the same."""
    schema = _schema(SlotConfig("a", 4), SlotConfig("b", 4))
    rng = np.random.default_rng(11)
    n = 3000
    few = [(s, rng.integers(0, 7, n, dtype=np.uint64), single_id_offsets(n)) for s in "ab"]
    many = [(s, rng.integers(0, 1 << 40, n, dtype=np.uint64), single_id_offsets(n)) for s in "ab"]
    batches = [few, many] if order == "few_then_many" else [many, few]
    for feats in batches * 2:
        prepared = _prepare(schema, feats, replica_count=1)
        keys, unique = _dedup_reference(schema, feats)
        group = prepared.groups[4]
        assert group.ids.tolist() == unique.tolist()  # first-seen order
        for plan, (name, ids, _) in zip(prepared.slots, feats, strict=True):
            assert (
                group.ids[plan.inverse].tolist()
                == add_prefix(ids, schema.slot_prefixes()[name], 8).tolist()
            )


def test_dedup_kernel_refuses_a_table_too_small_and_fills_one_large_enough():
    from pyrsia.services.embedding_worker.kernels import dedup_prefixed

    ids = np.arange(100, dtype=np.uint64)
    starts = np.array([0, 100], np.int64)
    prefixes = np.zeros(1, np.uint64)
    spacing = np.uint64((1 << 56) - 1)
    unique, inverse = np.empty(100, np.uint64), np.empty(100, np.int64)
    assert dedup_prefixed(ids, starts, prefixes, spacing, unique, inverse, 10) == -1
    assert dedup_prefixed(ids, starts, prefixes, spacing, unique, inverse, 100) == 100
    assert unique.tolist() == ids.tolist() and inverse.tolist() == list(range(100))
