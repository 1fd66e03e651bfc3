"""UCI Adult, written the HybridBackend way: plain torch modules, tables on Pyrsia's PS.

Run (services from examples/hb_adult/Procfile, or any PS + embedding worker whose
embedding config is examples/hb_adult/embedding_config.yml)::

    python -m persia.hb.run python examples/hb_adult/train.py

What it shows:

- ``hb.context``: rank / world size, and ``hb.context.options`` set in code
  (``emb_staleness``) or from the environment (``HB_GRAD_NBUCKETS=2``);
- ``hb.function(sharding=True)``: the model's ``nn.EmbeddingBag`` / ``nn.Embedding``
  live on the embedding PS; the returned model is data parallel (DDP, grad_nbuckets
  buckets) when there are several ranks;
- ``hb.wraps(torch.optim.SGD)``: the dense optimizer, whose settings the PS applies to
  the tables too;
- ``hb.data.make_one_shot_iterator``: each rank trains on its share of the train split;
- ``hb.metrics.auc`` / ``accuracy`` in an ``eval_fn`` every ``EVAL_EVERY`` steps, exact
  over every rank's share of the test split;
- ``hb.train.export``: the serving artifact (rank 0), ``EXPORT_DIR``.

Environment: EPOCHS (1), MAX_STEPS (no cap), EVAL_EVERY (200), EXPORT_DIR (unset: no
export). The last line printed (rank 0) is ``test AUC: 0.xxxx``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import persia.hb as hb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adult_income"))
from data_prep import env_int, load_adult  # noqa: E402

COLUMN_VOCAB = 128  # ids per categorical column; Adult's largest column has 42 values
DIM = 8
BATCH_SIZE = 128
LR = 0.1


class WideModel(nn.Module):
    """An EmbeddingBag over the 8 categorical columns, an Embedding of education, an MLP."""

    def __init__(self, num_columns: int = 8, num_dense: int = 5):
        super().__init__()
        self.cats = nn.EmbeddingBag(num_columns * COLUMN_VOCAB, DIM, mode="sum")
        self.education = nn.Embedding(COLUMN_VOCAB, DIM)
        self.mlp = nn.Sequential(nn.Linear(num_dense + 2 * DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, cat_ids: torch.Tensor, education: torch.Tensor):
        return self.mlp(torch.cat([dense, self.cats(cat_ids), self.education(education)], dim=1))


def adult_dataset(split: str) -> TensorDataset:
    """(dense, cat ids offset per column, education id, label) tensors of one split."""
    data = load_adult(split)
    ids = torch.from_numpy(data.cat_ids.astype("int64"))
    cat_ids = ids + torch.arange(ids.shape[1]) * COLUMN_VOCAB
    education = ids[:, list(data.cat_columns).index("education")].contiguous()
    return TensorDataset(
        torch.from_numpy(data.dense), cat_ids, education, torch.from_numpy(data.label)
    )


@hb.function(sharding=True)
def build_model() -> nn.Module:
    torch.manual_seed(0)  # the same dense start on every rank (DDP broadcasts rank 0's anyway)
    return WideModel()


def main() -> int:
    hb.context.options.emb_staleness = 10  # embedding-gradient sends in flight per rank
    model = build_model()
    optimizer = hb.wraps(torch.optim.SGD)(model.parameters(), lr=LR)
    loss_fn = nn.BCEWithLogitsLoss()
    train_set, test_set = adult_dataset("train"), adult_dataset("test")

    def step(batch) -> None:
        dense, cat_ids, education, label = batch
        model.train()
        loss = loss_fn(model(dense, cat_ids, education), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def eval_fn() -> dict:
        auc, accuracy = hb.metrics.AUC(), hb.metrics.Accuracy(threshold=0.5)
        model.eval()
        with torch.no_grad():
            for dense, cat_ids, education, label in hb.data.make_one_shot_iterator(
                test_set, batch_size=4096, drop_remainder=False
            ):
                score = torch.sigmoid(model(dense, cat_ids, education))
                auc.update(label, score)
                accuracy.update(label, score)
        return {"auc": auc, "accuracy": accuracy}

    history = []
    max_steps = env_int("MAX_STEPS", 0) or None
    for epoch in range(env_int("EPOCHS", 1)):
        batches = hb.data.make_initializable_iterator(train_set, batch_size=BATCH_SIZE, seed=7)
        batches.initialize(epoch)
        history += hb.train.train_and_evaluate(
            step,
            batches,
            eval_fn=eval_fn,
            eval_every_n_iter=env_int("EVAL_EVERY", 200),
            max_steps=max_steps,
        )
    export_dir = os.environ.get("EXPORT_DIR")
    if export_dir and hb.context.is_chief:
        dense, cat_ids, education, _ = test_set[:64]
        path = hb.train.export(
            export_dir,
            model=model,
            example_inputs=(dense, cat_ids, education),
            non_id_names=["dense"],
            overwrite=True,
        )
        print(f"exported the serving artifact to {path}")
    if hb.context.is_chief:
        final = history[-1][1]
        print(f"rank 0 of {hb.context.world_size}: test accuracy: {final['accuracy']:.4f}")
        print(f"test AUC: {final['auc']:.4f}")
    hb.context.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
