"""Embedding hyperparameters: initialization, admission and weight bound (PERSIA's API).

``EmbeddingConfig`` is a thin, validated wrapper around
:class:`pyrsia.shared.embedding_spec.EmbeddingHyperparams`, which is what the embedding
parameter servers receive.
"""

from __future__ import annotations

from typing import Any

from pyrsia.shared.embedding_spec import EmbeddingHyperparams

__all__ = ["EmbeddingConfig", "get_default_embedding_config"]


class EmbeddingConfig:
    """Embedding hyperparameters, the ``embedding_config`` argument of the contexts.

    Arguments:
        emb_initialization: (lower, upper) bounds of the uniform initial values, lower < upper.
        admit_probability: probability in [0, 1] that a new id seen in training is stored.
        weight_bound: every weight is clipped to [-weight_bound, weight_bound] after an
            update; >= 0, and 0 disables clipping.

    Every argument is checked here, so a bad value fails in the user's script and not
    on a server.
    """

    def __init__(
        self,
        emb_initialization: tuple[float, float] = (-0.01, 0.01),
        admit_probability: float = 1.0,
        weight_bound: float = 10,
    ):
        self._params = EmbeddingHyperparams(
            emb_initialization=emb_initialization,
            admit_probability=admit_probability,
            weight_bound=weight_bound,
        )

    @property
    def emb_initialization(self) -> tuple[float, float]:
        return self._params.emb_initialization

    @property
    def admit_probability(self) -> float:
        return self._params.admit_probability

    @property
    def weight_bound(self) -> float:
        return self._params.weight_bound

    def to_hyperparams(self) -> EmbeddingHyperparams:
        """The validated spec the embedding parameter servers are configured with."""
        return self._params

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{"emb_initialization": [lo, hi], "admit_probability": p, "weight_bound": b}``."""
        return self._params.to_dict()

    @classmethod
    def from_hyperparams(cls, params: EmbeddingHyperparams) -> EmbeddingConfig:
        lower, upper = params.emb_initialization
        return cls((lower, upper), params.admit_probability, params.weight_bound)

    def __repr__(self) -> str:
        return (
            f"EmbeddingConfig(emb_initialization={self.emb_initialization!r}, "
            f"admit_probability={self.admit_probability!r}, weight_bound={self.weight_bound!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmbeddingConfig) and other._params == self._params

    def __hash__(self) -> int:
        return hash(self._params)


def get_default_embedding_config() -> EmbeddingConfig:
    """PERSIA's defaults: Uniform(-0.01, 0.01), admit every id, weight bound 10."""
    return EmbeddingConfig()
