"""The benchmark's DLRM-style model, PERSIA-style: ``forward(non_id_tensors, embedding_tensors)``.

One summed embedding per slot (dim 16) comes in from the embedding servers (Pyrsia: one
(batch, 16) tensor per slot) or from one ``nn.Embedding`` lookup (the single-process
baseline: one (batch, slots * 16) tensor); the dense features go through a bottom layer
``n_dense -> 64`` (ReLU); the concatenation (33 * 16 + 64 = 592 wide on Census-Income)
goes through the top MLP 592-512-256-1, which returns one logit per sample (the loss is
``BCEWithLogitsLoss``). Both sides of the benchmark build this exact class with the same
seed, so they start from the same weights.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DLRM", "EMBEDDING_DIM", "TOP_MLP", "build_model"]

EMBEDDING_DIM = 16
BOTTOM_MLP = (64,)
TOP_MLP = (512, 256)


class DLRM(nn.Module):
    """Bottom MLP over the dense features, top MLP over [slot embeddings, bottom output]."""

    def __init__(self, num_slots: int, num_dense: int, embedding_dim: int = EMBEDDING_DIM):
        super().__init__()
        if num_slots < 1 or num_dense < 1 or embedding_dim < 1:
            raise ValueError(
                "num_slots, num_dense, embedding_dim: expected positive integers, got "
                f"{num_slots}, {num_dense}, {embedding_dim}"
            )
        layers: list[nn.Module] = []
        width = num_dense
        for size in BOTTOM_MLP:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.bottom = nn.Sequential(*layers)
        layers = []
        width = num_slots * embedding_dim + BOTTOM_MLP[-1]
        for size in TOP_MLP:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.top = nn.Sequential(*layers)

    def forward(
        self, non_id_tensors: list[torch.Tensor], embedding_tensors: list[torch.Tensor]
    ) -> torch.Tensor:
        """Logits (batch, 1) from ``[dense]`` and the slot embeddings (concatenated in order)."""
        dense = self.bottom(non_id_tensors[0].float())
        return self.top(torch.cat([*embedding_tensors, dense], dim=1))


# Hyperparameters shared by both sides of the benchmark (Pyrsia's servers and the baseline).
SEED = 3
EMBEDDING_LR = 0.05
INITIAL_ACCUMULATOR = 1e-2
ADAGRAD_EPS = 1e-10
INIT_RANGE = (-0.01, 0.01)
DENSE_LR = 1e-3


def build_model(num_slots: int, num_dense: int, seed: int = SEED) -> DLRM:
    """The benchmark's model with its weights drawn from ``seed`` (:data:`SEED` unless a run
    sets another; the same on both sides)."""
    torch.manual_seed(seed)
    return DLRM(num_slots, num_dense)
