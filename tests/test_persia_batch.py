"""persia.embedding.data: PersiaBatch checks, CSR layout, wire form and bytes round trip."""

from __future__ import annotations

import numpy as np
import pytest

from persia.embedding.data import (
    MAX_BATCH_SIZE,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
    PersiaBatch,
)
from pyrsia.shared.errors import InvalidInputError, ProtocolError
from pyrsia.shared.wire.batch import DensePart, IDPart

U64 = np.uint64


def _ids(*samples: list[int]) -> list[np.ndarray]:
    return [np.array(s, dtype=U64) for s in samples]


def _batch(n: int = 4, **kwargs) -> PersiaBatch:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, n)
    tags = [rng.integers(0, 2**64 - 1, k, dtype=U64, endpoint=True) for k in lengths]
    defaults = dict(
        id_type_features=[
            IDTypeFeature("tags", tags),
            IDTypeFeatureWithSingleID("user", np.arange(n, dtype=U64)),
        ],
        non_id_type_features=[
            NonIDTypeFeature(rng.random((n, 3), dtype=np.float32), name="dense"),
            NonIDTypeFeature(np.zeros((n, 2, 2), np.uint8)),
        ],
        labels=[Label(np.ones((n, 1), np.float32), "y")],
        meta=b"\x00meta",
    )
    defaults.update(kwargs)
    return PersiaBatch(**defaults)


# --------------------------------------------------------------------------- features


def test_csr_layout_with_empty_samples():
    f = IDTypeFeature("tags", _ids([10, 11], [], [12], [13, 14, 15], []))
    assert f.ids.dtype == U64 and f.offsets.dtype == np.int64
    assert f.ids.tolist() == [10, 11, 12, 13, 14, 15]
    assert f.offsets.tolist() == [0, 2, 2, 3, 6, 6]
    assert f.batch_size == 5
    assert [s.tolist() for s in f.data] == [[10, 11], [], [12], [13, 14, 15], []]


def test_all_empty_and_zero_sample_features():
    f = IDTypeFeature("tags", _ids([], []))
    assert f.ids.tolist() == [] and f.ids.dtype == U64
    assert f.offsets.tolist() == [0, 0, 0]
    assert IDTypeFeature("tags", []).offsets.tolist() == [0]


def test_both_argument_orders_are_accepted():
    data = _ids([1], [2, 3])
    a, b = IDTypeFeature("x", data), IDTypeFeature(data, "x")
    assert a.name == b.name == "x"
    assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()
    single = np.array([5, 6], U64)
    assert IDTypeFeatureWithSingleID(single, "s").name == "s"
    with pytest.raises(TypeError, match="expected a str name"):
        IDTypeFeature(data, data)


def test_single_id_feature_offsets():
    f = IDTypeFeatureWithSingleID("user", np.array([7, 8, 9], U64))
    assert f.offsets.tolist() == [0, 1, 2, 3]
    assert f.ids.tolist() == [7, 8, 9] and f.batch_size == 3


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1, 2], np.float64),
        np.array([[1]], U64),
        [1, 2],
    ],
)
def test_ids_must_be_1d_integer_arrays(bad):
    expected = "expected a 1-D numpy array of non-negative integer ids"
    with pytest.raises(InvalidInputError, match=r"data\[1\]: " + expected):
        IDTypeFeature("tags", [np.array([1], U64), bad])
    if isinstance(bad, np.ndarray):
        with pytest.raises(InvalidInputError, match=expected):
            IDTypeFeatureWithSingleID("user", bad)


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.float32, np.float64]
)
def test_supported_dense_dtypes(dtype):
    assert NonIDTypeFeature(np.zeros((2, 1), dtype)).batch_size == 2
    assert Label(np.zeros(2, dtype)).batch_size == 2


