"""What a ``TrainCtx`` trains with, and the slot through which a training extension changes it.

A ``TrainCtx`` gathers its parts (the dense model, the dense optimizer, the distributed
option and the step's precision) into a :class:`TrainParts`, hands them to the extension
registered for one of its keyword arguments (``epl_config=``: ``persia.epl``), and trains
with the parts the extension returns. The extension never writes into the context: it
returns new parts and the context adopts them, before its :class:`TrainingStep
<pyrsia.services.nn_worker.step.TrainingStep>` is built with the returned precision.
Per-step work plugs into that step's public hooks (``ctx.training_step.add_hook``).

An extension registers itself when its package is imported (``persia.epl`` does so in its
``__init__``), so ``TrainCtx`` never imports it: without the import no EPL option can
have been given, and the context trains with its own parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from persia.distributed import DistributedBaseOption
from pyrsia.services.nn_worker.precision import Precision
from pyrsia.services.nn_worker.step import TrainingStep
from pyrsia.shared.errors import InvalidInputError


@dataclass(frozen=True)
class TrainParts:
    """The parts of one ``TrainCtx`` an extension may replace (``dataclasses.replace``).

    ``device_id`` is the context's device (read only: an extension does not move it).
    """

    model: nn.Module
    dense_optimizer: torch.optim.Optimizer
    distributed_option: DistributedBaseOption | None
    precision: Precision
    device_id: int | None


TrainExtension = Callable[[TrainParts, Any], "tuple[Any, TrainParts]"]
"""``extension(parts, options) -> (plan, parts)``: ``plan`` is what the extension did (kept
by the context for inspection, e.g. ``ctx.epl_plan``; None when ``options`` asked for
nothing) and ``parts`` what the context trains with."""

_extensions: dict[str, TrainExtension] = {}


def register_train_extension(keyword: str, extension: TrainExtension) -> None:
    """Make ``extension`` the one that ``TrainCtx(<keyword>=...)`` options go to."""
    if not callable(extension):
        raise InvalidInputError(
            "extension", "a callable (parts, options) -> (plan, parts)", extension
        )
    _extensions[keyword] = extension


def apply_train_extension(
    keyword: str, parts: TrainParts, options: Any, expected: str
) -> tuple[Any, TrainParts]:
    """Run the extension registered for ``keyword`` on ``parts`` with ``options``.

    With none registered (its package was never imported) there is nothing to apply:
    ``options`` must be None, else it is refused as not ``expected``.
    """
    extension = _extensions.get(keyword)
    if extension is None:
        if options is not None:
            raise InvalidInputError(keyword, expected, options)
        return None, parts
    return extension(parts, options)


def extended_step(
    parts: TrainParts, epl_config: Any, grad_scalar_update_factor: float
) -> tuple[Any, TrainParts, TrainingStep]:
    """``(plan, parts, step)``: the parts after the extension registered for ``epl_config=``
    (``persia.epl``) had its say, its plan, and the training step built on their precision."""
    plan, parts = apply_train_extension(
        "epl_config", parts, epl_config, "a persia.epl.Config (or None)"
    )
    step = TrainingStep(parts.precision, grad_scalar_update_factor=grad_scalar_update_factor)
    return plan, parts, step
