"""The answer bodies of the PS and the embedding worker (pyrsia.shared.wire.ps / .worker) and the
``/predict`` bodies (pyrsia.shared.wire.serve): each is checked once where it is decoded, a bad
answer is a ProtocolError naming the field, and to_wire -> from_wire is the identity."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.config_schema import EmbeddingSchema, SlotConfig
from pyrsia.shared.errors import InvalidInputError, ProtocolError
from pyrsia.shared.wire.ps import (
    IdGroup,
    PSLookup,
    PSLookupAnswer,
    PSStats,
    PSUpdate,
    UpdateTotals,
)
from pyrsia.shared.wire.serve import DenseInput, PredictAnswer, PredictInputs, PredictRequest
from pyrsia.shared.wire.worker import GradientsApplied, WorkerSchema, WorkerStats


def _wire(body):
    """What the peer decodes: the body through the real msgpack codec."""
    return unpackb(packb(body))


LOOKUP = PSLookup(
    True, (IdGroup(4, np.arange(3, dtype=np.uint64)), IdGroup(8, np.arange(2, dtype=np.uint64)))
)


def test_lookup_answer_round_trips_against_its_request():
    groups = (np.ones((3, 4), np.float32), np.zeros((2, 8), np.float32))
    got = PSLookupAnswer.from_wire(_wire(PSLookupAnswer(groups).to_wire()), LOOKUP)
    assert [g.shape for g in got.groups] == [(3, 4), (2, 8)]
    np.testing.assert_array_equal(got.groups[0], groups[0])


@pytest.mark.parametrize(
    "groups, field",
    [
        ([np.ones((3, 4), np.float32)], "groups"),  # one group short
        ([np.ones((2, 4), np.float32), np.zeros((2, 8), np.float32)], "groups[0]"),  # rows
        ([np.ones((3, 4), np.float32), np.zeros((2, 7), np.float32)], "groups[1]"),  # dim
        ([np.ones((3, 4), np.float64), np.zeros((2, 8), np.float32)], "groups[0]"),  # dtype
        ("nope", "groups"),
    ],
)
def test_a_bad_lookup_answer_is_a_protocol_error_naming_the_field(groups, field):
    with pytest.raises(ProtocolError) as err:
        PSLookupAnswer.from_wire(_wire({"groups": groups}), LOOKUP)
    assert f"{field}:" in str(err.value) and "PS /lookup" in str(err.value)
    assert isinstance(err.value.__cause__, InvalidInputError)
    assert err.value.__cause__.field == field


CARRYING = PSLookup(
    True,
    (IdGroup(4, np.arange(3, dtype=np.uint64)),),
    (
        PSUpdate((IdGroup(4, np.arange(2, dtype=np.uint64), np.ones((2, 4), np.float32)),)),
        PSUpdate(()),
    ),
)


def test_a_lookup_carrying_updates_round_trips_and_its_answer_says_what_each_did():
    again = PSLookup.from_wire(_wire(CARRYING.to_wire()))
    assert [len(u.groups) for u in again.updates] == [1, 0]
    np.testing.assert_array_equal(again.updates[0].groups[0].grads, np.ones((2, 4), np.float32))
    assert "updates" not in LOOKUP.to_wire()  # a plain lookup's body is unchanged
    answer = PSLookupAnswer((np.ones((3, 4), np.float32),), (UpdateTotals(2), UpdateTotals()))
    got = PSLookupAnswer.from_wire(_wire(answer.to_wire()), CARRYING)
    assert got.applied == (UpdateTotals(2), UpdateTotals())


@pytest.mark.parametrize(
    "edit, field",
    [
        (
            lambda b: b["updates"][0]["groups"][0].update(grads=np.ones((3, 4), np.float32)),
            "updates[0].groups[0].grads",
        ),
        (lambda b: b["updates"].__setitem__(1, 7), "updates[1]"),
        (lambda b: b["updates"][1].pop("groups"), "updates[1].groups"),
        (lambda b: b.update(updates=[{"groups": []}] * 65), "updates"),
    ],
)
def test_a_bad_carried_update_names_its_field(edit, field):
    body = _wire(CARRYING.to_wire())
    edit(body)
    with pytest.raises(InvalidInputError) as err:
        PSLookup.from_wire(body)
    assert err.value.field == field


@pytest.mark.parametrize(
    "applied, field",
    [
        (None, "applied"),  # a PS that ignored the carried updates
        ([{"applied": 2, "skipped_unknown": 0, "skipped_nonfinite": 0}], "applied"),  # one short
        (
            [{"applied": 2, "skipped_unknown": 0, "skipped_nonfinite": 0}, {"applied": 0}],
            "applied[1].skipped_unknown",
        ),
    ],
)
def test_an_answer_that_does_not_account_for_carried_updates_is_a_protocol_error(applied, field):
    body = {"groups": [np.ones((3, 4), np.float32)]}
    if applied is not None:
        body["applied"] = applied
    with pytest.raises(ProtocolError) as err:
        PSLookupAnswer.from_wire(_wire(body), CARRYING)
    assert err.value.__cause__.field == field


def test_update_totals_add_and_round_trip():
    a, b = UpdateTotals(3, 1, 0), UpdateTotals(2, 0, 5)
    assert a + b == UpdateTotals(5, 1, 5)
    assert UpdateTotals.from_wire(_wire((a + b).to_wire())) == UpdateTotals(5, 1, 5)
    for bad in (
        {"applied": 1, "skipped_unknown": 0},
        {"applied": -1, "skipped_unknown": 0, "skipped_nonfinite": 0},
    ):
        with pytest.raises(ProtocolError, match="PS /update"):
            UpdateTotals.from_wire(bad)


def test_gradients_applied_round_trips_and_is_checked():
    answer = GradientsApplied(7, ("user",), UpdateTotals(10, 2, 0), 3)
    assert GradientsApplied.from_wire(_wire(answer.to_wire())) == answer
    body = answer.to_wire() | {"skipped_slots": [1]}
    with pytest.raises(ProtocolError, match=r"skipped_slots\[0\]"):
        GradientsApplied.from_wire(body)


def test_worker_schema_answer_carries_a_checked_schema():
    schema = EmbeddingSchema(slots_config=(SlotConfig("a", 4), SlotConfig("b", 8)))
    got = WorkerSchema.from_wire(_wire(WorkerSchema(schema, 2).to_wire()))
    assert got == WorkerSchema(schema, 2)
    with pytest.raises(ProtocolError, match="schema"):
        WorkerSchema.from_wire({"schema": {"slots_config": "x"}, "ps_replicas": 2})
    with pytest.raises(ProtocolError, match="ps_replicas"):
        WorkerSchema.from_wire({"schema": schema.to_dict()})


def test_stats_answers_keep_every_counter_and_check_the_ones_clients_read():
    ps = {"entries": 10, "updates_applied": 4, "evictions": 1, "optimizer": None}
    body = {"pending": 1, "awaiting_gradients": 2, "expired": 0, "ps": [ps, ps]}
    stats = WorkerStats.from_wire(_wire(body))
    assert [s.entries for s in stats.ps] == [10, 10] and stats.ps[0].details["evictions"] == 1
    assert stats.details["expired"] == 0 and WorkerStats.from_wire(stats.to_wire()).pending == 1
    assert PSStats.from_wire(ps).to_wire() == ps
    with pytest.raises(ProtocolError, match=r"ps\[1\]\.entries"):
        WorkerStats.from_wire(body | {"ps": [ps, {"updates_applied": 1}]})


INPUTS = PredictInputs((DenseInput("dense", np.dtype(np.float32), (3,)),), ("a", "b"), 8)


def _request(batch=2):
    return {
        "non_id": {"dense": np.ones((batch, 3), np.float32)},
        "ids": {
            "a": np.arange(batch, dtype=np.uint64),
            "b": {"ids": [5, 6, 7], "offsets": [0, 1, 3][: batch + 1]},
        },
    }


def test_predict_request_round_trips_in_both_formats():
    req = PredictRequest.from_wire(_wire(_request()), INPUTS)
    assert req.batch_size == 2 and [f.name for f in req.id_part.id_type_features] == ["a", "b"]
    np.testing.assert_array_equal(req.id_part.id_type_features[1].offsets, [0, 1, 3])
    for as_json in (False, True):
        body = req.to_wire(as_json=as_json)
        body = json.loads(json.dumps(body)) if as_json else _wire(body)
        again = PredictRequest.from_wire(body, INPUTS)
        np.testing.assert_array_equal(again.non_id_arrays[0], req.non_id_arrays[0])
        np.testing.assert_array_equal(again.id_part.id_type_features[1].ids, [5, 6, 7])


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda b: b["non_id"].pop("dense"), "non_id.dense"),
        (lambda b: b["non_id"].update(dense=np.ones((2, 4), np.float32)), "non_id.dense"),
        (lambda b: b["non_id"].update(dense=np.full((2, 3), np.nan, np.float32)), "non_id.dense"),
        (lambda b: b["ids"].update(a=np.array([-1, 2])), "ids.a"),
        (lambda b: b["ids"].update(a=np.arange(3, dtype=np.uint64)), "ids.a"),
        (lambda b: b["ids"]["b"].update(offsets=[0, 2, 1]), "ids.b.offsets"),
        (lambda b: b["ids"]["b"].pop("ids"), "ids.b.ids"),
        (lambda b: b["ids"].update(c=[1, 2]), "ids"),
        (lambda b: b.update(junk=1), "body"),
        (lambda b: b.pop("ids"), "ids"),
    ],
)
def test_a_bad_predict_request_names_the_field(edit, field):
    body = _request()
    edit(body)
    with pytest.raises(InvalidInputError) as err:
        PredictRequest.from_wire(body, INPUTS)
    assert err.value.field == field


def test_predict_request_refuses_a_batch_over_the_cap():
    with pytest.raises(InvalidInputError, match="1 to 8 samples") as err:
        PredictRequest.from_wire(
            _request(batch=9)
            | {"ids": {"a": np.arange(9, dtype=np.uint64), "b": np.arange(9, dtype=np.uint64)}},
            INPUTS,
        )
    assert err.value.field == "non_id.dense"


def test_predict_answer_round_trips_and_is_checked():
    out = PredictAnswer(2, (("output_0", np.array([[0.5], [0.25]], np.float32)),))
    for as_json in (False, True):
        body = (
            json.loads(json.dumps(out.to_wire(as_json=True))) if as_json else _wire(out.to_wire())
        )
        got = PredictAnswer.from_wire(body)
        assert got.batch_size == 2 and got.outputs[0][0] == "output_0"
        np.testing.assert_allclose(got.outputs[0][1], out.outputs[0][1])
    with pytest.raises(ProtocolError, match="outputs.output_0"):
        PredictAnswer.from_wire({"batch_size": 3, "outputs": {"output_0": [[1.0], [2.0]]}})