@pytest.mark.parametrize(
    "dtype", [np.uint16, np.uint32, np.uint64, np.float16, np.complex64, object]
)
def test_unsupported_dense_dtypes_are_refused(dtype):
    with pytest.raises(InvalidInputError, match="expected a numpy array of dtype bool"):
        NonIDTypeFeature(np.zeros(2, dtype))
    with pytest.raises(InvalidInputError, match="expected a numpy array of dtype bool"):
        Label(np.zeros(2, dtype))


def test_dense_needs_an_array_with_a_batch_axis():
    with pytest.raises(InvalidInputError, match="ndim >= 1"):
        NonIDTypeFeature(np.float32(1.0))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Label([1.0, 2.0])  # type: ignore[arg-type]


def test_default_names_are_persias():
    assert NonIDTypeFeature(np.zeros(1, np.float32)).name == "non_id_type_feature_anonymous"
    assert Label(np.zeros(1, np.float32)).name == "label_anonymous"
    assert Label(np.zeros(1, np.float32), "ctr").name == "ctr"


# --------------------------------------------------------------------------- batch checks


def test_batch_size_defaults_to_the_first_id_feature():
    assert _batch(6).batch_size == 6


def test_every_part_must_have_the_same_batch_size():
    with pytest.raises(
        InvalidInputError, match=r"id_type_features\[1\] \(user\): expected batch size 4, got 3"
    ):
        _batch(
            4,
            id_type_features=[
                IDTypeFeature("t", _ids([1], [2], [3], [4])),
                IDTypeFeatureWithSingleID("user", np.arange(3, dtype=U64)),
            ],
        )
    with pytest.raises(InvalidInputError, match=r"labels\[0\] \(y\): expected batch size 4, got 5"):
        _batch(4, labels=[Label(np.ones(5, np.float32), "y")])
    with pytest.raises(InvalidInputError, match=r"non_id_type_features\[0\]"):
        _batch(4, non_id_type_features=[NonIDTypeFeature(np.ones(2, np.float32))])
    with pytest.raises(InvalidInputError, match="expected batch size 5, got 4"):
        _batch(4, batch_size=5)


def test_batch_size_limits():
    big = MAX_BATCH_SIZE + 1
    with pytest.raises(
        InvalidInputError, match="batch_size: expected an integer from 1 to 65535, got 65536"
    ):
        PersiaBatch([IDTypeFeatureWithSingleID("u", np.zeros(big, U64))], requires_grad=False)
    ok = PersiaBatch(
        [IDTypeFeatureWithSingleID("u", np.zeros(MAX_BATCH_SIZE, U64))], requires_grad=False
    )
    assert ok.batch_size == MAX_BATCH_SIZE
    with pytest.raises(
        InvalidInputError, match="batch_size: expected an integer from 1 to 65535, got 0"
    ):
        PersiaBatch([IDTypeFeature("t", [])], requires_grad=False)


def test_requires_grad_without_labels_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="requires_grad=True needs labels"):
        _batch(labels=None)
    assert _batch(labels=None, requires_grad=False).labels == ()


def test_id_type_features_are_required_and_typed():
    with pytest.raises(InvalidInputError, match="id_type_features: expected at least one"):
        PersiaBatch([], requires_grad=False)
    with pytest.raises(TypeError, match=r"id_type_features\[0\]: expected IDTypeFeature"):
        PersiaBatch([NonIDTypeFeature(np.zeros(1, np.float32))], requires_grad=False)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"labels\[0\]: expected Label"):
        _batch(labels=[NonIDTypeFeature(np.zeros(4, np.float32))])  # type: ignore[list-item]


def test_meta_must_be_bytes_and_requires_grad_a_bool():
    with pytest.raises(TypeError, match="meta: expected bytes or None, got str"):
        _batch(meta="text")
    with pytest.raises(TypeError, match="requires_grad: expected a bool"):
        _batch(requires_grad=1)


