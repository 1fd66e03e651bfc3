"""Single-process PyTorch baseline: the yardstick for Pyrsia's quality and speed.

Trains the same dense model a Pyrsia job trains, but with the embeddings held in the
process, the way a plain PyTorch user would write it (issue 10 defines it):

- one ``nn.Embedding(sum of slot vocabularies, dim, sparse=True)`` for all slots, with
  per-slot row offsets, so one lookup serves every slot of a batch;
- initialized Uniform(-0.01, 0.01) (``emb_initialization``), updated by
  ``torch.optim.Adagrad(lr, initial_accumulator_value)`` on its sparse gradients;
- the dense network updated by ``torch.optim.Adam``; loss ``BCEWithLogitsLoss``;
- the first step is not timed (lazy initialization of kernels and optimizer state).

The model is called PERSIA-style, ``model([dense], [embeddings])``, with the embeddings
as one (batch, slots * dim) tensor: a model that concatenates its slot embeddings (as
every model here does) computes exactly what it computes on Pyrsia's per-slot tensors.
Tests use it to prove model quality without any service; benchmarks run it side by
side with the distributed pipeline.

A batch is a plain tuple of arrays::

    cat_ids uint64  (batch, slots)  one id per slot and sample
    dense   float32 (batch, n_dense)
    label   float32 (batch, 1)

Slot ``j`` holds ``slot_sizes[j]`` rows; an id is taken modulo that size, which is
exact for vocabulary ids (id < size) and a hashing trick for huge id spaces.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]

__all__ = ["Batch", "array_batches", "roc_auc", "FlatEmbeddings", "train_single_process"]


def array_batches(
    cat_ids: np.ndarray, dense: np.ndarray, label: np.ndarray, batch_size: int
) -> Iterator[Batch]:
    """Consecutive (cat_ids, dense, label) slices of ``batch_size`` rows (the last may be short)."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    n = len(label)
    for start in range(0, n, batch_size):
        end = min(start + batch_size, n)
        yield cat_ids[start:end], dense[start:end], label[start:end]


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties), vectorized.

    ``labels`` are 0/1, ``scores`` any monotone score (logits or probabilities).
    NaN when only one class is present.
    """
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores: expected equal lengths, got {y.size} and {s.size}")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based mean rank of each tie group
    rank_sum = average_rank[inverse][y].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


class FlatEmbeddings(nn.Module):
    """All slots in one ``nn.Embedding(sum(slot_sizes), dim, sparse=True)``; slot ``j``'s rows
    start at ``offsets[j]``. Initialized Uniform(low, high) like the embedding servers."""

    def __init__(self, slot_sizes: Sequence[int], dim: int, init: tuple[float, float]):
        super().__init__()
        if not slot_sizes or any(int(s) < 1 for s in slot_sizes):
            raise ValueError(f"slot_sizes: expected positive integers, got {list(slot_sizes)}")
        sizes = np.array([int(s) for s in slot_sizes], dtype=np.uint64)
        self.sizes = sizes
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.table = nn.Embedding(int(sizes.sum()), dim, sparse=True)
        nn.init.uniform_(self.table.weight, init[0], init[1])

    def rows(self, cat_ids: np.ndarray) -> torch.Tensor:
        """Row indices (batch, slots) int64: each id modulo its slot's size, plus the offset."""
        return torch.from_numpy((cat_ids % self.sizes).astype(np.int64) + self.offsets)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """One lookup for every slot: (batch, slots * dim), slot-major like a concatenation."""
        return self.table(rows).flatten(1)


def train_single_process(
    train_batches: Iterable[Batch],
    test_batches: Iterable[Batch],
    slot_sizes: Sequence[int],
    dim: int,
    model_factory: Callable[[], nn.Module],
    embedding_lr: float = 5e-2,
    dense_lr: float = 1e-3,
    *,
    initial_accumulator_value: float = 1e-2,
    emb_initialization: tuple[float, float] = (-0.01, 0.01),
    seed: int = 0,
    max_steps: int | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    autocast_dtype: torch.dtype | None = None,
    clock: Any = None,
    embedding_factory: Callable[[], nn.Module] | None = None,
    fused_adam: bool = False,
) -> dict[str, Any]:
    """Train ``model_factory()`` on ``train_batches`` for one pass, then score ``test_batches``.

    ``model_factory()`` must return logits (batch, 1) from ``model([dense], [embeddings])``.
    ``progress`` may wrap the training iterable (e.g. ``tqdm``). Returns
    ``{"samples_per_s", "auc", "losses", "steps", "samples", "train_seconds",
    "timed_steps", "timed_samples"}``. The clock starts after the first step (which
    allocates the optimizers' state and warms the kernels); ``samples_per_s`` is the
    timed samples over the timed loop (batch conversion, forward, backward, both
    optimizer steps). ``autocast_dtype`` (e.g. ``torch.bfloat16``) runs the model's forward
    under CPU autocast, as Pyrsia's ``mixed_precision=True`` does on the CPU. ``clock`` (a
    ``pyrsia.services.nn_worker.step_clock.StepClock``) gets the timed steps' phases: ``embedding``
    (row ids and the lookup), ``forward`` (model, loss), ``autograd``, ``embedding_step``
    (sparse Adagrad), ``dense_step`` (Adam).

    ``embedding_factory`` builds another embedding module with ``FlatEmbeddings``' interface
    (``rows``, ``forward``), e.g. ``torchrec_peer.TorchRecEmbeddings``; one whose
    ``fused_optimizer`` is true updates itself inside ``loss.backward()``, so no Adagrad is
    made for it and its ``embedding_step`` is empty.

    ``fused_adam`` steps the dense model with ``Adam(fused=True)`` (one kernel per parameter
    instead of one per operation; the same update) instead of the issue's default ``Adam``.
    """
    embeddings, model, emb_opt, dense_opt, loss_fn, autocast = _build_training(
        seed,
        slot_sizes,
        dim,
        model_factory,
        embedding_factory,
        emb_initialization,
        embedding_lr,
        initial_accumulator_value,
        dense_lr,
        fused_adam,
        autocast_dtype,
    )
    iterable = progress(train_batches) if progress is not None else train_batches
    losses, samples, first_samples, train_seconds = _train_pass(
        iterable, embeddings, model, emb_opt, dense_opt, loss_fn, autocast, max_steps, clock
    )
    auc = _evaluate(test_batches, embeddings, model, autocast)
    return _summary(losses, samples, first_samples, train_seconds, auc)


