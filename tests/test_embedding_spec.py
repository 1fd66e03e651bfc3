"""Validation and wire form of the shared optimizer and embedding hyper-parameter specs."""

from __future__ import annotations

import pytest

from pyrsia.shared.embedding_spec import (
    AdagradSpec,
    AdamSpec,
    EmbeddingHyperparams,
    SGDSpec,
    optimizer_from_dict,
    optimizer_to_dict,
)
from pyrsia.shared.errors import InvalidInputError


def test_defaults_match_persia():
    assert AdamSpec() == AdamSpec(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, eps=1e-8)
    a = AdagradSpec()
    assert (
        a.lr,
        a.initial_accumulator_value,
        a.weight_decay,
        a.g_square_momentum,
        a.eps,
        a.vectorwise_shared,
    ) == (
        1e-2,
        1e-2,
        0.0,
        1.0,
        1e-10,
        False,
    )
    assert SGDSpec(0.1) == SGDSpec(lr=0.1, momentum=0.0, weight_decay=0.0)
    h = EmbeddingHyperparams()
    assert (h.emb_initialization, h.admit_probability, h.weight_bound) == ((-0.01, 0.01), 1.0, 10.0)


@pytest.mark.parametrize(
    "spec",
    [
        SGDSpec(0.5, momentum=0.9, weight_decay=1e-4),
        AdamSpec(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, eps=1e-6),
        AdagradSpec(
            lr=0.1,
            initial_accumulator_value=0.5,
            weight_decay=0.01,
            g_square_momentum=0.9,
            eps=1e-8,
            vectorwise_shared=True,
        ),
    ],
)
def test_optimizer_round_trip(spec):
    d = optimizer_to_dict(spec)
    assert optimizer_from_dict(d) == spec
    assert d["type"] in {"sgd", "adam", "adagrad"}


def test_to_dict_shapes():
    assert optimizer_to_dict(AdamSpec())["betas"] == [0.9, 0.999]
    assert optimizer_to_dict(AdagradSpec()) == {
        "type": "adagrad",
        "lr": 0.01,
        "initial_accumulator_value": 0.01,
        "weight_decay": 0.0,
        "g_square_momentum": 1.0,
        "eps": 1e-10,
        "vectorwise_shared": False,
    }
    assert optimizer_to_dict(SGDSpec(1)) == {
        "type": "sgd",
        "lr": 1.0,
        "momentum": 0.0,
        "weight_decay": 0.0,
    }


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SGDSpec(0), "optimizer.lr"),
        (lambda: SGDSpec(-1), "optimizer.lr"),
        (lambda: SGDSpec(True), "optimizer.lr"),
        (lambda: SGDSpec("0.1"), "optimizer.lr"),
        (lambda: SGDSpec(float("nan")), "optimizer.lr"),
        (lambda: SGDSpec(0.1, momentum=1.0), "optimizer.momentum"),
        (lambda: SGDSpec(0.1, weight_decay=-1), "optimizer.weight_decay"),
        (lambda: AdamSpec(betas=(0.9,)), "optimizer.betas"),
        (lambda: AdamSpec(betas=(0.9, 1.0)), "optimizer.betas[1]"),
        (lambda: AdamSpec(eps=0), "optimizer.eps"),
        (lambda: AdagradSpec(g_square_momentum=0), "optimizer.g_square_momentum"),
        (lambda: AdagradSpec(initial_accumulator_value=-1), "optimizer.initial_accumulator_value"),
        (lambda: AdagradSpec(vectorwise_shared=1), "optimizer.vectorwise_shared"),
    ],
)
def test_bad_values_name_the_field(build, field):
    with pytest.raises(InvalidInputError) as info:
        build()
    assert info.value.field == field
    assert str(info.value).startswith(field + ": expected")


def test_from_dict_errors():
    with pytest.raises(
        InvalidInputError, match=r"optimizer.type: expected one of \['adagrad', 'adam', 'sgd'\]"
    ):
        optimizer_from_dict({"type": "rmsprop", "lr": 1})
    with pytest.raises(InvalidInputError, match="optimizer: expected a mapping"):
        optimizer_from_dict([1, 2])
    with pytest.raises(InvalidInputError, match="optimizer.momentun: expected no such key"):
        optimizer_from_dict({"type": "sgd", "lr": 1, "momentun": 0.9})
    with pytest.raises(InvalidInputError, match="optimizer.lr"):
        optimizer_from_dict({"type": "sgd"})
    with pytest.raises(InvalidInputError, match="body.optimizer.lr: expected a number"):
        optimizer_from_dict({"type": "adam", "lr": False}, field="body.optimizer")


def test_hyperparams_validation_and_round_trip():
    h = EmbeddingHyperparams((-0.1, 0.2), 0.5, 0)
    assert EmbeddingHyperparams.from_dict(h.to_dict()) == h
    assert h.to_dict() == {
        "emb_initialization": [-0.1, 0.2],
        "admit_probability": 0.5,
        "weight_bound": 0.0,
    }
    for kwargs, field in [
        ({"emb_initialization": (0.1, 0.1)}, "embedding_config.emb_initialization"),
        ({"emb_initialization": (0, float("inf"))}, "embedding_config.emb_initialization[1]"),
        ({"admit_probability": 1.5}, "embedding_config.admit_probability"),
        ({"weight_bound": -1}, "embedding_config.weight_bound"),
    ]:
        with pytest.raises(InvalidInputError) as info:
            EmbeddingHyperparams(**kwargs)
        assert info.value.field == field
    with pytest.raises(InvalidInputError, match="cfg.admit_probabilty: expected no such key"):
        EmbeddingHyperparams.from_dict({"admit_probabilty": 1}, field="cfg")
    with pytest.raises(InvalidInputError, match="cfg.weight_bound"):
        EmbeddingHyperparams.from_dict({"weight_bound": "x"}, field="cfg")