def test_duplicate_feature_names_are_errors():
    single = np.arange(4, dtype=U64)
    with pytest.raises(
        InvalidInputError, match=r"id_type_features\[1\]\.name: expected names unique"
    ):
        _batch(
            id_type_features=[
                IDTypeFeatureWithSingleID("u", single),
                IDTypeFeatureWithSingleID("u", single),
            ]
        )
    with pytest.raises(InvalidInputError, match=r"labels\[1\]\.name"):
        _batch(labels=[Label(np.ones(4, np.float32), "y"), Label(np.ones(4, np.float32), "y")])
    # unnamed dense parts are fine, as in PERSIA
    two = [NonIDTypeFeature(np.ones(4, np.float32)), NonIDTypeFeature(np.ones(4, np.float32))]
    assert len(_batch(non_id_type_features=two).non_id_type_features) == 2


# --------------------------------------------------------------------------- wire form


def _assert_same(a: PersiaBatch, b: PersiaBatch) -> None:
    assert (a.batch_size, a.requires_grad, a.meta) == (b.batch_size, b.requires_grad, b.meta)
    for x, y in zip(a.id_type_features, b.id_type_features, strict=True):
        assert x.name == y.name
        np.testing.assert_array_equal(x.ids, y.ids)
        np.testing.assert_array_equal(x.offsets, y.offsets)
        assert y.ids.dtype == U64 and y.offsets.dtype == np.int64
    for xs, ys in ((a.non_id_type_features, b.non_id_type_features), (a.labels, b.labels)):
        for x, y in zip(xs, ys, strict=True):
            assert x.name == y.name and x.data.dtype == y.data.dtype
            np.testing.assert_array_equal(x.data, y.data)


def test_wire_form_has_the_agreed_shape():
    wire = _batch().to_wire()
    assert set(wire) == {
        "batch_size",
        "requires_grad",
        "meta",
        "id_type_features",
        "non_id_type_features",
        "labels",
    }
    assert set(wire["id_type_features"][0]) == {"name", "ids", "offsets"}
    assert wire["non_id_type_features"][1] == {
        "name": None,
        "data": wire["non_id_type_features"][1]["data"],
    }
    assert wire["labels"][0]["name"] == "y"


def test_wire_round_trip():
    batch = _batch(7)
    _assert_same(batch, PersiaBatch.from_wire(batch.to_wire()))


def test_bytes_round_trip():
    batch = _batch(9)
    again = PersiaBatch.from_bytes(batch.to_bytes())
    _assert_same(batch, again)
    assert [s.tolist() for s in again.id_type_features[0].data] == [
        s.tolist() for s in batch.id_type_features[0].data
    ]


def test_garbage_bytes_are_a_protocol_error():
    with pytest.raises(ProtocolError):
        PersiaBatch.from_bytes(b"\xc1\xc1 not msgpack")


def test_parts_split_the_batch_for_the_two_services():
    batch = _batch(5)
    ids = IDPart.from_wire(batch.id_part().to_wire())
    dense = DensePart.from_wire(batch.dense_part().to_wire())
    assert set(batch.id_part().to_wire()) == {"batch_size", "requires_grad", "id_type_features"}
    assert set(batch.dense_part().to_wire()) == {
        "batch_size",
        "meta",
        "non_id_type_features",
        "labels",
    }
    # the parts share the batch's arrays: building them copies nothing
    assert batch.id_part().id_type_features[1].ids is batch.id_type_features[1].ids
    assert ids.batch_size == dense.batch_size == 5 and ids.requires_grad is True
    assert [f.name for f in ids.id_type_features] == ["tags", "user"]
    assert dense.meta == b"\x00meta" and [f.name for f in dense.labels] == ["y"]
    again = IDPart.from_wire(ids.to_wire())
    assert [f.ids.tolist() for f in again.id_type_features] == [
        f.ids.tolist() for f in batch.id_type_features
    ]
    # parts ignore envelope keys
    assert IDPart.from_wire({**batch.id_part().to_wire(), "ref": [0, 1]}).batch_size == 5
    # with a prefix, errors name the field inside the envelope
    with pytest.raises(InvalidInputError) as info:
        DensePart.from_wire({**batch.dense_part().to_wire(), "batch_size": 0}, "dense")
    assert info.value.field == "dense.batch_size"


