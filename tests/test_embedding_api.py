"""persia.embedding: EmbeddingConfig and the embedding optimizers validate and serialize every argument."""

from __future__ import annotations

import math

import pytest

from persia.embedding import EmbeddingConfig, get_default_embedding_config
from persia.embedding.optim import SGD, Adagrad, Adam, Optimizer
from pyrsia.shared.embedding_spec import (
    AdagradSpec,
    AdamSpec,
    EmbeddingHyperparams,
    SGDSpec,
    optimizer_from_dict,
)
from pyrsia.shared.errors import InvalidInputError

# --------------------------------------------------------------------------- EmbeddingConfig


def test_default_embedding_config_is_persias():
    cfg = get_default_embedding_config()
    assert cfg.emb_initialization == (-0.01, 0.01)
    assert cfg.admit_probability == 1.0
    assert cfg.weight_bound == 10
    assert cfg.to_hyperparams() == EmbeddingHyperparams()
    assert cfg.to_dict() == {
        "emb_initialization": [-0.01, 0.01],
        "admit_probability": 1.0,
        "weight_bound": 10.0,
    }


def test_embedding_config_round_trips_through_the_spec():
    cfg = EmbeddingConfig((-0.5, 0.25), admit_probability=0.3, weight_bound=0)
    params = EmbeddingHyperparams.from_dict(cfg.to_dict())
    assert params == cfg.to_hyperparams()
    assert EmbeddingConfig.from_hyperparams(params) == cfg


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"emb_initialization": (0.1, -0.1)}, "embedding_config.emb_initialization"),
        ({"emb_initialization": (0.1,)}, "embedding_config.emb_initialization"),
        ({"emb_initialization": ("a", 1)}, "embedding_config.emb_initialization[0]"),
        ({"admit_probability": 1.5}, "embedding_config.admit_probability"),
        ({"admit_probability": -0.1}, "embedding_config.admit_probability"),
        ({"admit_probability": math.nan}, "embedding_config.admit_probability"),
        ({"weight_bound": -1}, "embedding_config.weight_bound"),
        ({"weight_bound": True}, "embedding_config.weight_bound"),
    ],
)
def test_embedding_config_refuses_bad_values(kwargs, field):
    with pytest.raises(InvalidInputError) as info:
        EmbeddingConfig(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: expected")


# --------------------------------------------------------------------------- optimizers


def test_optimizer_defaults_are_persias():
    assert Adam().spec == AdamSpec(lr=1e-3, betas=(0.9, 0.999), weight_decay=0, eps=1e-8)
    assert Adagrad().spec == AdagradSpec(
        lr=1e-2,
        initial_accumulator_value=1e-2,
        weight_decay=0,
        g_square_momentum=1,
        eps=1e-10,
        vectorwise_shared=False,
    )
    assert SGD(0.1).spec == SGDSpec(lr=0.1, momentum=0.0, weight_decay=0.0)


def test_every_argument_reaches_the_wire_form():
    assert SGD(0.1, momentum=0.9, weight_decay=0.01).to_dict() == {
        "type": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 0.01,
    }
    assert Adam(0.01, betas=(0.8, 0.99), weight_decay=0.1, eps=1e-6).to_dict() == {
        "type": "adam",
        "lr": 0.01,
        "betas": [0.8, 0.99],
        "weight_decay": 0.1,
        "eps": 1e-6,
    }
    assert Adagrad(0.5, 0.1, 0.2, 0.9, 1e-8, True).to_dict() == {
        "type": "adagrad",
        "lr": 0.5,
        "initial_accumulator_value": 0.1,
        "weight_decay": 0.2,
        "g_square_momentum": 0.9,
        "eps": 1e-8,
        "vectorwise_shared": True,
    }


@pytest.mark.parametrize(
    "opt", [SGD(0.1, 0.5, 0.1), Adam(betas=(0.5, 0.6)), Adagrad(vectorwise_shared=True)]
)
def test_optimizers_round_trip_through_their_dict_form(opt):
    again = Optimizer.from_dict(opt.to_dict())
    assert type(again) is type(opt)
    assert again == opt
    assert optimizer_from_dict(opt.to_dict()) == opt.spec


def test_attributes_read_through_to_the_spec():
    opt = Adagrad(lr=0.3, g_square_momentum=0.5)
    assert (opt.lr, opt.g_square_momentum, opt.vectorwise_shared) == (0.3, 0.5, False)
    with pytest.raises(AttributeError, match="momentum"):
        _ = opt.momentum


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: SGD(0), "optimizer.lr"),
        (lambda: SGD("0.1"), "optimizer.lr"),
        (lambda: SGD(0.1, momentum=1.0), "optimizer.momentum"),
        (lambda: SGD(0.1, weight_decay=-1), "optimizer.weight_decay"),
        (lambda: Adam(lr=-1), "optimizer.lr"),
        (lambda: Adam(betas=(0.9,)), "optimizer.betas"),
        (lambda: Adam(betas=(0.9, 1.0)), "optimizer.betas[1]"),
        (lambda: Adam(eps=0), "optimizer.eps"),
        (lambda: Adam(weight_decay=math.inf), "optimizer.weight_decay"),
        (lambda: Adagrad(initial_accumulator_value=-1), "optimizer.initial_accumulator_value"),
        (lambda: Adagrad(g_square_momentum=0), "optimizer.g_square_momentum"),
        (lambda: Adagrad(g_square_momentum=1.5), "optimizer.g_square_momentum"),
        (lambda: Adagrad(eps=-1e-10), "optimizer.eps"),
        (lambda: Adagrad(vectorwise_shared=1), "optimizer.vectorwise_shared"),
    ],
)
def test_optimizers_refuse_bad_arguments(make, field):
    with pytest.raises(InvalidInputError) as info:
        make()
    assert info.value.field == field


def test_sgd_needs_a_learning_rate():
    with pytest.raises(TypeError):
        SGD()  # type: ignore[call-arg]


def test_from_dict_refuses_unknown_optimizers_and_keys():
    with pytest.raises(InvalidInputError) as info:
        Optimizer.from_dict({"type": "rmsprop", "lr": 0.1})
    assert info.value.field == "optimizer.type"
    with pytest.raises(InvalidInputError) as info:
        Optimizer.from_dict({"type": "sgd", "lr": 0.1, "nesterov": True})
    assert info.value.field == "optimizer.nesterov"
