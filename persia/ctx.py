"""Training, evaluation and inference contexts (PERSIA's ``persia.ctx`` API).

::

    BaseCtx                     device placement; current-context tracking (contextvars)
    ├── DataCtx                 data loaders: send PersiaBatches (persia._data_ctx)
    └── EmbeddingCtx            embedding lookups, tensors, checkpoints (EVAL / INFERENCE)
        ├── TrainCtx            + embedding optimizer, backward, dense optimizer, DDP
        └── InferCtx            fixed embedding-worker addresses, no registry

No context does network work in ``__init__``: it connects on ``__enter__`` and
releases everything on ``__exit__``. As in PERSIA, the query methods also work outside
``with`` (before it or after it ends): the context then connects on first use and keeps
the connection until ``close()``. ``cnt_ctx()`` is the innermost entered context.
Unlike PERSIA, ``eval_ctx()`` nested in ``TrainCtx`` leaves the embedding
hyperparameters alone (it configures the servers only when given a config).

This module is the facade: the classes live in ``persia._base_ctx``,
``persia._embedding_ctx``, ``persia._train_ctx`` (over the NN worker's
:class:`~pyrsia.services.nn_worker.step.TrainingStep`), ``persia._infer_ctx`` and
``persia._data_ctx`` (over :mod:`pyrsia.services.data_loader.sender`).
"""

from __future__ import annotations

from typing import Any

from persia._base_ctx import BaseCtx, PreprocessMode, cnt_ctx, current_ctx
from persia._embedding_ctx import (
    EmbeddingCtx,
    _prepare_feature,  # noqa: F401  (PERSIA's persia.ctx._prepare_feature)
    eval_ctx,
)
from persia._infer_ctx import InferCtx
from persia._train_ctx import TrainCtx
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch

__all__ = [
    "BaseCtx",
    "DataCtx",  # noqa: F822  (resolved lazily by __getattr__: the data loader's module)
    "EmbeddingCtx",
    "InferCtx",
    "PersiaTrainingBatch",
    "PreprocessMode",
    "TrainCtx",
    "cnt_ctx",
    "current_ctx",
    "eval_ctx",
]


def __getattr__(name: str) -> Any:
    # DataCtx belongs to the data-loader runtime; imported on first use.
    if name == "DataCtx":
        from persia._data_ctx import DataCtx

        return DataCtx
    raise AttributeError(f"module 'persia.ctx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