def _wire_with(path: tuple, value) -> dict:
    wire = _batch(4).to_wire()
    target = wire
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return wire


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("batch_size",), 0, "batch_size"),
        (("batch_size",), "4", "batch_size"),
        (("batch_size",), True, "batch_size"),
        (("requires_grad",), "yes", "requires_grad"),
        (("meta",), "text", "meta"),
        (("id_type_features",), [], "id_type_features"),
        (("id_type_features",), "x", "id_type_features"),
        (("id_type_features", 1), "x", "id_type_features[1]"),
        (("id_type_features", 1, "name"), "", "id_type_features[1].name"),
        (("id_type_features", 1, "name"), "tags", "id_type_features[1].name"),
        (("id_type_features", 0, "ids"), np.zeros(3, np.int64), "id_type_features[0].ids"),
        (("id_type_features", 0, "ids"), KeyError, "id_type_features[0].ids"),
        (
            ("id_type_features", 1, "offsets"),
            np.arange(5, dtype=np.int32),
            "id_type_features[1].offsets",
        ),
        (
            ("id_type_features", 1, "offsets"),
            np.arange(4, dtype=np.int64),
            "id_type_features[1].offsets",
        ),
        (
            ("id_type_features", 1, "offsets"),
            np.array([0, 2, 1, 3, 4], np.int64),
            "id_type_features[1].offsets",
        ),
        (
            ("id_type_features", 1, "offsets"),
            np.array([1, 1, 2, 3, 4], np.int64),
            "id_type_features[1].offsets",
        ),
        (
            ("id_type_features", 1, "offsets"),
            np.array([0, 1, 2, 3, 9], np.int64),
            "id_type_features[1].offsets",
        ),
        (
            ("non_id_type_features", 0, "data"),
            np.zeros((3, 3), np.float32),
            "non_id_type_features[0].data",
        ),
        (
            ("non_id_type_features", 0, "data"),
            np.zeros(4, np.uint32),
            "non_id_type_features[0].data",
        ),
        (("non_id_type_features", 0, "name"), 3, "non_id_type_features[0].name"),
        (("labels",), KeyError, "labels"),
        (("labels", 0, "data"), [1, 2, 3, 4], "labels[0].data"),
    ],
)
def test_from_wire_names_the_bad_field(path, value, field):
    with pytest.raises(InvalidInputError) as info:
        PersiaBatch.from_wire(_wire_with(path, value))
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: expected")


def test_from_wire_refuses_non_mappings():
    with pytest.raises(InvalidInputError, match="batch: expected a map"):
        PersiaBatch.from_wire([1, 2])


def test_from_csr_is_checked():
    f = IDTypeFeature.from_csr("t", np.array([1, 2, 3], U64), np.array([0, 0, 3], np.int64))
    assert [s.tolist() for s in f.data] == [[], [1, 2, 3]]
    with pytest.raises(InvalidInputError, match="offsets"):
        IDTypeFeature.from_csr("t", np.array([1, 2, 3], U64), np.array([0, 4], np.int64))


def test_building_a_large_batch_is_fast():
    # 65,535 samples x 26 single-id slots plus a variable-length slot: vectorized CSR build.
    import time

    n = MAX_BATCH_SIZE
    rng = np.random.default_rng(1)
    samples = [rng.integers(0, 1000, k, dtype=U64) for k in rng.integers(0, 5, n)]
    start = time.perf_counter()
    batch = PersiaBatch(
        [IDTypeFeature("tags", samples)]
        + [
            IDTypeFeatureWithSingleID(f"s{i}", rng.integers(0, 2**40, n, dtype=U64))
            for i in range(26)
        ],
        labels=[Label(np.zeros(n, np.float32))],
    )
    data = batch.to_bytes()
    PersiaBatch.from_bytes(data)
    assert time.perf_counter() - start < 2.0
