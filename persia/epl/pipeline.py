"""``pipeline.num_stages`` / ``pipeline.strategy`` / ``auto.auto_parallel``: pipeline stages on ranks.

The dense model is cut into ``num_stages`` stages, one per rank of ``group``, and
trained with ``torch.distributed.pipelining``: each batch is split into
``pipeline.num_micro_batch`` micro-batches scheduled by

- ``PreferBackward``: ``Schedule1F1B`` (one forward, one backward; PipeDream-like);
- ``PreferForward``: ``ScheduleGPipe`` (all forwards, then all backwards).

Stages come from the user (a list of modules, EPL's ``replicate(name="stage_k")``) or,
with ``auto.auto_parallel``, from :func:`partition` of an ``nn.Sequential``: contiguous
layers balanced by parameter count, or by measured forward time when a sample input is
given.

Inside ``TrainCtx`` every NN-worker rank receives its own batches from the data loaders
(data parallelism), so pipelining across ranks is offered here for custom loops: see
:class:`PipelineRunner`. A ``TrainCtx`` whose config sets ``pipeline.num_stages`` > 1
refuses at construction, on one rank as on several (EPL puts each stage on its own
device; a TrainCtx rank holds the whole model), with an error that names the key and
these two ways out: ``pipeline.num_micro_batch`` alone, or this runner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from persia.epl.config import Config
from pyrsia.shared.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)


def _balanced_cut(costs: Sequence[float], num_stages: int) -> list[int]:
    """Stage start indices of a contiguous split of ``costs`` minimising the largest stage."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: the smallest max stage cost of the first i layers in k stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    starts, i = [], n
    for k in range(num_stages, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def partition(
    model: nn.Sequential, num_stages: int, sample_input: torch.Tensor | None = None
) -> list[nn.Sequential]:
    """Cut ``model`` into ``num_stages`` contiguous stages (by parameters, or time with an input)."""
    if not isinstance(model, nn.Sequential):
        raise InvalidInputError(
            "model", "an nn.Sequential to partition into stages", type(model).__name__
        )
    layers = list(model)
    if not 1 <= num_stages <= len(layers):
        raise ConfigError(
            f"pipeline.num_stages={num_stages}: the model has {len(layers)} layers to split"
        )
    if sample_input is None:
        costs = [float(sum(p.numel() for p in layer.parameters())) or 1.0 for layer in layers]
        by = "parameter count"
    else:
        costs, x = [], sample_input
        with torch.no_grad():
            for layer in layers:
                layer(x)  # warm up
                started = time.perf_counter()
                for _ in range(3):
                    y = layer(x)
                costs.append(time.perf_counter() - started)
                x = y
        by = "measured forward time"
    starts = _balanced_cut(costs, num_stages) + [len(layers)]
    stages = [nn.Sequential(*layers[a:b]) for a, b in zip(starts, starts[1:], strict=False)]
    log.info(
        "auto.auto_parallel: %d layers in %d stages by %s: %s",
        len(layers),
        num_stages,
        by,
        [b - a for a, b in zip(starts, starts[1:], strict=False)],
    )
    return stages


class PipelineRunner:
    """This rank's stage and the schedule of ``config`` (``step`` = one batch, one backward).

    Arguments:
        model: the list of stage modules (one per rank), or an ``nn.Sequential`` cut by
            :func:`partition` when ``auto.auto_parallel`` is set.
        loss_fn: ``loss_fn(output, target)`` of a micro-batch (used on the last stage).
        config: ``pipeline.num_stages`` (default: the group's size), ``num_micro_batch``,
            ``strategy``, ``auto.auto_parallel``.
        sample_input: for ``auto.auto_parallel``, balance stages by measured time.
        group: the ranks that form the pipeline (default: every rank).
    """

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        loss_fn: Callable,
        config: Config,
        device: torch.device | str = "cpu",
        sample_input: torch.Tensor | None = None,
        group: dist.ProcessGroup | None = None,
    ):
        if not dist.is_initialized():
            raise ConfigError(
                "pipeline stages need torch.distributed initialized (one rank per stage)"
            )
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        size, rank = dist.get_world_size(group), dist.get_rank(group)
        num_stages = config.pipeline.num_stages or size
        if num_stages != size:
            raise ConfigError(
                f"pipeline.num_stages={num_stages} needs a group of {num_stages} ranks, got {size}"
            )
        if isinstance(model, nn.Sequential) and config.auto.auto_parallel:
            stages = partition(model, num_stages, sample_input)
        elif isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model):
            stages = list(model)
        else:
            raise ConfigError(
                "pipeline: pass the stages as a list of modules, or an nn.Sequential with "
                '"auto.auto_parallel": True to partition it automatically'
            )
        if len(stages) != num_stages:
            raise ConfigError(
                f"pipeline.num_stages={num_stages} but {len(stages)} stage modules were given"
            )
        self.rank, self.num_stages = rank, num_stages
        self.module = stages[rank].to(device)
        self.stage = PipelineStage(self.module, rank, num_stages, torch.device(device), group=group)
        schedule = Schedule1F1B if config.pipeline.strategy == "PreferBackward" else ScheduleGPipe
        self.schedule = schedule(self.stage, config.pipeline.num_micro_batch, loss_fn=loss_fn)
        log.info(
            "pipeline: rank %d runs stage %d/%d under %s, %d micro-batches",
            rank,
            rank,
            num_stages,
            schedule.__name__,
            config.pipeline.num_micro_batch,
        )

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.num_stages - 1

    def step(
        self, inputs: torch.Tensor | None = None, target: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Run one batch through the pipeline: inputs on the first stage, target on the last.

        Returns the mean micro-batch loss on the last stage, None elsewhere. The stage's
        gradients are those of the mean loss; step your optimizer on ``self.module``.
        """
        args = (inputs,) if self.is_first else ()
        if self.is_last:
            losses: list[torch.Tensor] = []
            self.schedule.step(*args, target=target, losses=losses)
            return torch.stack([loss.detach() for loss in losses]).mean()
        self.schedule.step(*args)
        return None
