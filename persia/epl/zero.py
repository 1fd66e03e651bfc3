"""``zero.level = "v1"``: the dense optimizer's state sharded across the NN-worker ranks.

Built on ``torch.distributed.optim.ZeroRedundancyOptimizer``: each rank keeps the state
(Adam's moments...) of about 1/world_size of the parameters, steps them, and broadcasts
the updated parameters. EPL's restrictions are errors here too: ZeRO is for data
parallelism only (no ``pipeline.num_stages > 1``) and not with gradient accumulation
(``pipeline.num_micro_batch > 1``); nor with ``optimizer.num_apply_group > 1``.

The user's optimizer stays the one that sets the hyperparameters: the sharded
optimizer's ``param_groups`` are the very dicts of the user's optimizer (not copies),
so an LR scheduler attached to the user's optimizer (``LambdaLR(user_opt, ...)``), or
to ``ctx.dense_optimizer``, changes the lr (and any other group hyperparameter) that
the next step applies, on every rank; ZeRO copies them into its shard's optimizer at
each step (``ZeroRedundancyOptimizer.step`` syncs ``param_groups``). Loading a state
dict keeps that link (the loaded hyperparameters are written into the user's groups).
State the user's optimizer already has (a checkpoint loaded before the TrainCtx was
entered) is handed to ZeRO, each rank keeping its shard, instead of being dropped.
Only the user's optimizer's ``step`` is never called: torch's scheduler then warns once
"lr_scheduler.step() before optimizer.step()", which is harmless here.

Checkpoints: ``TrainCtx.dump_checkpoint`` (called on every rank) gathers the shards on
rank 0 (``consolidate_state_dict``) before rank 0 writes the whole optimizer state;
``load_checkpoint`` gives each rank the whole state and ZeRO keeps its shard.
"""

from __future__ import annotations

import logging
import warnings

import torch

from persia.epl.config import Config
from pyrsia.shared.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)


def check_zero_restrictions(config: Config) -> None:
    """EPL's rules for ZeRO, as errors that say which keys conflict."""
    if config.zero.level != "v1":
        return
    if config.pipeline.num_micro_batch > 1:
        raise ConfigError(
            'zero.level "v1" cannot be used with gradient accumulation: set '
            f'"pipeline.num_micro_batch" to 1 (got {config.pipeline.num_micro_batch}), as in EPL'
        )
    if (config.pipeline.num_stages or 1) > 1:
        raise ConfigError(
            'zero.level "v1" works only for data parallelism: "pipeline.num_stages" must be 1 or None '
            f"(got {config.pipeline.num_stages}), as in EPL"
        )
    if config.optimizer.num_apply_group > 1:
        raise ConfigError('zero.level "v1" cannot be combined with "optimizer.num_apply_group" > 1')


def _zero_class() -> type:
    with warnings.catch_warnings():
        # torch.distributed.optim's own modules use torch.jit.script, deprecated in torch 2.13
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer


def _user_linked_zero(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    zero_class = _zero_class()

    class UserLinkedZero(zero_class):  # type: ignore[misc, valid-type]
        """ZeRO whose ``param_groups`` are the user's optimizer's dicts, also after a load."""

        def __init__(self, user: torch.optim.Optimizer):
            # the user's group dicts themselves: torch's Optimizer keeps the dicts it is given
            super().__init__(user.param_groups, optimizer_class=type(user), **user.defaults)
            self.user_optimizer = user

        def load_state_dict(self, state_dict) -> None:
            """Load, then write the loaded hyperparameters into the user's groups and relink."""
            super().load_state_dict(state_dict)
            user_groups = self.user_optimizer.param_groups
            if len(user_groups) != len(self.param_groups):
                raise InvalidInputError(
                    "state_dict",
                    f"the state of an optimizer with {len(user_groups)} param groups "
                    "(the dense optimizer's)",
                    f"{len(self.param_groups)} param groups",
                )
            for loaded, user in zip(self.param_groups, user_groups, strict=True):
                user.update({k: v for k, v in loaded.items() if k != "params"})
            self.param_groups = user_groups

    return UserLinkedZero(optimizer)


def shard_optimizer(optimizer: torch.optim.Optimizer, world_size: int) -> torch.optim.Optimizer:
    """A ZeroRedundancyOptimizer with ``optimizer``'s class and its live param groups.

    The returned optimizer's ``param_groups`` are ``optimizer.param_groups`` (the same
    dicts), so a scheduler on ``optimizer`` sets the lr every rank steps with.
    """
    if world_size <= 1:
        log.info('zero.level "v1" with one NN-worker rank: nothing to shard, plain optimizer kept')
        return optimizer
    sharded = _user_linked_zero(optimizer)
    if (
        optimizer.state
    ):  # e.g. restored from a checkpoint before TrainCtx: each rank keeps its shard
        sharded.load_state_dict(optimizer.state_dict())
        log.info("zero.level v1: the dense optimizer's existing state was sharded, not dropped")
    log.info(
        "zero.level v1: %s state sharded over %d ranks (this rank steps %d of %d parameters)",
        type(optimizer).__name__,
        world_size,
        sum(len(g["params"]) for g in sharded.optim.param_groups),
        sum(len(g["params"]) for g in optimizer.param_groups),
    )
    return sharded
