"""TorchRec's fused CPU embeddings as a second single-process peer of the e2e benchmark.

Issue 10 names it as the optional second yardstick: the same dense model and batches as
``baseline.py``, with the embeddings in a ``FusedEmbeddingBagCollection`` (one table per
slot, FBGEMM's CPU kernels, the Adagrad update fused into the backward pass) instead of one
``nn.Embedding`` and a separate sparse Adagrad step.

TorchRec is not a dependency of Pyrsia: install it by hand to run this peer::

    pip install fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions torchmetrics==1.0.3 tqdm
    pip install --no-deps torchrec==1.8.0

Same hyperparameters as the baseline: FBGEMM's exact Adagrad starts its accumulator at 0,
so the peer fills it with ``initial_accumulator_value`` after construction (left at 0, it
scores what ``torch.optim.Adagrad(initial_accumulator_value=0)`` does: on 2026-11-25 the
baseline at 0 gave 0.7676 test AUC on the Criteo-shaped set instead of 0.7469, and TorchRec
at 0 gave 0.7676 too). Init is the same Uniform(low, high), drawn by TorchRec's table
initializer rather than ``nn.init.uniform_``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["TorchRecEmbeddings", "torchrec_missing"]

INSTALL = (
    "pip install fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions torchmetrics==1.0.3 tqdm "
    "&& pip install --no-deps torchrec==1.8.0"
)


def torchrec_missing() -> str | None:
    """Why TorchRec cannot be used here (None when it can)."""
    try:
        with warnings.catch_warnings():  # its imports warn of deprecations in its dependencies
            warnings.simplefilter("ignore", DeprecationWarning)
            import torchrec  # noqa: F401
            from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: F401
    except Exception as exc:  # ImportError, or fbgemm's kernels failing to load
        return (
            f"TorchRec is not importable ({type(exc).__name__}: {exc}); install it with: {INSTALL}"
        )
    return None


class TorchRecEmbeddings(nn.Module):
    """One TorchRec table per slot (sum-pooled, one id per sample), Adagrad fused into backward.

    Same interface as ``baseline.FlatEmbeddings``: ``rows(cat_ids)`` turns a batch's
    (batch, slots) ids into the module's input, ``forward`` returns (batch, slots * dim),
    slot-major like a concatenation. ``fused_optimizer`` tells the training loop that the
    update happens inside ``loss.backward()``.
    """

    fused_optimizer = True

    def __init__(
        self,
        slot_sizes: Sequence[int],
        dim: int,
        init: tuple[float, float],
        *,
        lr: float,
        eps: float,
        initial_accumulator_value: float = 0.0,
    ):
        super().__init__()
        from torchrec import EmbeddingBagConfig, PoolingType
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        if not slot_sizes or any(int(s) < 1 for s in slot_sizes):
            raise ValueError(f"slot_sizes: expected positive integers, got {list(slot_sizes)}")
        self.sizes = np.array([int(s) for s in slot_sizes], dtype=np.uint64)
        self.keys = [f"slot_{j}" for j in range(len(slot_sizes))]
        tables = [
            EmbeddingBagConfig(
                name=f"table_{j}",
                embedding_dim=dim,
                num_embeddings=int(size),
                feature_names=[key],
                pooling=PoolingType.SUM,
                weight_init_min=init[0],
                weight_init_max=init[1],
            )
            for j, (key, size) in enumerate(zip(self.keys, self.sizes, strict=True))
        ]
        self.collection = FusedEmbeddingBagCollection(
            tables=tables,
            optimizer_type=torch.optim.Adagrad,
            optimizer_kwargs={"lr": lr, "eps": eps},
            device=torch.device("cpu"),
        )
        with torch.no_grad():  # FBGEMM's accumulators start at 0; torch's Adagrad at this
            for module in self.collection._emb_modules:
                for states in module._emb_module.split_optimizer_states():
                    for state in states:
                        state.fill_(initial_accumulator_value)

    def rows(self, cat_ids: np.ndarray):
        """The batch as a KeyedJaggedTensor: per slot, one id (modulo its size) per sample."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        ids = (cat_ids % self.sizes).astype(np.int64)  # (batch, slots)
        values = torch.from_numpy(np.ascontiguousarray(ids.T).reshape(-1))  # slot-major
        lengths = torch.ones(values.shape[0], dtype=torch.int32)
        return KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=values, lengths=lengths)

    def forward(self, features) -> torch.Tensor:
        """(batch, slots * dim): each slot's pooled vector, in slot order."""
        return self.collection(features).values()
