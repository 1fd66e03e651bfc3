"""The EPL plan of one ``TrainCtx``: every config key turned into a change of its parts.

``persia.epl`` registers :func:`install_plan` as the ``TrainCtx(epl_config=...)``
extension (:mod:`persia._train_parts`): ``TrainCtx.__init__`` hands it its parts once
and trains with the parts it returns. The plan changes the user's modules in place
(``sparse_as_dense``, offload, gradient checkpoint) and returns, in place of the
context's own:

- ``model``: an :class:`EplModel` for micro-batching / the gradient check;
- ``precision`` (and so ``ctx.grad_scaler``): ``amp.*`` and the step's gradient clipping
  (the precision the context builds its :class:`TrainingStep
  <pyrsia.services.nn_worker.step.TrainingStep>` with);
- ``dense_optimizer``: ``optimizer.num_apply_group``;
- ``distributed_option``: an :class:`EplDistributedOption` that builds DDP with the
  ``communication.*`` settings and shards the optimizer for ``zero.level`` once the
  process group exists (WORLD_SIZE > 1).

Refused at once (``ConfigError``), before the user's model is touched: ZeRO's conflicts
(:func:`persia.epl.zero.check_zero_restrictions`) and ``pipeline.num_stages`` > 1
(:func:`check_no_stages`). Set but not read by a TrainCtx, and warned about with what
reads them: ``io.*`` (data loaders), ``pipeline.strategy`` and ``auto.auto_parallel``
(:class:`persia.epl.pipeline.PipelineRunner`); and keys whose switch is off
(:data:`NEEDS_SWITCH`: ``amp.loss_scale`` without ``amp.level``, ``end_taskgraph``
without ``gradient_checkpoint.type``, ``fp16_scale`` without ``communication.fp16``).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn

from persia import env
from persia._train_parts import TrainParts
from persia.distributed import DDPOption, DistributedBaseOption, get_default_distributed_option
from persia.epl import communication, offload, recompute, zero
from persia.epl.amp import EplPrecision
from persia.epl.config import KEYS, Config
from persia.epl.microbatch import EplModel
from persia.epl.optimizer import GroupedApplyOptimizer
from persia.epl.state import current_clip_norm, current_config, note_io_reported
from pyrsia.shared.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)


_IO_READER = (
    "io.* are read in data_loader.py by persia.epl.slice_files / persia.epl.FileListDataset "
    "(each data loader's share of the files)"
)
_PIPELINE_READER = (
    "pipeline.strategy and auto.auto_parallel are read by persia.epl.pipeline.PipelineRunner "
    "(stages on ranks, in a custom loop)"
)
NOT_READ_BY_TRAINCTX = {
    "io.slicing": _IO_READER,
    "io.unbalanced_io_slicing": _IO_READER,
    "io.drop_last_files": _IO_READER,
    "pipeline.strategy": _PIPELINE_READER,
    "auto.auto_parallel": _PIPELINE_READER,
}
"""Keys a TrainCtx does not read, and what does: set in its config, they are warned about."""

NEEDS_SWITCH = {
    "amp.loss_scale": ("amp.level", '"O1"'),
    "gradient_checkpoint.end_taskgraph": ("gradient_checkpoint.type", '"auto" or "collection"'),
    "communication.fp16_scale": ("communication.fp16", "True"),
}
"""Keys that act only when another key is on: set with that key off, they are warned about."""


def check_no_stages(config: Config) -> None:
    """``pipeline.num_stages`` > 1 cannot be honoured by a TrainCtx: a clear error.

    EPL places each stage on its own device and streams micro-batches through them;
    a TrainCtx rank holds the whole dense model and gets its own batches from the data
    loaders (data parallelism), so it has no stages to place, on one rank or several.
    """
    stages = config.pipeline.num_stages or 1
    if stages > 1:
        source = (
            " (from EPL_PIPELINE_NUM_STAGES)" if "pipeline.num_stages" in config.from_env else ""
        )
        raise ConfigError(
            f"pipeline.num_stages={stages}{source}: TrainCtx trains the whole dense model on each "
            "NN-worker rank (every rank gets its own batches from the data loaders), so it "
            'cannot split it into stages. Drop "pipeline.num_stages" (or set it to 1); for '
            'micro-batches use "pipeline.num_micro_batch"; to run stages on ranks, use '
            "persia.epl.pipeline.PipelineRunner in a custom training loop (one rank per stage)"
        )


def warn_unread_keys(config: Config) -> None:
    """Warn about the keys set in ``config`` that a TrainCtx does not read
    (:data:`NOT_READ_BY_TRAINCTX`) or that need a switch left off (:data:`NEEDS_SWITCH`)."""
    unread = sorted(k for k in config.non_default() if k in NOT_READ_BY_TRAINCTX)
    if unread:
        log.warning(
            "%s: not read by TrainCtx (the NN worker); %s",
            ", ".join(unread),
            "; ".join(dict.fromkeys(NOT_READ_BY_TRAINCTX[k] for k in unread)),
        )
        if any(k.startswith("io.") for k in unread):
            note_io_reported()
    for key, (switch, on) in NEEDS_SWITCH.items():
        if config.get(key) != KEYS[key].default and config.get(switch) == KEYS[switch].default:
            log.warning(
                "%s=%r has no effect: it applies only when %s is %s (set %s, or drop %s)",
                key,
                config.get(key),
                switch,
                on,
                switch,
                key,
            )


class EplPlan:
    """What EPL changed in one TrainCtx (kept on ``ctx.epl_plan`` for inspection)."""

    def __init__(self, config: Config, model: nn.Module, device_id: int | None):
        self.config = config
        self.user_model = model
        self.device_id = device_id
        self.checkpointed: list[nn.Module] = []
        self.offloaded = False
        self.gradient_check: recompute.GradientCheck | None = None
        self.reduce_state: communication.ReduceState | None = None
        self.world_size = 1

    # --- local changes (TrainCtx.__init__) ------------------------------------------------
    def install(self, parts: TrainParts) -> TrainParts:
        """Change the user's modules in place; the parts the context trains with instead."""
        config = self.config
        zero.check_zero_restrictions(config)
        check_no_stages(config)  # before any change to the user's model
        if config.communication.sparse_as_dense:
            communication.densify_sparse_layers(self.user_model)
        self.offloaded = offload.apply_offload(self.user_model, config, self.device_id)
        self.checkpointed = recompute.apply_gradient_checkpoint(self.user_model, config)
        if config.gradient_checkpoint.check_gradients:
            if not self.checkpointed:
                log.warning(
                    "gradient_checkpoint.check_gradients: no block is checkpointed, nothing to check"
                )
            else:
                self.gradient_check = recompute.GradientCheck(self.user_model)
        micro = config.pipeline.num_micro_batch
        warn_unread_keys(config)
        model = parts.model
        if micro > 1 or self.gradient_check is not None:
            model = EplModel(self.user_model, micro, self.gradient_check)
        precision = EplPrecision(
            config, self.device_id, parts.precision, self._clip, self._clip_active
        )
        if config.communication.clip_after_allreduce and current_clip_norm() is None:
            log.warning(
                "communication.clip_after_allreduce has no effect until a norm is registered "
                "with persia.epl.clip_by_global_norm(max_norm) (it then applies from the next step)"
            )
        optimizer = parts.dense_optimizer
        if config.optimizer.num_apply_group > 1:
            optimizer = GroupedApplyOptimizer(optimizer, config.optimizer.num_apply_group)
        base = parts.distributed_option or get_default_distributed_option(self.device_id)
        if not isinstance(base, DDPOption):
            raise ConfigError(
                f"EPL options need DDPOption as the distributed option, got {type(base).__name__}"
            )
        option = EplDistributedOption(base, self)
        reduce_keys = sorted(
            k
            for k in config.non_default()
            if k.startswith("communication.")
            and k not in ("communication.sparse_as_dense", "communication.clip_after_allreduce")
        )
        if reduce_keys and (env.get_world_size() or 1) == 1:
            log.info(
                "%s: one NN-worker rank, no all-reduce to configure (no effect)",
                ", ".join(reduce_keys),
            )
        log.info("EPL plan installed: %r", config)
        return replace(
            parts,
            model=model,
            dense_optimizer=optimizer,
            precision=precision,
            distributed_option=option,
        )

    def _clip_active(self) -> bool:
        """Whether this step's gradients need :meth:`_clip` (a norm, or a reduction owed)."""
        state = self.reduce_state
        return current_clip_norm() is not None or (state is not None and state.deferred)

    def _clip(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip to the norm registered now (read at every step, so a later call applies)."""
        norm = current_clip_norm()
        params = [p for g in optimizer.param_groups for p in g["params"]]
        state = self.reduce_state
        if norm is not None:
            communication.clip_by_norm(params, norm)  # local gradients first when deferred
        if state is not None and state.deferred:
            state.reduce_now(params)

    # --- data parallel (TrainCtx._enter, WORLD_SIZE > 1) ----------------------------------
    def distribute(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        world_size: int,
        device_id: int | None,
        find_unused_parameters: bool,
    ) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """DDP with the communication settings; ZeRO for the optimizer."""
        config = self.config
        self.world_size = world_size
        inner = model.runner if isinstance(model, EplModel) else model
        after = config.communication.clip_after_allreduce
        self.reduce_state = communication.ReduceState.from_config(
            config, world_size, lambda: not after and current_clip_norm() is not None
        )
        device_ids = None if (device_id is None or self.offloaded) else [device_id]
        parallel = torch.nn.parallel.DistributedDataParallel(
            inner,
            device_ids=device_ids,
            output_device=None if device_ids is None else device_id,
            find_unused_parameters=find_unused_parameters,
            bucket_cap_mb=communication.bucket_cap_mb(inner, config.communication.max_splits),
        )
        parallel.register_comm_hook(self.reduce_state, communication.reduce_hook)
        if isinstance(model, EplModel):
            model.run_with(parallel)
        else:
            model = parallel
        if optimizer is not None and config.zero.level == "v1":
            if isinstance(optimizer, GroupedApplyOptimizer):
                optimizer = optimizer.optimizer
            optimizer = zero.shard_optimizer(optimizer, world_size)
        return model, optimizer


class EplDistributedOption(DistributedBaseOption):
    """The user's ``DDPOption`` (rendezvous, backend) with EPL's DDP settings."""

    def __init__(self, base: DDPOption, plan: EplPlan):
        super().__init__(base.master_port, base.master_addr)
        self.base, self.plan = base, plan

    def init_with_env_file(self) -> bool:
        return self.base.init_with_env_file()

    def needs_master_addr(self) -> bool:
        return self.base.needs_master_addr()

    def convert2distributed_model(
        self, model, world_size, rank_id, device_id=None, master_addr=None, optimizer=None
    ):
        if self.plan.offloaded and self.base.backend == "nccl":
            raise ConfigError(
                'offload.level "v0" keeps gradients in CPU memory: use DDPOption(backend="gloo")'
            )
        self.base.init_process_group(world_size, rank_id, device_id, master_addr)
        return self.plan.distribute(
            model, optimizer, world_size, device_id, self.base.find_unused_parameters
        )


def install_plan(parts: TrainParts, epl_config: Config | None) -> tuple[EplPlan | None, TrainParts]:
    """The EPL plan of a TrainCtx (``epl_config=`` or ``epl.init``'s; None when neither
    asks for anything) and the parts it trains with (:mod:`persia._train_parts`)."""
    if epl_config is not None and not isinstance(epl_config, Config):
        raise InvalidInputError("epl_config", "a persia.epl.Config (or None)", epl_config)
    config = epl_config or current_config()
    if config is None and current_clip_norm() is not None:
        config = Config(environ={})  # clipping alone: EPL's defaults for everything else
        log.info("persia.epl.clip_by_global_norm without an EPL config: EPL defaults + clipping")
    if config is None:
        return None, parts
    if epl_config is not None:
        from persia.epl.cluster import apply_cluster_config

        apply_cluster_config(config)
    plan = EplPlan(config, parts.model, parts.device_id)
    return plan, plan.install(parts)


__all__ = ["EplPlan", "install_plan", "KEYS"]