def _summary(
    losses: list[float], samples: int, first_samples: int, train_seconds: float, auc: float
) -> dict[str, Any]:
    """:func:`train_single_process`'s answer: samples/s over the timed steps, the AUC, the
    losses and the counts of steps and samples, all and timed."""
    timed_samples = samples - first_samples
    return {
        "samples_per_s": timed_samples / train_seconds if train_seconds > 0 else float("nan"),
        "auc": auc,
        "losses": losses,
        "steps": len(losses),
        "samples": samples,
        "timed_steps": max(len(losses) - 1, 0),
        "timed_samples": timed_samples,
        "train_seconds": train_seconds,
    }


def _build_training(
    seed: int,
    slot_sizes: Sequence[int],
    dim: int,
    model_factory: Callable[[], nn.Module],
    embedding_factory: Callable[[], nn.Module] | None,
    emb_initialization: tuple[float, float],
    embedding_lr: float,
    initial_accumulator_value: float,
    dense_lr: float,
    fused_adam: bool,
    autocast_dtype: torch.dtype | None,
) -> tuple[
    nn.Module, nn.Module, torch.optim.Optimizer | None, torch.optim.Optimizer, nn.Module, Any
]:
    """The embeddings, the dense model (in training mode), their optimizers, the loss and the
    forward's autocast context, built in this order after torch is seeded with ``seed`` (so
    the initial weights are the same on every run); the embedding optimizer is None for an
    embedding module with a ``fused_optimizer`` of its own."""
    torch.manual_seed(seed)
    if embedding_factory is None:
        embeddings: nn.Module = FlatEmbeddings(slot_sizes, dim, emb_initialization)
    else:
        embeddings = embedding_factory()
    model = model_factory()
    model.train()
    emb_opt = (
        None
        if getattr(embeddings, "fused_optimizer", False)
        else torch.optim.Adagrad(
            embeddings.parameters(),
            lr=embedding_lr,
            initial_accumulator_value=initial_accumulator_value,
        )
    )
    dense_opt = torch.optim.Adam(model.parameters(), lr=dense_lr, fused=fused_adam or None)
    loss_fn = nn.BCEWithLogitsLoss()
    autocast = (
        torch.autocast("cpu", dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    return embeddings, model, emb_opt, dense_opt, loss_fn, autocast


def _train_pass(
    iterable: Iterable[Batch],
    embeddings: nn.Module,
    model: nn.Module,
    emb_opt: torch.optim.Optimizer | None,
    dense_opt: torch.optim.Optimizer,
    loss_fn: nn.Module,
    autocast: Any,
    max_steps: int | None,
    clock: Any,
) -> tuple[list[float], int, int, float]:
    """The training loop: one pass over ``iterable`` (at most ``max_steps`` batches); the
    losses, the samples, the samples of the untimed first step and the timed seconds (from
    the end of the first step to the end of the last)."""
    begin = clock.start if clock is not None else lambda: None
    lap = clock.lap if clock is not None else lambda phase: None
    losses: list[float] = []
    samples = 0
    start, first_samples = None, 0
    # Opting out explicitly: torch otherwise warns on every sparse Adagrad step.
    with torch.sparse.check_sparse_tensor_invariants(enable=False):
        for step, (cat_ids, dense, label) in enumerate(iterable):
            if max_steps is not None and step >= max_steps:
                break
            begin()
            emb = embeddings(embeddings.rows(cat_ids))
            lap("embedding")
            with autocast:
                logits = model([torch.from_numpy(dense)], [emb])
            loss = loss_fn(logits.float(), torch.from_numpy(label))
            lap("forward")
            if emb_opt is not None:
                emb_opt.zero_grad(set_to_none=True)
            dense_opt.zero_grad(set_to_none=True)
            loss.backward()
            lap("autograd")
            if emb_opt is not None:
                emb_opt.step()
            lap("embedding_step")
            dense_opt.step()
            lap("dense_step")
            losses.append(float(loss.detach()))
            samples += len(label)
            if start is None:  # the first step is not timed
                start, first_samples = time.perf_counter(), samples
                if clock is not None:  # its phases count the timed steps only
                    clock.clear()
    train_seconds = time.perf_counter() - start if start is not None else 0.0
    return losses, samples, first_samples, train_seconds


def _evaluate(
    test_batches: Iterable[Batch], embeddings: nn.Module, model: nn.Module, autocast: Any
) -> float:
    """The test AUC of the trained model over ``test_batches`` (NaN when there are none)."""
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for cat_ids, dense, label in test_batches:
            emb = embeddings(embeddings.rows(cat_ids))
            with autocast:
                logits = model([torch.from_numpy(dense)], [emb])
            scores.append(logits.float().numpy().reshape(-1))
            labels.append(np.asarray(label).reshape(-1))
    return roc_auc(np.concatenate(labels), np.concatenate(scores)) if scores else float("nan")
