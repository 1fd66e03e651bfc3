"""Validated embedding optimizer and embedding hyper-parameter specs.

These frozen dataclasses are shared by the public API (``persia.embedding.optim``,
``persia.embedding.EmbeddingConfig`` wrap them) and by the embedding parameter
server, which receives them as plain dicts over the wire. Each spec validates
itself on construction and raises :class:`~pyrsia.shared.errors.InvalidInputError`
naming the field (``optimizer.lr``) and what was expected, so a bad value is
refused at the client before it reaches a server, and again at the server.

Wire form::

    {"type": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
    {"type": "adam", "lr": 0.001, "betas": [0.9, 0.999], "weight_decay": 0.0, "eps": 1e-08}
    {"type": "adagrad", "lr": 0.01, "initial_accumulator_value": 0.01, "weight_decay": 0.0,
     "g_square_momentum": 1.0, "eps": 1e-10, "vectorwise_shared": False}
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pyrsia.shared.errors import InvalidInputError

__all__ = [
    "AdagradSpec",
    "AdamSpec",
    "EmbeddingHyperparams",
    "OptimizerSpec",
    "SGDSpec",
    "optimizer_from_dict",
    "optimizer_to_dict",
]


def _number(value: Any, field: str) -> float:
    """``value`` as a finite float; bools and non-numbers are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(field, "a number", value)
    out = float(value)
    if not math.isfinite(out):
        raise InvalidInputError(field, "a finite number", value)
    return out


def _check(value: Any, field: str, expected: str, ok) -> float:
    number = _number(value, field)
    if not ok(number):
        raise InvalidInputError(field, expected, value)
    return number


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _pair(value: Any, field: str) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InvalidInputError(field, "a pair of two numbers", value)
    return (_number(value[0], f"{field}[0]"), _number(value[1], f"{field}[1]"))


@dataclass(frozen=True)
class SGDSpec:
    """Plain SGD, with PyTorch's momentum semantics (dampening 0, no Nesterov) and L2 weight decay."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _set(self, "lr", _check(self.lr, "optimizer.lr", "a positive number", lambda x: x > 0))
        _set(
            self,
            "momentum",
            _check(self.momentum, "optimizer.momentum", "a number in [0, 1)", lambda x: 0 <= x < 1),
        )
        _set(
            self,
            "weight_decay",
            _check(self.weight_decay, "optimizer.weight_decay", "a number >= 0", lambda x: x >= 0),
        )


@dataclass(frozen=True)
class AdamSpec:
    """PyTorch Adam: L2 weight decay added to the gradient, bias correction with a per-entry step."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _set(self, "lr", _check(self.lr, "optimizer.lr", "a positive number", lambda x: x > 0))
        b1, b2 = _pair(self.betas, "optimizer.betas")
        for i, b in enumerate((b1, b2)):
            if not 0 <= b < 1:
                raise InvalidInputError(f"optimizer.betas[{i}]", "a number in [0, 1)", b)
        _set(self, "betas", (b1, b2))
        _set(
            self,
            "weight_decay",
            _check(self.weight_decay, "optimizer.weight_decay", "a number >= 0", lambda x: x >= 0),
        )
        _set(self, "eps", _check(self.eps, "optimizer.eps", "a positive number", lambda x: x > 0))


@dataclass(frozen=True)
class AdagradSpec:
    """PERSIA's Adagrad: ``w -= lr*(g + wd*w)/sqrt(a + eps)``, then ``a = a*g_square_momentum + g^2``.

    With ``vectorwise_shared`` one accumulator per entry is kept and updated with mean(g^2).
    """

    lr: float = 1e-2
    initial_accumulator_value: float = 1e-2
    weight_decay: float = 0.0
    g_square_momentum: float = 1.0
    eps: float = 1e-10
    vectorwise_shared: bool = False

    def __post_init__(self) -> None:
        _set(self, "lr", _check(self.lr, "optimizer.lr", "a positive number", lambda x: x > 0))
        _set(
            self,
            "initial_accumulator_value",
            _check(
                self.initial_accumulator_value,
                "optimizer.initial_accumulator_value",
                "a number >= 0",
                lambda x: x >= 0,
            ),
        )
        _set(
            self,
            "weight_decay",
            _check(self.weight_decay, "optimizer.weight_decay", "a number >= 0", lambda x: x >= 0),
        )
        _set(
            self,
            "g_square_momentum",
            _check(
                self.g_square_momentum,
                "optimizer.g_square_momentum",
                "a number in (0, 1]",
                lambda x: 0 < x <= 1,
            ),
        )
        _set(self, "eps", _check(self.eps, "optimizer.eps", "a positive number", lambda x: x > 0))
        if not isinstance(self.vectorwise_shared, bool):
            raise InvalidInputError("optimizer.vectorwise_shared", "a bool", self.vectorwise_shared)


