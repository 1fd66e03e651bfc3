"""The first job's NN worker: trains a click model on the streamed batches, then tests it.

``persia-launcher run`` (or ``persia-launcher nn-worker``) runs it. The model gets each
batch's dense features and one embedding per slot (``user``, ``item``: 8 numbers each,
looked up on the embedding parameter server); it returns one click logit per sample.
The last line printed is ``first job: trained <steps> steps, test AUC <auc>``.
"""

import numpy as np
import torch
from clicks import batches
from tqdm import tqdm

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset, StreamingDataset
from persia.embedding.optim import Adagrad
from persia.utils import setup_seed


class ClickModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(2 * 8 + 2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def forward(self, non_id_tensors, embedding_tensors):
        user, item = embedding_tensors  # (batch, 8) each, in slots_config order
        return self.mlp(torch.cat([user, item, non_id_tensors[0]], dim=1))


class TestBatches(IterableDataset):
    """Batches the job never trained on, looked up without gradients."""

    def __iter__(self):
        yield from batches(100_000, 20, requires_grad=False)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC: the chance that a random click scores above a random non-click."""
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positive = labels > 0.5
    n_pos, n_neg = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


setup_seed(0)
model = ClickModel()
loss_fn = torch.nn.BCEWithLogitsLoss()

with TrainCtx(
    model=model,
    embedding_optimizer=Adagrad(lr=0.1),
    dense_optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
    mixed_precision=False,
) as ctx:
    steps = 0
    for batch in tqdm(DataLoader(StreamingDataset(buffer_size=10)), desc="train"):
        output, labels = ctx.forward(batch)
        ctx.backward(loss_fn(output, labels[0]))
        steps += 1

    model.eval()
    scores, truth = [], []
    with eval_ctx(model=model) as test_ctx, torch.no_grad():
        for batch in DataLoader(TestBatches(buffer_size=10)):
            output, labels = test_ctx.forward(batch)
            scores.append(output.reshape(-1).numpy())
            truth.append(labels[0].reshape(-1).numpy())

print(
    f"first job: trained {steps} steps, test AUC {auc(np.concatenate(truth), np.concatenate(scores)):.4f}"
)
