"""The Adult example's dense network, in PERSIA's ``forward(non_id_tensors, embedding_tensors)`` style.

Inputs per batch (what ``TrainCtx.forward`` hands the model)::

    non_id_tensors   [dense]        dense: float32 (batch, 5), standardized
    embedding_tensors [e_0 .. e_7]  e_i:   float32 (batch, 8), one summed slot each

The slots are concatenated (batch, 64), the dense features get a small projection
(batch, 16), and an MLP 256-128-1 with ReLU maps both to one **logit** per sample.
Returning logits (not probabilities) lets ``train.py`` use ``BCEWithLogitsLoss``,
which is numerically stable where ``sigmoid`` + ``BCELoss`` saturates.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DNN"]


class DNN(nn.Module):
    """A small DNN over 8 embedding slots and 5 dense features, returning logits (batch, 1)."""

    def __init__(
        self,
        num_slots: int = 8,
        embedding_dim: int = 8,
        num_dense: int = 5,
        dense_mlp_output_size: int = 16,
        hidden_sizes: tuple[int, ...] = (256, 128),
    ):
        super().__init__()
        self.num_slots = num_slots
        self.embedding_dim = embedding_dim
        self.dense_mlp = nn.Sequential(nn.Linear(num_dense, dense_mlp_output_size), nn.ReLU())
        layers: list[nn.Module] = []
        width = num_slots * embedding_dim + dense_mlp_output_size + num_dense
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.top_mlp = nn.Sequential(*layers)

    def forward(
        self, non_id_tensors: list[torch.Tensor], embedding_tensors: list[torch.Tensor]
    ) -> torch.Tensor:
        """Logits (batch, 1) from ``[dense]`` and one (batch, dim) tensor per slot."""
        dense = non_id_tensors[0].float()
        sparse = torch.cat([e.float() for e in embedding_tensors], dim=1)
        x = torch.cat([sparse, self.dense_mlp(dense), dense], dim=1)
        return self.top_mlp(x)