OptimizerSpec = SGDSpec | AdamSpec | AdagradSpec

_TYPES: dict[str, type] = {"sgd": SGDSpec, "adam": AdamSpec, "adagrad": AdagradSpec}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def optimizer_to_dict(spec: OptimizerSpec) -> dict:
    """The wire form of ``spec``: its fields plus ``"type"``; tuples become lists."""
    name = _NAMES.get(type(spec))
    if name is None:
        raise InvalidInputError("optimizer", "an SGDSpec, AdamSpec or AdagradSpec", spec)
    out: dict[str, Any] = {"type": name}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def optimizer_from_dict(d: object, field: str = "optimizer") -> OptimizerSpec:
    """Build and validate an optimizer spec from its wire form; errors name ``field.<key>``."""
    if not isinstance(d, dict):
        raise InvalidInputError(field, "a mapping with a 'type' key", d)
    kind = d.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidInputError(f"{field}.type", f"one of {sorted(_TYPES)}", kind)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in d.items():
        if key == "type":
            continue
        if key not in known:
            raise InvalidInputError(
                f"{field}.{key}", f"no such key for {kind} (known: {sorted(known)})", value
            )
        kwargs[key] = value
    if cls is SGDSpec and "lr" not in kwargs:
        raise InvalidInputError(f"{field}.lr", "a positive number (required for sgd)")
    try:
        return cls(**kwargs)
    except InvalidInputError as exc:
        if field == "optimizer":
            raise
        raise InvalidInputError(
            exc.field.replace("optimizer", field, 1), exc.expected, exc.got
        ) from exc


def _replace_prefix(exc: InvalidInputError, field: str) -> InvalidInputError:
    return InvalidInputError(exc.field.replace("embedding_config", field, 1), exc.expected, exc.got)


@dataclass(frozen=True)
class EmbeddingHyperparams:
    """How new entries are initialized and admitted, and how far weights may grow.

    ``emb_initialization``: (lower, upper) of the uniform initial values (lower < upper);
    ``admit_probability``: chance that a training lookup of an unknown id stores it;
    ``weight_bound``: weights are clipped to [-bound, bound] after each update; 0 disables.
    """

    emb_initialization: tuple[float, float] = (-0.01, 0.01)
    admit_probability: float = 1.0
    weight_bound: float = 10.0

    def __post_init__(self) -> None:
        lower, upper = _pair(self.emb_initialization, "embedding_config.emb_initialization")
        if not lower < upper:
            raise InvalidInputError(
                "embedding_config.emb_initialization", "lower < upper", self.emb_initialization
            )
        _set(self, "emb_initialization", (lower, upper))
        _set(
            self,
            "admit_probability",
            _check(
                self.admit_probability,
                "embedding_config.admit_probability",
                "a number in [0, 1]",
                lambda x: 0 <= x <= 1,
            ),
        )
        _set(
            self,
            "weight_bound",
            _check(
                self.weight_bound,
                "embedding_config.weight_bound",
                "a number >= 0 (0 disables clipping)",
                lambda x: x >= 0,
            ),
        )

    def to_dict(self) -> dict:
        """The wire form: ``{"emb_initialization": [lo, hi], "admit_probability": p, "weight_bound": b}``."""
        return {
            "emb_initialization": list(self.emb_initialization),
            "admit_probability": self.admit_probability,
            "weight_bound": self.weight_bound,
        }

    @classmethod
    def from_dict(cls, d: object, field: str = "embedding_config") -> EmbeddingHyperparams:
        """Build and validate from the wire form; missing keys take their defaults."""
        if not isinstance(d, dict):
            raise InvalidInputError(field, "a mapping", d)
        known = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            if key not in known:
                raise InvalidInputError(
                    f"{field}.{key}", f"no such key (known: {sorted(known)})", d[key]
                )
        try:
            return cls(**d)
        except InvalidInputError as exc:
            if field == "embedding_config":
                raise
            raise _replace_prefix(exc, field) from exc
