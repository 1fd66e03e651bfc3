"""Bodies of the administration routes an embedding worker fans out to every PS replica.

::

    /configure           Configure          {"hyperparams": {...}}   (EmbeddingHyperparams)
    /register_optimizer  RegisterOptimizer  {"optimizer": {"type": ..., ...}}
    /dump, /load         Directory          {"dir": str}
    /clear, /stats       no body (or {})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyrsia.shared.embedding_spec import (
    EmbeddingHyperparams,
    OptimizerSpec,
    optimizer_from_dict,
    optimizer_to_dict,
)
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import as_dict, as_str, get


@dataclass(frozen=True)
class Configure:
    hyperparams: EmbeddingHyperparams

    @classmethod
    def from_wire(cls, body: Any) -> Configure:
        body = as_dict(body, "body")
        return cls(EmbeddingHyperparams.from_dict(get(body, "hyperparams"), field="hyperparams"))

    def to_wire(self) -> dict[str, Any]:
        return {"hyperparams": self.hyperparams.to_dict()}


@dataclass(frozen=True)
class RegisterOptimizer:
    optimizer: OptimizerSpec

    @classmethod
    def from_wire(cls, body: Any) -> RegisterOptimizer:
        body = as_dict(body, "body")
        return cls(optimizer_from_dict(get(body, "optimizer"), field="optimizer"))

    def to_wire(self) -> dict[str, Any]:
        return {"optimizer": optimizer_to_dict(self.optimizer)}


@dataclass(frozen=True)
class Directory:
    dir: str

    @classmethod
    def from_wire(cls, body: Any) -> Directory:
        return cls(as_str(get(as_dict(body, "body"), "dir"), "dir"))

    def to_wire(self) -> dict[str, Any]:
        return {"dir": self.dir}


@dataclass(frozen=True)
class Empty:
    """``/clear``, ``/stats``, ``/checksum``: no fields (a missing body is an
    empty one); any field is refused, so a stray body cannot clear a PS."""

    @classmethod
    def from_wire(cls, body: Any) -> Empty:
        if as_dict(body if body is not None else {}, "body"):
            raise InvalidInputError("body", "an empty map or no body", body)
        return cls()

    def to_wire(self) -> dict[str, Any]:
        return {}
