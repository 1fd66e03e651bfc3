"""NN worker script of the Adult example: train on the streamed batches, then report test AUC.

Started by ``persia-launcher nn-worker train.py --nproc-per-node N``. The training
batches arrive from ``data_loader.py`` through ``StreamingDataset`` (the loop ends by
itself when every data loader is done); the test set is read here and looked up
directly, without gradients (``eval_ctx`` + ``IterableDataset``). The last line
printed is ``test AUC: 0.xxxx``.

Environment knobs:
    EPOCHS               passes the data loaders send (default 1; sizes the progress bar)
    MAX_TRAIN_STEPS      stop training after this many batches (default: no cap)
    CHECKPOINT_DIR       dump the dense model and the embeddings there after training
    REPRODUCIBLE         1: hand batches out in batch-id order (default 0)
    EMBEDDING_STALENESS  bound on batches with embedding gradients in flight (default 10)
    MIXED_PRECISION      1: on a GPU, fp16 autocast + dynamic loss scaling (default, as in
                         PERSIA's example); 0: fp32. On the CPU the example trains in fp32
    PERSIA_TENSORBOARD_DIR  TensorBoard curves (loss, samples/s, ..., eval/auc) under
                         <dir>/<PERSIA_JOB_ID>/rank_<r> (read by TrainCtx itself)
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
from data_prep import env_int, load_adult, make_batches
from model import DNN
from tqdm import tqdm

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset, StreamingDataset
from persia.embedding.optim import Adagrad
from persia.env import get_local_rank, get_rank, get_world_size
from persia.logger import get_default_logger
from persia.utils import setup_seed

logger = get_default_logger("nn_worker")

TRAIN_BATCH_SIZE = 128  # must match data_loader.BATCH_SIZE (only sizes the progress bar)
TEST_BATCH_SIZE = 1024
EMBEDDING_LR = 0.05
DENSE_LR = 1e-3
BUFFER_SIZE = 10


class TestDataset(IterableDataset):
    """The UCI Adult test split as evaluation batches (``requires_grad=False``)."""

    def __init__(self, batch_size: int = TEST_BATCH_SIZE):
        super().__init__(buffer_size=BUFFER_SIZE)
        self.data = load_adult("test")
        self.batch_size = batch_size

    def __iter__(self):
        yield from make_batches(self.data, self.batch_size, requires_grad=False)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties at their average rank."""
    y = labels.reshape(-1) > 0.5
    _, inverse, counts = np.unique(scores.reshape(-1), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def evaluate(model: torch.nn.Module, loader: DataLoader, loss_fn: torch.nn.Module) -> float:
    """Test AUC (and log loss) of ``model`` over every batch of ``loader``."""
    model.eval()
    scores, labels, losses = [], [], []
    with eval_ctx(model=model) as ctx, torch.no_grad():
        for batch in tqdm(loader, desc="test", leave=False):
            output, batch_labels = ctx.forward(batch)
            label = batch_labels[0]
            losses.append(float(loss_fn(output.float(), label)) * len(label))
            scores.append(output.float().cpu().numpy().reshape(-1))
            labels.append(label.cpu().numpy().reshape(-1))
    model.train()
    all_labels, all_scores = np.concatenate(labels), np.concatenate(scores)
    auc = roc_auc(all_labels, all_scores)
    logger.info(
        f"test: {len(all_labels)} samples, loss {sum(losses) / len(all_labels):.4f}, AUC {auc:.4f}"
    )
    return auc


def main(model_factory=DNN) -> None:
    """Train, evaluate, print the test AUC; ``model_factory`` builds the dense model."""
    setup_seed(3)
    epochs = env_int("EPOCHS", 1)
    max_steps = env_int("MAX_TRAIN_STEPS", 0) or None
    checkpoint_dir = os.environ.get("CHECKPOINT_DIR") or None
    reproducible = bool(env_int("REPRODUCIBLE", 0))
    embedding_staleness = env_int("EMBEDDING_STALENESS", 10)

    rank, device_id, world_size = get_rank() or 0, get_local_rank(), get_world_size() or 1
    model = model_factory()
    mixed_precision = bool(env_int("MIXED_PRECISION", 1))
    if torch.cuda.is_available():
        device_id = device_id or 0
        torch.cuda.set_device(device_id)
        model.cuda(device_id)
    else:
        device_id, mixed_precision = None, False

    embedding_optimizer = Adagrad(lr=EMBEDDING_LR)
    dense_optimizer = torch.optim.Adam(model.parameters(), lr=DENSE_LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    train_samples = len(load_adult("train"))
    expected_steps = math.ceil(math.ceil(train_samples / TRAIN_BATCH_SIZE) * epochs / world_size)
    if max_steps is not None:
        expected_steps = min(expected_steps, max_steps)

    with TrainCtx(
        model=model,
        embedding_optimizer=embedding_optimizer,
        dense_optimizer=dense_optimizer,
        mixed_precision=mixed_precision,
        device_id=device_id,
    ) as ctx:
        train_loader = DataLoader(
            StreamingDataset(buffer_size=BUFFER_SIZE),
            reproducible=reproducible,
            embedding_staleness=embedding_staleness,
        )
        logger.info(f"rank {rank}/{world_size}: training, about {expected_steps} steps")
        progress = tqdm(train_loader, total=expected_steps, desc="train", disable=rank != 0)
        steps, losses = 0, []
        for batch in progress:
            output, labels = ctx.forward(batch)
            loss = loss_fn(output, labels[0])
            ctx.backward(loss)
            steps += 1
            losses.append(loss.item())
            progress.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
            if max_steps is not None and steps >= max_steps:
                break
        progress.close()
        window = max(1, min(20, len(losses) // 4))
        if losses:
            logger.info(
                f"rank {rank}: trained {steps} steps; mean loss of the first {window} steps "
                f"{np.mean(losses[:window]):.4f}, of the last {window} {np.mean(losses[-window:]):.4f}"
            )

        test_auc = evaluate(model, DataLoader(TestDataset()), loss_fn)
        ctx.log_scalar("eval/auc", test_auc)  # a point on the curves with PERSIA_TENSORBOARD_DIR

        if checkpoint_dir is not None:
            logger.info(f"dump checkpoint to {checkpoint_dir}")
            ctx.dump_checkpoint(checkpoint_dir)

    if rank == 0:
        print(f"test AUC: {test_auc:.4f}", flush=True)


if __name__ == "__main__":
    main()
