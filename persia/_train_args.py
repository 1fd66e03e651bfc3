"""``TrainCtx``'s arguments: each checked with its name and what it needs, and PERSIA's
arguments that Pyrsia accepts without effect (a warning when one is not PERSIA's default);
also the arguments of its methods ``backward`` (the loss) and ``log_scalar``."""

from __future__ import annotations

import logging

import torch

from persia.distributed import DistributedBaseOption
from persia.embedding.optim import Optimizer
from pyrsia.shared.errors import InvalidInputError, InvalidTypeError
from pyrsia.shared.validate import positive_int

_logger = logging.getLogger("persia.ctx")

_GRAD_UPDATE_BUFFER_SIZE = 60
"""PERSIA's default ``grad_update_buffer_size``; another positive value is accepted with a warning."""

EMBEDDING_GRAD_REDUCTIONS = ("sum", "mean")
"""Accepted ``TrainCtx(embedding_grad_reduction=...)`` values (see TrainCtx)."""


def check_args(
    embedding_optimizer,
    dense_optimizer,
    model,
    grad_scalar_update_factor,
    embedding_grad_reduction,
    distributed_option,
    lookup_emb_directly,
) -> None:
    """TrainCtx's arguments, each refused with the name of the argument and what it needs."""
    if not isinstance(embedding_optimizer, Optimizer):
        raise InvalidTypeError(
            "embedding_optimizer",
            "persia.embedding.optim.SGD/Adam/Adagrad",
            message="TrainCtx needs embedding_optimizer=persia.embedding.optim.SGD/Adam/Adagrad(...), "
            f"got {type(embedding_optimizer).__name__}",
        )
    if not isinstance(dense_optimizer, torch.optim.Optimizer):
        raise InvalidTypeError(
            "dense_optimizer",
            "a torch.optim.Optimizer",
            message="TrainCtx needs dense_optimizer=torch.optim.<Optimizer>(model.parameters(), ...), "
            f"got {type(dense_optimizer).__name__}",
        )
    if model is None:
        raise InvalidTypeError(
            "model",
            "a torch.nn.Module",
            message="TrainCtx needs model=<the torch.nn.Module to train>",
        )
    if (
        isinstance(grad_scalar_update_factor, bool)
        or not isinstance(grad_scalar_update_factor, (int, float))
        or not grad_scalar_update_factor > 0
    ):
        raise InvalidInputError(
            "grad_scalar_update_factor", "a number > 0", grad_scalar_update_factor
        )
    if embedding_grad_reduction not in EMBEDDING_GRAD_REDUCTIONS:
        raise InvalidInputError(
            "embedding_grad_reduction",
            " or ".join(map(repr, EMBEDDING_GRAD_REDUCTIONS)),
            embedding_grad_reduction,
        )
    if distributed_option is not None and not isinstance(distributed_option, DistributedBaseOption):
        raise InvalidTypeError(
            "distributed_option",
            "DDPOption or BaguaDistributedOption",
            message="distributed_option: expected DDPOption or BaguaDistributedOption",
        )
    if not isinstance(lookup_emb_directly, bool):
        raise InvalidInputError("lookup_emb_directly", "True or False", lookup_emb_directly)


def warn_no_effect(grad_update_buffer_size: int, lookup_emb_directly: bool) -> None:
    """PERSIA's arguments Pyrsia accepts without effect: a warning when not PERSIA's default."""
    if positive_int(grad_update_buffer_size, "grad_update_buffer_size") != _GRAD_UPDATE_BUFFER_SIZE:
        _logger.warning(
            "grad_update_buffer_size=%d accepted as PERSIA did, with no effect: gradients are "
            "copied before they are sent (batches in flight: backward_buffer_size)",
            grad_update_buffer_size,
        )
    if not lookup_emb_directly:
        _logger.warning(
            "lookup_emb_directly=False accepted as PERSIA did; direct lookups "
            "(get_embedding_from_data, an IterableDataset) still work in Pyrsia"
        )


def check_loss(loss: object) -> None:
    """``TrainCtx.backward``'s loss: a scalar tensor that requires grad."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise InvalidInputError(
            "loss", "a scalar tensor that requires grad (the model's loss)", loss
        )


def check_scalar(tag: object, value: object) -> None:
    """``TrainCtx.log_scalar``'s tag (a non-empty string) and value (a number or a
    one-element tensor, read later on the writer's thread)."""
    if not isinstance(tag, str) or not tag:
        raise InvalidInputError("tag", "a non-empty string such as 'eval/auc'", tag)
    scalar = isinstance(value, torch.Tensor) and value.numel() == 1
    if not scalar and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise InvalidInputError("value", "a number or a one-element tensor", value)
